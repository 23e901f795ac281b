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

use crate::config::{
    ConfigJson, FfnSpec, LayerSpec, MixerSpec, MlaCache, MlaSpec, ModelSpec, MoeNames, MoeSpec, Scoring, SharedExpertSpec,
};
use crate::error::ModelError;
use crate::rope::{RopeScaling, RopeSpec};

/// `model_type: deepseek_v3` / `kimi_k2`.
pub fn spec(cfg: &ConfigJson) -> Result<ModelSpec, ModelError> {
    cfg.require_silu()?;
    if cfg.opt_bool("attention_bias")?.unwrap_or(false) {
        return Err(cfg.err("attention_bias", "attention biases are not supported for this architecture"));
    }
    let hidden = cfg.usize("hidden_size")?;
    let heads = cfg.usize("num_attention_heads")?;
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
        qkv_bias: false,
        o_bias: false,
        qk_norm: false,
        layers: Vec::new(),
        moe_names: MoeNames::DEEPSEEK,
        fp8_block: fp8_block(cfg)?,
        compressed: crate::quant::compressed_tensors(cfg)?,
        mxfp4_experts: None,
        attn_res_block: None,
        attention_sinks: false,
        mla_cache: MlaCache::default(),
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
    Ok(MlaSpec {
        q_lora_rank,
        kv_lora_rank: cfg.usize("kv_lora_rank")?,
        qk_nope_head_dim: cfg.usize("qk_nope_head_dim")?,
        qk_rope_head_dim: rope,
        v_head_dim: cfg.usize("v_head_dim")?,
        rope_interleave: cfg.opt_bool("rope_interleave")?.unwrap_or(true),
        softmax_scale: 1.0,
        rotary: true,
        latent_norm_eps: crate::mla::LATENT_NORM_EPS,
        output_gate: false,
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
        .map(|l| LayerSpec {
            mixer: mixer.clone(),
            sliding_window: None,
            ffn: match &moe {
                Some(m) if l >= first_dense && l % freq == 0 => FfnSpec::Moe(m.clone()),
                _ => dense.clone(),
            },
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
        Some(k) => Some(SharedExpertSpec {
            intermediate: intermediate * k,
            sigmoid_gate: false,
        }),
    };
    Ok(MoeSpec {
        num_experts,
        top_k,
        renormalize: cfg.opt_bool("norm_topk_prob")?.unwrap_or(false),
        expert_intermediate: intermediate,
        latent: None,
        shared_expert: shared,
        scoring: Scoring::SigmoidGroups {
            n_group,
            topk_group,
            scaling: cfg.opt_f64("routed_scaling_factor")?.unwrap_or(1.0) as f32,
        },
        experts: crate::config::ExpertKind::Swiglu,
    })
}

/// `quantization_config` of an fp8 checkpoint: its block size.
pub(crate) fn fp8_block(cfg: &ConfigJson) -> Result<Option<(usize, usize)>, ModelError> {
    let Some(q) = cfg.raw("quantization_config") else { return Ok(None) };
    let field = "quantization_config";
    let method = q.get("quant_method").and_then(|m| m.as_str()).unwrap_or("");
    if method == "compressed-tensors" {
        return Ok(None); // read by crate::quant::compressed_tensors
    }
    if method != "fp8" {
        return Err(cfg.err(
            &format!("{field}.quant_method"),
            format!("{method:?} is not supported (supported: fp8 with block scales, compressed-tensors)"),
        ));
    }
    if let Some(fmt) = q.get("fmt").and_then(|f| f.as_str()) {
        if fmt != "e4m3" {
            return Err(cfg.err(&format!("{field}.fmt"), format!("{fmt:?} is not supported (supported: e4m3)")));
        }
    }
    let block: Vec<usize> = q
        .get("weight_block_size")
        .and_then(|b| b.as_array())
        .map(|a| a.iter().filter_map(|v| v.as_u64().map(|x| x as usize)).collect())
        .unwrap_or_default();
    match block.as_slice() {
        [r, c] if *r > 0 && *c > 0 => Ok(Some((*r, *c))),
        _ => Err(cfg.err(&format!("{field}.weight_block_size"), "expected two positive integers")),
    }
}
