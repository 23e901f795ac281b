//! larder-store: where routed experts live when they do not fit in RAM.
//!
//! - [`location`]: the [`ExpertIndex`] mapping (layer, expert) to file
//!   extents, for a packed store ([`manifest`]) or straight from safetensors;
//! - [`io`]: the [`IoBackend`] trait and its pread-pool, io_uring (+O_DIRECT)
//!   and mmap implementations;
//! - [`cache`]: the byte-budgeted RAM expert cache (fair LRU by default);
//! - [`store`]: [`ExpertStore`], cache + backend + digests + [`StoreStats`];
//! - [`pack`] / [`verify`]: writing and checking packed stores; [`drive`]:
//!   bandwidth probes and placement over drives;
//! - [`remote`]: checkpoint sources (hub repo, hub-layout URL, folder) read
//!   by range or streamed with sha256 checks; [`pull`]: a store streamed
//!   from one; [`lazy`]: a partial store that fetches experts on first use.
//!
//! This crate knows bytes, files and drives; it does not know tensor math or
//! models (the engine maps records to expert weights). Its reads return
//! larder-tensor's [`SharedBytes`], the one byte-view type, and its spine is
//! written by larder-tensor's safetensors writer.

pub mod bench;
pub mod buf;
pub mod cache;
mod demand;
pub mod digest;
pub mod drive;
pub mod drive_load;
mod error;
pub mod fsutil;
pub mod heat;
pub mod io;
mod layer_file;
#[cfg(feature = "remote")]
pub mod lazy;
pub mod location;
mod locks;
pub mod manifest;
pub mod mirror;
pub mod pack;
mod pack_plan;
mod pending;
mod prefetch;
#[cfg(feature = "remote")]
pub mod pull;
mod queue;
pub mod record;
#[cfg(feature = "remote")]
pub mod remote;
mod shared;
pub mod size;
pub mod spine;
pub mod stats;
pub mod store;
pub mod verify;

pub use buf::{AlignedBuf, ByteOwner, SharedBytes};
pub use cache::{ExpertCache, PolicyKind};
pub use digest::Digest;
pub use error::StoreError;
pub use io::{IoBackend, IoKind, IoOptions};
pub use location::{ExpertIndex, ExpertLocation, Extent, Part, PartDesc};
pub use manifest::Manifest;
pub use size::{format_size, parse_size};
pub use stats::StoreStats;
pub use store::{ExpertRecord, ExpertStore, StoreOptions};
