//! The SwiGLU feed-forward block: `down(silu(gate(x)) * up(x))`. Dense layers,
//! routed experts and shared experts are all this block.

use larder_tensor::ops::silu;
use larder_tensor::{Linear, Mat};

use crate::checkpoint::Checkpoint;
use crate::error::ModelError;

/// A SwiGLU MLP.
pub struct Mlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

impl Mlp {
    /// Loads `{prefix}.{gate}.weight`, `{prefix}.{up}.weight`, `{prefix}.{down}.weight`.
    pub fn load(ckpt: &Checkpoint, prefix: &str, names: [&str; 3], hidden: usize, intermediate: usize) -> Result<Self, ModelError> {
        let w = |n: &str, rows, cols| ckpt.matrix(&format!("{prefix}.{n}.weight"), rows, cols);
        Ok(Mlp {
            gate: Linear::new(w(names[0], intermediate, hidden)?, None),
            up: Linear::new(w(names[1], intermediate, hidden)?, None),
            down: Linear::new(w(names[2], hidden, intermediate)?, None),
        })
    }

    pub fn forward(&self, x: &Mat) -> Mat {
        let mut g = self.gate.forward(x);
        let u = self.up.forward(x);
        for (gv, uv) in g.as_mut_slice().iter_mut().zip(u.as_slice()) {
            *gv = silu(*gv) * uv;
        }
        self.down.forward(&g)
    }

    /// Weight bytes of the three projections.
    pub fn byte_len(&self) -> usize {
        self.gate.weight().byte_len() + self.up.weight().byte_len() + self.down.weight().byte_len()
    }
}
