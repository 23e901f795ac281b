//! Synthetic gpt-oss checkpoints: the presets (`tiny`, and `20b` / `120b`
//! with the shapes of openai/gpt-oss-20b and -120b) and the config.json,
//! as fixtures/gpt_oss_tiny (MXFP4 experts,
//! `quant_method: mxfp4`) and fixtures/gpt_oss_bf16 (unquantized fused
//! experts) ship them. The tensors come from the loader ([`super::plan`]):
//! experts are fused per layer: bf16 `gate_up_proj` `[E, H, 2I]` (gate and
//! up interleaved in the last dimension) and `down_proj` `[E, I, H]`; or
//! MXFP4 `gate_up_proj_blocks` u8 `[E, 2I, H/32, 16]`, `gate_up_proj_scales`
//! u8 `[E, 2I, H/32]`, `down_proj_blocks` `[E, H, I/32, 16]`,
//! `down_proj_scales` `[E, H, I/32]` (rows = output units); biases
//! `gate_up_proj_bias` `[E, 2I]` and `down_proj_bias` `[E, H]` in bf16.

use serde_json::{json, Value};

use super::{ExpertsFormat, GptOssShape, Routing, SynthSpec};

/// `tiny`, `20b` or `120b`, with MXFP4 experts (as gpt-oss ships).
pub(super) fn preset(preset: &str) -> Result<SynthSpec, String> {
    let (hidden, layers, experts, heads, kv_heads, vocab, window) = match preset {
        "tiny" => (64, 4, 16, 4, 2, 512, 4),
        "20b" => (2880, 24, 32, 64, 8, 201_088, 128),
        "120b" => (2880, 36, 128, 64, 8, 201_088, 128),
        other => return Err(format!("unknown gpt_oss preset {other:?} (tiny, 20b, 120b)")),
    };
    Ok(SynthSpec {
        arch: "gpt_oss".into(),
        preset: preset.into(),
        hidden,
        expert_intermediate: hidden,
        experts,
        top_k: 4,
        layers,
        heads,
        kv_heads,
        head_dim: if preset == "tiny" { 16 } else { 64 },
        vocab,
        seed: 0,
        routing: Routing::Uniform,
        routing_knobs: None,
        deepseek: None,
        kda: None,
        routed_expert_hidden_size: None,
        latent_moe_use_norm: false,
        k3: None,
        experts_format: ExpertsFormat::Mxfp4,
        gpt_oss: Some(GptOssShape { sliding_window: window }),
    })
}

/// config.json with exactly the keys of fixtures/gpt_oss_tiny (openai's
/// gpt-oss-20b config.json key set); `quantization_config` only for MXFP4.
pub(super) fn config(s: &SynthSpec, g: &GptOssShape) -> Value {
    let layer_types: Vec<&str> = (0..s.layers)
        .map(|l| if l % 2 == 0 { "sliding_attention" } else { "full_attention" })
        .collect();
    let mut cfg = json!({
        "architectures": ["GptOssForCausalLM"],
        "attention_bias": true,
        "attention_dropout": 0.0,
        "eos_token_id": s.vocab - 1,
        "experts_per_token": s.top_k,
        "head_dim": s.head_dim,
        "hidden_act": "silu",
        "hidden_size": s.hidden,
        "initial_context_length": 4096,
        "initializer_range": 0.02,
        "intermediate_size": s.expert_intermediate,
        "layer_types": layer_types,
        "max_position_embeddings": 131072,
        "model_type": "gpt_oss",
        "num_attention_heads": s.heads,
        "num_experts_per_tok": s.top_k,
        "num_hidden_layers": s.layers,
        "num_key_value_heads": s.kv_heads,
        "num_local_experts": s.experts,
        "output_router_logits": false,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-5,
        "rope_scaling": {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "rope_type": "yarn",
            "truncate": false,
        },
        "rope_theta": 150000.0,
        "router_aux_loss_coef": 0.9,
        "sliding_window": g.sliding_window,
        "swiglu_limit": 7.0,
        "tie_word_embeddings": false,
        "transformers_version": "4.55.0.dev0",
        "use_cache": true,
        "vocab_size": s.vocab,
    });
    if s.experts_format == ExpertsFormat::Mxfp4 {
        cfg["quantization_config"] = json!({
            "modules_to_not_convert": [
                "model.layers.*.self_attn",
                "model.layers.*.mlp.router",
                "model.embed_tokens",
                "lm_head",
            ],
            "quant_method": "mxfp4",
        });
    }
    cfg
}
