//! The SwiGLU feed-forward block, `down(silu(gate(x)) * up(x))`: dense
//! layers, routed experts and shared experts are all this block, which is
//! larder-tensor's [`SwigluExpert`](larder_tensor::expert::SwigluExpert) (the same code the expert store's
//! contiguous records run through).

pub use larder_tensor::expert::SwigluExpert as Mlp;

use crate::error::ModelError;
use crate::source::WeightSource;

/// Loads `{prefix}.{gate}.weight`, `{prefix}.{up}.weight`, `{prefix}.{down}.weight`.
pub fn load_mlp(weights: &dyn WeightSource, prefix: &str, names: [&str; 3], hidden: usize, intermediate: usize) -> Result<Mlp, ModelError> {
    let w = |n: &str, rows, cols| weights.matrix(&format!("{prefix}.{n}.weight"), rows, cols);
    Mlp::new(
        prefix,
        w(names[0], intermediate, hidden)?,
        w(names[1], intermediate, hidden)?,
        w(names[2], hidden, intermediate)?,
    )
    .map_err(ModelError::from)
}
