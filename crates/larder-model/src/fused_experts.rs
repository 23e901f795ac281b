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

use larder_tensor::GluActivation;

use crate::assemble::{check_fused_part, gpt_oss_expert, gpt_oss_fused_parts, gpt_oss_placeholder_expert, FusedPart};
use crate::checkpoint::Checkpoint;
use crate::error::ModelError;
use crate::mlp::Mlp;
use crate::quant::{ModuleRule, PackedFormat};
use crate::source::{with_expert_tag, ExpertTag, TensorPath, WeightSource};
use crate::spec::{ExpertKind, FfnSpec, ModelSpec};

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
    /// In record order (see `gpt_oss_fused_parts`).
    pub parts: Vec<FusedPart>,
    pub activation: GluActivation,
}

impl FusedLayer {
    /// Expert `expert`'s module name (`{block}.experts.{expert}`), naming it in errors.
    pub(crate) fn expert_module(&self, expert: usize) -> String {
        TensorPath::root().pp(&self.block).pp("experts").pp(expert).to_string()
    }
}

/// The fused tensors of layer `layer`'s experts, as the config says they
/// ship (`None`: not a gpt-oss MoE layer). `ckpt`, when given, must hold
/// them with the dtypes and shapes [`check_fused_part`] wants; a layer
/// shipped otherwise than `quantization_config` says is an error naming
/// tensor and field.
pub fn gpt_oss_layer_parts(spec: &ModelSpec, layer: usize, ckpt: Option<&Checkpoint>) -> Result<Option<FusedLayer>, ModelError> {
    let Some((layer_parts, says)) = fused_layer(spec, layer)? else {
        return Ok(None);
    };
    if let Some(ckpt) = ckpt {
        for part in &layer_parts.parts {
            check_present(&layer_parts, part, &says, |n| Ok(ckpt.has(n)))?;
            let info = ckpt.tensor_info(&part.name)?;
            check_fused_part(part, &info.dtype, &info.shape, false).map_err(|m| ModelError::Experts(format!("{m} ({says})")))?;
        }
    }
    Ok(Some(layer_parts))
}

/// The fused tensors of layer `layer` and what the config says of how they
/// ship (for errors); `None` for a layer without gpt-oss experts.
fn fused_layer(spec: &ModelSpec, layer: usize) -> Result<Option<(FusedLayer, String)>, ModelError> {
    let Some(FfnSpec::Moe(m)) = spec.layers.get(layer).map(|l| &l.ffn) else {
        return Ok(None);
    };
    let ExpertKind::GptOss { alpha, limit } = m.experts else {
        return Ok(None);
    };
    let block = TensorPath::decoder_layer(layer).pp(spec.moe_names.block);
    let module = block.name("experts");
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
    let says = match &reason {
        None => format!("{field} does not name {module}, so its experts ship MXFP4"),
        Some(r) => format!("{field}: {r}, so {module} ships unquantized"),
    };
    let layer_parts = FusedLayer {
        parts: gpt_oss_fused_parts(block.as_str(), m.num_experts, h, i, mxfp4),
        block: block.to_string(),
        experts: m.num_experts,
        hidden: h,
        intermediate: i,
        mxfp4,
        activation: GluActivation::GptOss { alpha, limit },
    };
    Ok(Some((layer_parts, says)))
}

/// An error unless `part` ships (`has`), naming the other format's tensor
/// where that one ships instead.
fn check_present(
    fused: &FusedLayer,
    part: &FusedPart,
    says: &str,
    has: impl Fn(&str) -> Result<bool, ModelError>,
) -> Result<(), ModelError> {
    if has(&part.name)? {
        return Ok(());
    }
    let other = gpt_oss_fused_parts(&fused.block, 0, 0, 0, !fused.mxfp4);
    let mut shipped = Vec::new();
    for p in &other {
        if has(&p.name)? {
            shipped.push(p.name.as_str());
        }
    }
    Err(ModelError::Experts(match shipped.first() {
        Some(found) => format!("tensor `{}` is missing but `{found}` is present: {says}", part.name),
        None => format!("tensor `{}` is missing ({says})", part.name),
    }))
}

/// Every expert of gpt-oss MoE layer `layer`, in RAM: each fused tensor is
/// taken once (whole, as shipped) and each expert views its slice (MXFP4
/// without a copy).
pub(crate) fn load_gpt_oss_layer(spec: &ModelSpec, layer: usize, weights: &dyn WeightSource) -> Result<Vec<Arc<Mlp>>, ModelError> {
    let (fused, says) =
        fused_layer(spec, layer)?.ok_or_else(|| ModelError::Experts(format!("layer {layer}: not a gpt-oss expert layer")))?;
    for part in &fused.parts {
        check_present(&fused, part, &says, |n| weights.has(n))?;
    }
    let mut tensors = Vec::with_capacity(fused.parts.len());
    for part in &fused.parts {
        let tag = ExpertTag {
            layer,
            expert: None,
            role: part.role,
        };
        let t = with_expert_tag(weights, tag, || weights.raw_tensor(&part.name, part.dtypes, &part.shape))?;
        check_fused_part(part, &t.dtype, &t.shape, false).map_err(|m| ModelError::Experts(format!("{m} ({says})")))?;
        tensors.push((t.dtype, t.bytes));
    }
    (0..fused.experts)
        .map(|e| {
            let slices: Vec<_> = tensors
                .iter()
                .map(|(dtype, whole)| {
                    let len = whole.len() / fused.experts;
                    (dtype.as_str(), whole.slice(e * len, len))
                })
                .collect();
            let name = fused.expert_module(e);
            let build = match weights.zero_placeholders() {
                true => gpt_oss_placeholder_expert,
                false => gpt_oss_expert,
            };
            let mlp = build(&name, fused.hidden, fused.intermediate, fused.mxfp4, &slices, fused.activation)?;
            Ok(Arc::new(mlp))
        })
        .collect()
}
