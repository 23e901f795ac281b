//! The SwiGLU feed-forward block, `down(silu(gate(x)) * up(x))`: dense
//! layers, routed experts and shared experts are all this block, which is
//! larder-tensor's [`SwigluExpert`](larder_tensor::SwigluExpert) (the same code the expert store's
//! contiguous records run through).

pub use larder_tensor::SwigluExpert as Mlp;

use crate::error::ModelError;
use crate::source::WeightView;

/// Loads `{gate}.weight`, `{up}.weight` and `{down}.weight` under `weights`'
/// module (its path names the block in errors).
pub fn load_mlp(weights: &WeightView<'_>, names: [&str; 3], hidden: usize, intermediate: usize) -> Result<Mlp, ModelError> {
    let [gate, up, down] = names.map(|n| weights.pp(n));
    Mlp::new(
        weights.path().as_str(),
        gate.matrix("weight", intermediate, hidden)?,
        up.matrix("weight", intermediate, hidden)?,
        down.matrix("weight", hidden, intermediate)?,
    )
    .map_err(ModelError::from)
}
