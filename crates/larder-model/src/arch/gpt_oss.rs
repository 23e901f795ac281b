//! gpt-oss (`model_type: gpt_oss`, `GptOssForCausalLM`), as transformers
//! 5.24.0 reads its config: GQA with q/k/v/o biases (`attention_bias`),
//! per-head learned sinks, layers alternating sliding-window and full
//! attention (`layer_types`, `sliding_window`), YaRN RoPE; a MoE on every
//! layer (`mlp.router` with a bias: top-k over the biased logits, softmax
//! over the k chosen) whose experts are slices of per-layer fused tensors
//! with biases, interleaved gate/up and the clamped activation
//! (`swiglu_limit`, `swiglu_alpha`; [`ExpertKind::GptOss`]), shipped in
//! MXFP4 (`quantization_config.quant_method: mxfp4`, read by
//! [`crate::quant::gpt_oss_mxfp4`]) or unquantized.
//!
//! Keys follow the one policy (`crate::config::ConfigKeys`): every
//! config.json key is read here or by `base_spec` (`KEYS`) or is
//! bookkeeping; any other is refused naming it. The lists are in
//! docs/architectures.md (gpt-oss).

use serde_json::Value;

use crate::config::{check_top_k, ConfigJson, ConfigKeys};
use crate::error::ModelError;
use crate::spec::{ExpertKind, FfnSpec, LayerSpec, MixerSpec, ModelSpec, MoeNames, MoeSpec, Scoring};

/// gpt-oss's MoE tensor names (`mlp.router`; experts are fused per layer,
/// see [`crate::fused_experts`], so `expert_proj` names no tensor).
const NAMES: MoeNames = MoeNames {
    router: "router",
    expert_proj: ["gate_up_proj", "gate_up_proj", "down_proj"],
    ..MoeNames::QWEN
};

/// `model_type: gpt_oss`'s config.json keys.
pub(crate) const KEYS: ConfigKeys = ConfigKeys {
    docs: "gpt-oss",
    read: &[super::SHARED_KEYS, GPT_OSS],
    refused: &[],
};

/// Fields this file reads beyond the shared ones (each value checked where
/// it is read), with transformers' aliases and the fields a
/// transformers-saved config carries.
const GPT_OSS: &[&str] = &[
    "intermediate_size",
    "initial_context_length",
    "layer_types",
    "sliding_window",
    "num_local_experts",
    "num_experts",
    "num_experts_per_tok",
    "experts_per_token",
    "swiglu_limit",
    "swiglu_alpha",
    "quantization_config",
];

/// `model_type: gpt_oss`.
pub(crate) fn spec(cfg: &ConfigJson) -> Result<ModelSpec, ModelError> {
    check_rope(cfg)?;
    let base = super::base_spec(cfg, 150000.0, 131072, NAMES)?;
    // gpt-oss's `attention_bias` defaults to true (base_spec's to false).
    let bias = cfg.opt_bool("attention_bias")?.unwrap_or(true);
    let spec = ModelSpec {
        qkv_bias: bias,
        o_bias: bias,
        attention_sinks: true,
        mxfp4_experts: crate::quant::gpt_oss_mxfp4(cfg)?,
        ..base
    };
    let n = cfg.num_layers()?;
    let moe = moe_spec(cfg)?;
    let layers = sliding_windows(cfg, n)?
        .into_iter()
        .map(|sliding_window| LayerSpec {
            sliding_window,
            ..LayerSpec::new(MixerSpec::Gqa, FfnSpec::Moe(moe.clone()))
        })
        .collect();
    super::finish(cfg, spec, layers)
}

/// RoPE: gpt-oss configs always state it (transformers would otherwise
/// default to YaRN factor 32, which a config without it cannot mean
/// unambiguously); every key is one rope.rs reads; `initial_context_length`
/// must agree with YaRN's `original_max_position_embeddings`.
fn check_rope(cfg: &ConfigJson) -> Result<(), ModelError> {
    let (field, rope) = match (cfg.raw("rope_scaling"), cfg.raw("rope_parameters")) {
        (Some(r), _) => ("rope_scaling", r),
        (None, Some(r)) => ("rope_parameters", r),
        (None, None) => {
            return Err(cfg.err(
                "rope_scaling",
                "missing (gpt-oss ships YaRN; state rope_scaling or rope_parameters explicitly)",
            ))
        }
    };
    let obj = rope.as_object().ok_or_else(|| cfg.err(field, "expected an object"))?;
    let original = obj.get("original_max_position_embeddings").and_then(Value::as_u64);
    if let (Some(initial), Some(original)) = (cfg.opt_usize("initial_context_length")?, original) {
        if initial as u64 != original {
            return Err(cfg.err(
                "initial_context_length",
                format!("{initial} disagrees with {field}.original_max_position_embeddings ({original})"),
            ));
        }
    }
    Ok(())
}

/// The MoE block every layer has.
fn moe_spec(cfg: &ConfigJson) -> Result<MoeSpec, ModelError> {
    let num_experts = match cfg.opt_usize("num_local_experts")? {
        Some(n) => n,
        None => cfg.usize("num_experts")?,
    };
    if let Some(alias) = cfg.opt_usize("num_experts")? {
        if alias != num_experts {
            return Err(cfg.err("num_experts", format!("{alias} disagrees with num_local_experts ({num_experts})")));
        }
    }
    let top_k = cfg.usize("num_experts_per_tok")?;
    if let Some(alias) = cfg.opt_usize("experts_per_token")? {
        if alias != top_k {
            return Err(cfg.err("experts_per_token", format!("{alias} disagrees with num_experts_per_tok ({top_k})")));
        }
    }
    check_top_k(cfg, num_experts, top_k)?;
    let positive = |field: &str, default: f64| -> Result<f32, ModelError> {
        let v = cfg.opt_f64(field)?.unwrap_or(default);
        if !(v.is_finite() && v > 0.0) {
            return Err(cfg.err(field, format!("{v} must be a positive number")));
        }
        Ok(v as f32)
    };
    let intermediate = cfg.usize("intermediate_size")?;
    Ok(MoeSpec {
        scoring: Scoring::TopKSoftmax,
        experts: ExpertKind::GptOss {
            alpha: positive("swiglu_alpha", 1.702)?,
            limit: positive("swiglu_limit", 7.0)?,
        },
        ..MoeSpec::new(num_experts, top_k, intermediate)
    })
}

/// Per-layer sliding windows from `layer_types` (`sliding_attention` /
/// `full_attention`); without it, transformers' default: even layers
/// sliding, odd layers full.
fn sliding_windows(cfg: &ConfigJson, n: usize) -> Result<Vec<Option<usize>>, ModelError> {
    if cfg.raw("layer_types").is_some() {
        return super::qwen_sliding_windows(cfg, n);
    }
    let window = || cfg.usize("sliding_window");
    (0..n).map(|l| if l % 2 == 0 { window().map(Some) } else { Ok(None) }).collect()
}
