//! larder-tensor: the numeric floor of larder.
//!
//! It owns the weight dtypes checkpoints ship in ([`WeightDType`]), their row
//! layouts and exact decoders ([`formats`]), weight matrices kept in those
//! dtypes ([`WeightMatrix`]), f32 activation
//! matrices ([`Mat`]) and the kernels that multiply one by the other
//! ([`kernels`], used through [`Linear`] and [`SwigluExpert`]), and
//! the dot products attention takes over cached positions ([`vector`]). It knows nothing about models or files.
//!
//! Exactness contract: every output element is one dot product computed by one
//! function with one fixed reduction order, whatever the batch size or thread
//! count. A row's result therefore never depends on the rows beside it
//! (batch invariance, docs/design.md §3).

pub mod bench;
mod bytes;
mod dtype;
mod expert;
pub mod formats;
pub mod kernels;
mod linear;
mod mat;
pub mod ops;
pub mod safetensors_write;
pub mod vector;
mod weight;

// Bytes and dtypes.
pub use bytes::{ByteOwner, SharedBytes};
pub use dtype::WeightDType;
// Weight matrices.
pub use weight::{WeightError, WeightFormat, WeightMatrix};
// Activations and layers.
pub use expert::{BiasLayout, ComponentLayout, ExpertLayout, GluActivation, InterleavedLayout, SwigluExpert};
pub use linear::Linear;
pub use mat::Mat;

#[cfg(not(target_endian = "little"))]
compile_error!("larder reads little-endian checkpoint bytes in place and supports little-endian targets only");
