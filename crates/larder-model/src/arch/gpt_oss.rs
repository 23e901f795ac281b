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
//! Fails closed on fields: every config.json key is read here
//! (`IMPLEMENTED`), known to have no effect on the logits (`NO_EFFECT`), or
//! refused naming it. The lists are in docs/architectures.md (gpt-oss).

use serde_json::Value;

use crate::config::{check_top_k, ConfigJson, ExpertKind, FfnSpec, LayerSpec, MixerSpec, ModelSpec, MoeNames, MoeSpec, Scoring};
use crate::error::ModelError;

/// gpt-oss's MoE tensor names (`mlp.router`; experts are fused per layer,
/// see [`crate::fused_experts`], so `expert_proj` names no tensor).
const NAMES: MoeNames = MoeNames {
    block: "mlp",
    router: "router",
    expert_proj: ["gate_up_proj", "gate_up_proj", "down_proj"],
    shared_expert: "shared_expert",
    shared_expert_gate: "shared_expert_gate",
};

/// Fields this file reads (each value checked where it is read), with
/// transformers' aliases and the fields a transformers-saved config carries.
const IMPLEMENTED: &[&str] = &[
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "rms_norm_eps",
    "attention_bias",
    "tie_word_embeddings",
    "max_position_embeddings",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
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

/// Fields with no effect on the logits (training, generation defaults,
/// bookkeeping).
const NO_EFFECT: &[&str] = &[
    "architectures",
    "attention_dropout",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "initializer_range",
    "output_router_logits",
    "router_aux_loss_coef",
    "transformers_version",
    "use_cache",
    "dtype",
    "torch_dtype",
];

/// Keys of `rope_scaling` / `rope_parameters` (rope.rs reads them).
const ROPE_KEYS: &[&str] = &[
    "rope_type",
    "type",
    "rope_theta",
    "factor",
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "attention_factor",
    "mscale",
    "mscale_all_dim",
    "truncate",
];

/// `model_type: gpt_oss`.
pub fn spec(cfg: &ConfigJson) -> Result<ModelSpec, ModelError> {
    check_fields(cfg)?;
    check_rope(cfg)?;
    let mut spec = super::base_spec(cfg, 150000.0, 131072, NAMES)?;
    // gpt-oss's `attention_bias` defaults to true (base_spec's to false).
    let bias = cfg.opt_bool("attention_bias")?.unwrap_or(true);
    (spec.qkv_bias, spec.o_bias) = (bias, bias);
    spec.attention_sinks = true;
    spec.mxfp4_experts = crate::quant::gpt_oss_mxfp4(cfg)?;
    let n = cfg.num_layers()?;
    let moe = moe_spec(cfg)?;
    let layers = sliding_windows(cfg, n)?
        .into_iter()
        .map(|sliding_window| LayerSpec {
            mixer: MixerSpec::Gqa,
            sliding_window,
            ffn: FfnSpec::Moe(moe.clone()),
        })
        .collect();
    super::finish(cfg, spec, layers)
}

/// Refuses every top-level field neither read here nor without effect.
fn check_fields(cfg: &ConfigJson) -> Result<(), ModelError> {
    for field in cfg.value.as_object().into_iter().flatten().map(|(k, _)| k.as_str()) {
        if !IMPLEMENTED.contains(&field) && !NO_EFFECT.contains(&field) {
            return Err(cfg.err(
                field,
                "is not a gpt_oss field larder implements or knows to have no effect; see docs/architectures.md (gpt-oss)",
            ));
        }
    }
    Ok(())
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
    if let Some(key) = obj.keys().find(|k| !ROPE_KEYS.contains(&k.as_str())) {
        return Err(cfg.err(&format!("{field}.{key}"), "is not a RoPE parameter larder implements"));
    }
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
    Ok(MoeSpec {
        num_experts,
        top_k,
        renormalize: false,
        expert_intermediate: cfg.usize("intermediate_size")?,
        latent: None,
        shared_expert: None,
        scoring: Scoring::TopKSoftmax,
        experts: ExpertKind::GptOss {
            alpha: positive("swiglu_alpha", 1.702)?,
            limit: positive("swiglu_limit", 7.0)?,
        },
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

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/architectures.md's gpt-oss section names every field this file
    /// reads or accepts.
    #[test]
    fn the_docs_list_every_field() {
        let docs = include_str!("../../../../docs/architectures.md");
        let start = docs.find("## gpt-oss").expect("a gpt-oss section");
        let section = &docs[start..start + docs[start + 1..].find("\n## ").unwrap_or(docs.len() - start - 1)];
        for field in IMPLEMENTED.iter().chain(NO_EFFECT).chain(ROPE_KEYS) {
            assert!(
                section.contains(&format!("`{field}`")),
                "docs/architectures.md (gpt-oss) does not name `{field}`"
            );
        }
    }
}
