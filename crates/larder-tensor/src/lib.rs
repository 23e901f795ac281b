//! larder-tensor: the numeric floor of larder.
//!
//! It owns the weight dtypes checkpoints ship in ([`dtype`]), their row
//! layouts and exact decoders ([`formats`]), weight matrices kept in those
//! dtypes ([`weight`]), f32 activation
//! matrices ([`mat`]) and the kernels that multiply one by the other
//! ([`kernels`], used through [`Linear`] and [`expert::SwigluExpert`]), and
//! the dot products attention takes over cached positions ([`vector`]). It knows nothing about models or files.
//!
//! Exactness contract: every output element is one dot product computed by one
//! function with one fixed reduction order, whatever the batch size or thread
//! count. A row's result therefore never depends on the rows beside it
//! (batch invariance, docs/design.md §3).

pub mod bench;
pub mod bytes;
pub mod dtype;
pub mod expert;
pub mod formats;
pub mod kernels;
pub mod linear;
pub mod mat;
pub mod ops;
pub mod safetensors_write;
pub mod vector;
pub mod weight;

pub use bytes::{ByteOwner, SharedBytes};
pub use dtype::WeightDType;
pub use linear::Linear;
pub use mat::Mat;
pub use weight::{WeightError, WeightFormat, WeightMatrix};

#[cfg(not(target_endian = "little"))]
compile_error!("larder reads little-endian checkpoint bytes in place and supports little-endian targets only");
