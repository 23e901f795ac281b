//! Where routed experts come from. The model asks an [`ExpertProvider`] for
//! the experts of one layer step and never learns whether their bytes were in
//! RAM, in a cache or on a drive.
//!
//! Also: the names and shapes of each routed expert's tensors in a
//! checkpoint ([`expert_tensors`]), and every shipped part of one expert
//! where it lies ([`expert_parts`]: whole tensors, or slices `[e]` of fused
//! per-layer tensors for gpt-oss), which direct streaming and `pack` read.

use std::sync::Arc;

use crate::checkpoint::{Checkpoint, TensorInfo};
use crate::config::{FfnSpec, ModelSpec};
use crate::error::ModelError;
use crate::mlp::Mlp;

/// Supplies routed expert weights.
pub trait ExpertProvider: Send + Sync {
    /// Calls `run(i, expert)` once for each `ids[i]` (sorted, unique) of
    /// `layer`, in any order (a streaming provider calls it as bytes arrive,
    /// so computing one expert overlaps reading the next). Stops at the
    /// first error, from the provider or from `run`.
    fn with_experts(
        &self,
        layer: usize,
        ids: &[usize],
        run: &mut dyn FnMut(usize, &Mlp) -> Result<(), ModelError>,
    ) -> Result<(), ModelError>;

    /// A hint that `layer` will probably need `ids` soon (sorted, unique):
    /// a streaming provider may start reading them in the background. It
    /// must never change results, only when bytes arrive. Default: ignored.
    fn prefetch(&self, _layer: usize, _ids: &[usize]) {}

    /// Whether an expert's bytes are in RAM now (reading it costs no I/O).
    fn is_resident(&self, _layer: usize, _expert: usize) -> bool {
        true
    }

    /// Whether [`prefetch`](Self::prefetch) does anything (the model skips
    /// predicting otherwise).
    fn wants_prefetch(&self) -> bool {
        false
    }
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
    fn with_experts(
        &self,
        layer: usize,
        ids: &[usize],
        run: &mut dyn FnMut(usize, &Mlp) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        let experts = self
            .layers
            .get(layer)
            .ok_or_else(|| ModelError::Experts(format!("no layer {layer}")))?;
        for (i, &e) in ids.iter().enumerate() {
            let mlp = experts
                .get(e)
                .ok_or_else(|| ModelError::Experts(format!("layer {layer} has no expert {e}")))?;
            run(i, mlp)?;
        }
        Ok(())
    }
}

/// One routed expert tensor: its checkpoint name and `[rows, cols]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertTensor {
    /// `gate`, `up` or `down`.
    pub role: &'static str,
    pub name: String,
    pub shape: [usize; 2],
}

/// The routed-expert layers of a model: `(layer, number of experts)`.
pub fn expert_layers(spec: &ModelSpec) -> Vec<(usize, usize)> {
    spec.layers
        .iter()
        .enumerate()
        .filter_map(|(l, ls)| match &ls.ffn {
            FfnSpec::Moe(m) => Some((l, m.num_experts)),
            FfnSpec::Dense { .. } => None,
        })
        .collect()
}

/// The tensors of expert `expert` of MoE layer `layer` (gate, up, down), or
/// `None` for a dense layer.
pub fn expert_tensors(spec: &ModelSpec, layer: usize, expert: usize) -> Option<[ExpertTensor; 3]> {
    let FfnSpec::Moe(m) = &spec.layers.get(layer)?.ffn else {
        return None;
    };
    // Latent-space experts are `latent` wide, not `hidden_size`.
    let (h, i) = (m.expert_width(spec.hidden_size), m.expert_intermediate);
    let names = &spec.moe_names;
    let prefix = format!("model.layers.{layer}.{}.experts.{expert}", names.block);
    let t = |k: usize, role, shape| ExpertTensor {
        role,
        name: format!("{prefix}.{}.weight", names.expert_proj[k]),
        shape,
    };
    Some([t(0, "gate", [i, h]), t(1, "up", [i, h]), t(2, "down", [h, i])])
}

/// One shipped part of a routed expert: its role in a record (`gate`,
/// `gate.scale`, `gate_up.bias`, ...), the checkpoint tensor it is or is a
/// slice of, and where its bytes lie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertPart {
    pub role: String,
    /// The tensor's name (for a gpt-oss expert: the fused per-layer tensor
    /// whose slice `[e]` this part is).
    pub tensor: String,
    /// The part's own bytes (for a slice: its range, shape without the experts axis).
    pub info: TensorInfo,
}

/// Every shipped part of expert `expert` of MoE layer `layer`, in record
/// order, after the checks the in-RAM loader makes: per projection codes,
/// then scales and `weight_shape` where shipped
/// ([`Checkpoint::weight_parts`]); for gpt-oss, slice `[expert]` of each
/// fused tensor ([`crate::fused_experts::gpt_oss_layer_parts`]: six for
/// MXFP4, four unquantized).
pub fn expert_parts(spec: &ModelSpec, ckpt: &Checkpoint, layer: usize, expert: usize) -> Result<Vec<ExpertPart>, ModelError> {
    if let Some(fused) = crate::fused_experts::gpt_oss_layer_parts(spec, layer, Some(ckpt))? {
        return fused
            .parts
            .iter()
            .map(|p| {
                Ok(ExpertPart {
                    role: p.role.to_string(),
                    tensor: p.name.clone(),
                    info: ckpt.slice_info(&p.name, expert)?,
                })
            })
            .collect();
    }
    let tensors = expert_tensors(spec, layer, expert).ok_or_else(|| ModelError::Experts(format!("layer {layer}: not a MoE layer")))?;
    let mut parts = Vec::new();
    for t in &tensors {
        for part in ckpt.weight_parts(&t.name, t.shape[0], t.shape[1])? {
            parts.push(ExpertPart {
                role: part.kind.role(t.role),
                tensor: part.name,
                info: part.info,
            });
        }
    }
    Ok(parts)
}
