//! Every shipped part of every routed expert, where it lies in a
//! checkpoint ([`routed_expert_parts`]: whole tensors, or slices `[e]` of
//! fused per-layer tensors for gpt-oss), learned by recording the
//! architecture's loader; direct streaming and `pack` read them.

use crate::assemble::PartKind;
use crate::checkpoint::{Checkpoint, TensorInfo};
use crate::decoder::DecoderModel;
use crate::error::ModelError;
use crate::expert::expert_layers;
use crate::source::{RecordedRole, RecordedTensor, Recorder};
use crate::spec::ModelSpec;

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
/// with [`ExpertTag`](crate::source::ExpertTag)s); where each part lies, and the checks the in-RAM
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
