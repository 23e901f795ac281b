//! Where routed experts come from. The model asks an [`ExpertProvider`] for
//! the experts of one layer step and never learns whether their bytes were in
//! RAM, in a cache or on a drive.

use std::sync::Arc;

use crate::error::ModelError;
use crate::mlp::Mlp;

/// Supplies routed expert weights.
pub trait ExpertProvider: Send + Sync {
    /// The experts `ids` (sorted, unique) of `layer`, in the same order.
    fn experts(&self, layer: usize, ids: &[usize]) -> Result<Vec<Arc<Mlp>>, ModelError>;
}

/// Every expert held in memory (the all-in-RAM path, and the reference every
/// streaming provider must match bit for bit).
#[derive(Default)]
pub struct InMemoryExperts {
    /// `layers[l]` is empty for dense layers.
    layers: Vec<Vec<Arc<Mlp>>>,
}

impl InMemoryExperts {
    pub fn new(layers: Vec<Vec<Arc<Mlp>>>) -> Self {
        InMemoryExperts { layers }
    }
}

impl ExpertProvider for InMemoryExperts {
    fn experts(&self, layer: usize, ids: &[usize]) -> Result<Vec<Arc<Mlp>>, ModelError> {
        let experts = self
            .layers
            .get(layer)
            .ok_or_else(|| ModelError::Experts(format!("no layer {layer}")))?;
        ids.iter()
            .map(|&e| {
                experts
                    .get(e)
                    .cloned()
                    .ok_or_else(|| ModelError::Experts(format!("layer {layer} has no expert {e}")))
            })
            .collect()
    }
}
