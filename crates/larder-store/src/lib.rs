//! larder-store: where routed experts live when they do not fit in RAM.
//!
//! - [`ExpertIndex`]: the mapping (layer, expert) to file
//!   extents, for a packed store ([`manifest`]) or straight from safetensors;
//! - [`io`]: the [`IoBackend`] trait and its pread-pool, io_uring (+O_DIRECT)
//!   and mmap implementations;
//! - [`cache`]: the byte-budgeted RAM expert cache (fair LRU by default);
//! - [`ExpertStore`]: cache + backend + digests + [`StoreStats`];
//! - [`pack`] / [`verify_store`]: writing and checking packed stores; [`drive`]:
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
mod buf;
pub mod cache;
mod demand;
mod digest;
pub mod drive;
mod drive_load;
mod error;
pub mod fsutil;
pub mod heat;
pub mod io;
mod layer_file;
#[cfg(feature = "remote")]
pub mod lazy;
mod location;
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
mod record;
#[cfg(feature = "remote")]
pub mod remote;
mod shared;
mod size;
mod spine;
mod stats;
mod store;
mod verify;

// The store: cache + backend + digests.
pub use error::StoreError;
pub use prefetch::{MAX_PREFETCH_THREADS, PREFETCH_PROBE};
pub use shared::ExpertRecord;
pub use stats::StoreStats;
pub use store::{smallest_budget, ExpertStore, StoreOptions};
// Where experts live, and the packed format.
pub use location::{ExpertIndex, ExpertLocation, Extent, Part, PartDesc};
pub use manifest::Manifest;
// Reads: backends, buffers and byte views.
pub use buf::{align_up, AlignedBuf, ByteOwner, SharedBytes, POOL_BUFFERS, POOL_BYTES};
pub use io::{IoBackend, IoKind, IoOptions};
// The RAM expert cache.
pub use cache::{ExpertCache, PolicyKind};
// Digests and checking a packed store.
pub use digest::{check_gbps, Digest};
pub use verify::{verify_store, verify_store_with, VerifyReport};
// Byte sizes as people write them.
pub use size::{format_size, parse_size};
