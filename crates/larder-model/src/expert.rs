//! Where routed experts come from. The model asks an [`ExpertProvider`] for
//! the experts of one layer step and never learns whether their bytes were in
//! RAM, in a cache or on a drive.
//!
//! Also: the names and shapes of each routed expert's tensors, as the
//! loader asks for them ([`expert_tensors`]), and every shipped part of
//! every expert where it lies ([`routed_expert_parts`]: whole tensors, or
//! slices `[e]` of fused per-layer tensors for gpt-oss), learned by
//! recording the loader; direct streaming and `pack` read them.

use std::sync::Arc;

use crate::assemble::PartKind;
use crate::checkpoint::{Checkpoint, TensorInfo};
use crate::config::{FfnSpec, ModelSpec};
use crate::decoder::DecoderModel;
use crate::error::ModelError;
use crate::mlp::Mlp;
use crate::source::{RecordedRole, RecordedTensor, Recorder};

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

/// Every shipped part of every routed expert, `[layer][expert]` (empty for
/// dense layers), each expert's in record order. Which tensors are routed
/// experts, and their roles and logical shapes, are learned by recording
/// the architecture's loader ([`Recorder`], whose requests the loader tags
/// with [`ExpertTag`]s); where each part lies, and the checks the in-RAM
/// loader makes, are the checkpoint's: per projection
/// [`Checkpoint::weight_parts`] (codes, then scales and `weight_shape`
/// where shipped); for gpt-oss, slice `[e]` of each fused tensor, checked by
/// [`crate::fused_experts::gpt_oss_layer_parts`].
pub fn routed_expert_parts(spec: &ModelSpec, ckpt: &Checkpoint) -> Result<Vec<Vec<Vec<ExpertPart>>>, ModelError> {
    ckpt.configure(spec);
    // Checked against the checkpoint's shapes as it records: what the
    // recorded load allocates is sized by the checkpoint, not config.json.
    let recorder = Recorder::for_checkpoint(ckpt)?;
    DecoderModel::load(spec.clone(), &recorder, None)?;
    let mut parts: Vec<Vec<Vec<ExpertPart>>> = vec![Vec::new(); spec.layers.len()];
    for (l, n) in expert_layers(spec) {
        parts[l] = vec![Vec::new(); n];
        // gpt-oss: the fused tensors' dtypes and shapes, checked as the in-RAM loader checks them.
        crate::fused_experts::gpt_oss_layer_parts(spec, l, Some(ckpt))?;
    }
    let bad = |t: &RecordedTensor, m: &str| ModelError::Experts(format!("tensor `{}`: {m}", t.name));
    for t in recorder.tensors() {
        let Some(tag) = t.expert else { continue };
        let layer = parts
            .get_mut(tag.layer)
            .filter(|p| !p.is_empty())
            .ok_or_else(|| bad(&t, &format!("tagged for layer {}, which has no routed experts", tag.layer)))?;
        match (tag.expert, &t.role) {
            (Some(e), RecordedRole::Linear { weight, part, rows, cols }) => {
                // Each weight once, by its codes; the checkpoint says which parts ship.
                if *part != PartKind::Codes {
                    continue;
                }
                let expert = layer
                    .get_mut(e)
                    .ok_or_else(|| bad(&t, &format!("tagged expert {e} of layer {}", tag.layer)))?;
                for p in ckpt.weight_parts(weight, *rows, *cols)? {
                    expert.push(ExpertPart {
                        role: p.kind.role(tag.role),
                        tensor: p.name,
                        info: p.info,
                    });
                }
            }
            (None, RecordedRole::FusedRaw) => {
                for (e, expert) in layer.iter_mut().enumerate() {
                    expert.push(ExpertPart {
                        role: tag.role.to_string(),
                        tensor: t.name.clone(),
                        info: ckpt.slice_info(&t.name, e)?,
                    });
                }
            }
            (_, role) => return Err(bad(&t, &format!("a routed-expert tensor recorded as {role:?}"))),
        }
    }
    for (l, layer) in parts.iter().enumerate() {
        if let Some(e) = layer.iter().position(Vec::is_empty) {
            return Err(ModelError::Experts(format!("layer {l}: the loader read no tensors for expert {e}")));
        }
    }
    Ok(parts)
}
