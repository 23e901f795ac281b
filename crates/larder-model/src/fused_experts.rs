//! Routed experts shipped as slices of per-layer fused tensors (gpt-oss,
//! [`ExpertKind::GptOss`]): which tensors a layer's experts ship in, checked
//! against `quantization_config` ([`gpt_oss_layer_parts`], used by the
//! in-RAM loader, direct streaming and pack), and loading every expert of a
//! layer into RAM ([`load_gpt_oss_layer`]). Tensor names, shapes, dtypes
//! and the assembly of an expert from its slices are
//! [`crate::assemble`]'s (`gpt_oss_fused_parts`, `gpt_oss_expert`).
//!
//! transformers 5.24.0 holds, per MoE layer, either MXFP4 blocks and scales
//! (`Mxfp4GptOssExperts`: `gate_up_proj_blocks` `[E, 2I, H/32, 16]`,
//! output-major) or unquantized `gate_up_proj` `[E, H, 2I]` / `down_proj`
//! `[E, I, H]` (`GptOssExperts`, input-major: `x @ W[e]`), with biases
//! `[E, 2I]` / `[E, H]`; gate_up's output units interleave (row `2i` gate
//! unit `i`, `2i + 1` up unit `i`).

use std::sync::Arc;

use larder_tensor::expert::GluActivation;

use crate::assemble::{check_fused_part, gpt_oss_expert, gpt_oss_fused_parts, FusedPart};
use crate::checkpoint::Checkpoint;
use crate::config::{ExpertKind, FfnSpec, ModelSpec};
use crate::error::ModelError;
use crate::mlp::Mlp;
use crate::quant::{ModuleRule, PackedFormat};

/// The fused tensors of a gpt-oss MoE layer's experts.
#[derive(Debug, Clone, PartialEq)]
pub struct FusedLayer {
    /// `model.layers.{L}.mlp`.
    pub block: String,
    pub experts: usize,
    pub hidden: usize,
    pub intermediate: usize,
    /// Whether the experts ship MXFP4 (blocks + scales) or unquantized.
    pub mxfp4: bool,
    /// In record order (see [`gpt_oss_fused_parts`]).
    pub parts: Vec<FusedPart>,
    pub activation: GluActivation,
}

/// The fused tensors of layer `layer`'s experts, as the config says they
/// ship (`None`: not a gpt-oss MoE layer). `ckpt`, when given, must hold
/// them with the dtypes and shapes [`check_fused_part`] wants; a layer
/// shipped otherwise than `quantization_config` says is an error naming
/// tensor and field.
pub fn gpt_oss_layer_parts(spec: &ModelSpec, layer: usize, ckpt: Option<&Checkpoint>) -> Result<Option<FusedLayer>, ModelError> {
    let Some(FfnSpec::Moe(m)) = spec.layers.get(layer).map(|l| &l.ffn) else {
        return Ok(None);
    };
    let ExpertKind::GptOss { alpha, limit } = m.experts else {
        return Ok(None);
    };
    let block = format!("model.layers.{layer}.{}", spec.moe_names.block);
    let module = format!("{block}.experts");
    let (field, reason) = match spec.mxfp4_experts.as_ref().map(|q| q.rule(&module)) {
        Some(ModuleRule::Packed(PackedFormat::Mxfp4)) => ("quantization_config.modules_to_not_convert".to_string(), None),
        Some(ModuleRule::Plain { field, reason }) => (field, Some(reason)),
        Some(ModuleRule::Packed(other)) => return Err(ModelError::Experts(format!("{module}: {other:?} is not a gpt-oss format"))),
        None => (
            "quantization_config".to_string(),
            Some("config.json has no quantization_config".to_string()),
        ),
    };
    let mxfp4 = reason.is_none();
    let (h, i) = (spec.hidden_size, m.expert_intermediate);
    if mxfp4 && !(h.is_multiple_of(32) && i.is_multiple_of(32)) {
        return Err(ModelError::Experts(format!(
            "{module}: MXFP4 needs hidden_size ({h}) and intermediate_size ({i}) in multiples of 32"
        )));
    }
    let layer_parts = FusedLayer {
        parts: gpt_oss_fused_parts(&block, m.num_experts, h, i, mxfp4),
        block,
        experts: m.num_experts,
        hidden: h,
        intermediate: i,
        mxfp4,
        activation: GluActivation::GptOss { alpha, limit },
    };
    if let Some(ckpt) = ckpt {
        let says = match &reason {
            None => format!("{field} does not name {module}, so its experts ship MXFP4"),
            Some(r) => format!("{field}: {r}, so {module} ships unquantized"),
        };
        let other = gpt_oss_fused_parts(&layer_parts.block, 0, 0, 0, !mxfp4);
        for part in &layer_parts.parts {
            if !ckpt.has(&part.name) {
                let shipped: Vec<&str> = other.iter().map(|p| p.name.as_str()).filter(|n| ckpt.has(n)).collect();
                return Err(ModelError::Experts(match shipped.first() {
                    Some(found) => format!("tensor `{}` is missing but `{found}` is present: {says}", part.name),
                    None => format!("tensor `{}` is missing ({says})", part.name),
                }));
            }
            let info = ckpt.tensor_info(&part.name)?;
            check_fused_part(part, &info.dtype, &info.shape, false).map_err(|m| ModelError::Experts(format!("{m} ({says})")))?;
        }
    }
    Ok(Some(layer_parts))
}

/// Every expert of gpt-oss MoE layer `layer`, in RAM: each fused tensor is
/// read once and each expert views its slice (MXFP4 without a copy).
pub fn load_gpt_oss_layer(spec: &ModelSpec, layer: usize, ckpt: &Checkpoint) -> Result<Vec<Arc<Mlp>>, ModelError> {
    let fused = gpt_oss_layer_parts(spec, layer, Some(ckpt))?
        .ok_or_else(|| ModelError::Experts(format!("layer {layer}: not a gpt-oss expert layer")))?;
    let tensors = fused
        .parts
        .iter()
        .map(|p| Ok((ckpt.tensor_info(&p.name)?.dtype, ckpt.shared_tensor(&p.name)?)))
        .collect::<Result<Vec<_>, ModelError>>()?;
    (0..fused.experts)
        .map(|e| {
            let slices: Vec<_> = tensors
                .iter()
                .map(|(dtype, whole)| {
                    let len = whole.len() / fused.experts;
                    (dtype.as_str(), whole.slice(e * len, len))
                })
                .collect();
            let name = format!("{}.experts.{e}", fused.block);
            let mlp = gpt_oss_expert(&name, fused.hidden, fused.intermediate, fused.mxfp4, &slices, fused.activation)?;
            Ok(Arc::new(mlp))
        })
        .collect()
}
