//! DeepSeek-V3 and Kimi-K2 (`DeepseekV3ForCausalLM`; `model_type`
//! `deepseek_v3` or `kimi_k2`): multi-head latent attention, dense MLPs in
//! the first `first_k_dense_replace` layers (and off the `moe_layer_freq`
//! grid), MoE elsewhere with sigmoid group-limited routing, a selection-only
//! correction bias, `n_shared_experts` always-applied shared experts and
//! `routed_scaling_factor`; optional fp8 weights with 2-D block scales.
//!
//! Multi-token-prediction layers (`num_nextn_predict_layers`; tensors of
//! layer index `num_hidden_layers` and up) are not loaded: the main model
//! runs without them; they stay addressable in the checkpoint for drafting.

use crate::config::{ConfigJson, ConfigKeys};
use crate::error::ModelError;
use crate::rope::{RopeScaling, RopeSpec};
use crate::spec::{FfnSpec, LayerSpec, MixerSpec, MlaSpec, ModelSpec, MoeNames, MoeSpec, Scoring, SharedExpertSpec};

/// `model_type: deepseek_v3` / `kimi_k2`'s config.json keys.
pub(crate) const KEYS: ConfigKeys = ConfigKeys {
    docs: "DeepSeek-V3 / Kimi-K2",
    read: &[&[
        "model_type",
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "hidden_act",
        "rms_norm_eps",
        "attention_bias",
        "tie_word_embeddings",
        "max_position_embeddings",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "rope_interleave",
        "q_lora_rank",
        "kv_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
        "head_dim",
        "qk_head_dim",
        "intermediate_size",
        "moe_intermediate_size",
        "n_routed_experts",
        "num_experts_per_tok",
        "n_shared_experts",
        "first_k_dense_replace",
        "moe_layer_freq",
        "n_group",
        "topk_group",
        "norm_topk_prob",
        "routed_scaling_factor",
        "scoring_func",
        "topk_method",
        "quantization_config",
        // No effect on the main model's logits: multi-token-prediction
        // layers are not loaded (module doc); training and parallelism settings.
        "num_nextn_predict_layers",
        "aux_loss_alpha",
        "seq_aux",
        "ep_size",
    ]],
    refused: &[],
};

/// `model_type: deepseek_v3` / `kimi_k2`.
pub(crate) fn spec(cfg: &ConfigJson) -> Result<ModelSpec, ModelError> {
    cfg.require_silu()?;
    if cfg.opt_bool("attention_bias")?.unwrap_or(false) {
        return Err(cfg.err("attention_bias", "attention biases are not supported for this architecture"));
    }
    let hidden = cfg.usize("hidden_size")?;
    let heads = cfg.usize("num_attention_heads")?;
    cfg.equal_heads(heads)?;
    let mla = mla_spec(cfg)?;
    let rope = RopeSpec::from_config(cfg, 10000.0)?;
    let qk = (mla.qk_nope_head_dim + mla.qk_rope_head_dim) as f64;
    let mut softmax_scale = qk.powf(-0.5);
    if let RopeScaling::Yarn {
        factor,
        mscale_all_dim: Some(m),
        ..
    } = &rope.scaling
    {
        if *m != 0.0 && *factor > 1.0 {
            let mscale = 0.1 * m * factor.ln() + 1.0;
            softmax_scale *= mscale * mscale;
        }
    }
    let mla = MlaSpec {
        softmax_scale: softmax_scale as f32,
        ..mla
    };
    let spec = ModelSpec {
        model_type: cfg.opt_str("model_type")?.unwrap_or_default().to_string(),
        hidden_size: hidden,
        vocab_size: cfg.usize("vocab_size")?,
        num_heads: heads,
        num_kv_heads: heads,
        head_dim: mla.qk_rope_head_dim,
        rms_norm_eps: cfg.rms_norm_eps()?,
        max_position_embeddings: cfg.opt_usize("max_position_embeddings")?.unwrap_or(4096),
        rope,
        tie_word_embeddings: cfg.opt_bool("tie_word_embeddings")?.unwrap_or(false),
        moe_names: MoeNames::DEEPSEEK,
        fp8_block: crate::quant::fp8_block(cfg)?,
        compressed: crate::quant::compressed_tensors(cfg)?,
        ..ModelSpec::default()
    };
    let layers = layer_plan(cfg, &MixerSpec::Mla(mla))?;
    super::finish(cfg, spec, layers)
}

fn mla_spec(cfg: &ConfigJson) -> Result<MlaSpec, ModelError> {
    let q_lora_rank = match cfg.raw("q_lora_rank") {
        None | Some(serde_json::Value::Null) => None,
        Some(_) => Some(cfg.usize("q_lora_rank")?),
    };
    let rope = cfg.usize("qk_rope_head_dim")?;
    if rope % 2 != 0 {
        return Err(cfg.err("qk_rope_head_dim", format!("{rope} must be even (RoPE rotates pairs)")));
    }
    let kv_lora_rank = cfg.usize("kv_lora_rank")?;
    let nope = cfg.usize("qk_nope_head_dim")?;
    let v_head_dim = cfg.usize("v_head_dim")?;
    // Derived by transformers (`head_dim` = qk_rope_head_dim, `qk_head_dim` =
    // nope + rope) and saved in its configs; larder derives both itself, so
    // only their types are checked.
    cfg.opt_usize("head_dim")?;
    cfg.opt_usize("qk_head_dim")?;
    Ok(MlaSpec {
        q_lora_rank,
        rope_interleave: cfg.opt_bool("rope_interleave")?.unwrap_or(true),
        ..MlaSpec::new(kv_lora_rank, nope, rope, v_head_dim)
    })
}

/// Dense or MoE per layer, as DeepSeek's reference code decides; every
/// layer mixes with `mixer`.
fn layer_plan(cfg: &ConfigJson, mixer: &MixerSpec) -> Result<Vec<LayerSpec>, ModelError> {
    let n = cfg.num_layers()?;
    let dense = FfnSpec::Dense {
        intermediate: cfg.usize("intermediate_size")?,
    };
    let moe = match cfg.opt_usize("n_routed_experts")? {
        None | Some(0) => None,
        Some(num_experts) => Some(moe_spec(cfg, num_experts)?),
    };
    let first_dense = cfg.opt_usize("first_k_dense_replace")?.unwrap_or(0);
    let freq = cfg.opt_usize("moe_layer_freq")?.unwrap_or(1);
    if freq == 0 {
        return Err(cfg.err("moe_layer_freq", "must be positive"));
    }
    Ok((0..n)
        .map(|l| {
            let ffn = match &moe {
                Some(m) if l >= first_dense && l % freq == 0 => FfnSpec::Moe(m.clone()),
                _ => dense.clone(),
            };
            LayerSpec::new(mixer.clone(), ffn)
        })
        .collect())
}

fn moe_spec(cfg: &ConfigJson, num_experts: usize) -> Result<MoeSpec, ModelError> {
    let top_k = cfg.usize("num_experts_per_tok")?;
    crate::config::check_top_k(cfg, num_experts, top_k)?;
    match cfg.opt_str("scoring_func")?.unwrap_or("sigmoid") {
        "sigmoid" => {}
        other => {
            return Err(cfg.err(
                "scoring_func",
                format!("{other:?} is not supported for this architecture (supported: sigmoid)"),
            ))
        }
    }
    match cfg.opt_str("topk_method")?.unwrap_or("noaux_tc") {
        "noaux_tc" => {}
        other => return Err(cfg.err("topk_method", format!("{other:?} is not supported (supported: noaux_tc)"))),
    }
    let n_group = cfg.opt_usize("n_group")?.unwrap_or(1);
    let topk_group = cfg.opt_usize("topk_group")?.unwrap_or(1);
    if n_group == 0 || !num_experts.is_multiple_of(n_group) {
        return Err(cfg.err("n_group", format!("{n_group} must divide n_routed_experts ({num_experts})")));
    }
    if topk_group == 0 || topk_group > n_group {
        return Err(cfg.err("topk_group", format!("{topk_group} must be between 1 and n_group ({n_group})")));
    }
    let intermediate = cfg.usize("moe_intermediate_size")?;
    let shared = match cfg.opt_usize("n_shared_experts")? {
        None | Some(0) => None,
        Some(k) => Some(SharedExpertSpec::new(intermediate * k)),
    };
    Ok(MoeSpec {
        renormalize: cfg.opt_bool("norm_topk_prob")?.unwrap_or(false),
        shared_expert: shared,
        scoring: Scoring::SigmoidGroups {
            n_group,
            topk_group,
            scaling: cfg.opt_f64("routed_scaling_factor")?.unwrap_or(1.0) as f32,
        },
        ..MoeSpec::new(num_experts, top_k, intermediate)
    })
}
