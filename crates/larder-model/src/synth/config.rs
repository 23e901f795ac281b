//! The `config.json` of a synthetic checkpoint, with the field names each
//! architecture's real checkpoints use (Qwen3-MoE, DeepSeek-V3, and Kimi
//! Linear as Moonshot's config.json and transformers 5.24.0 spell them).

use serde_json::{json, Value};

use super::{DeepseekShape, ExpertsFormat, KdaShape, SynthSpec};

impl SynthSpec {
    pub(super) fn config(&self) -> Value {
        if let Some(g) = &self.gpt_oss {
            // gpt_oss refuses unknown fields too: no synth record.
            return super::gpt_oss::config(self, g);
        }
        if let (Some(d), Some(k), Some(k3)) = (&self.deepseek, &self.kda, &self.k3) {
            // So do kimi_k3 and its text config.
            return super::kimi_k3::config(self, d, k, k3);
        }
        let mut cfg = match (&self.deepseek, &self.kda) {
            // kimi_linear refuses every field it does not know (K3 extensions
            // must not pass silently), so the synth record is left out.
            (Some(d), Some(k)) => kimi_linear(self, d, k),
            (Some(d), None) => deepseek_v3(self, d),
            _ => qwen3_moe(self),
        };
        if let Some(q) = compressed_tensors(self) {
            cfg["quantization_config"] = q;
        }
        if self.kda.is_none() {
            cfg["larder_synth"] = json!({"preset": self.preset, "seed": self.seed, "routing": self.routing});
            if !self.knobs().is_uniform() {
                cfg["larder_synth"]["routing_knobs"] = json!(self.knobs());
            }
        }
        cfg
    }
}

/// The compressed-tensors `quantization_config` of 4-bit routed experts,
/// in the exact form of fixtures/deepseek_v3_int4 and deepseek_v3_mxfp4
/// (compressed-tensors 0.20.1): every `Linear` is targeted, and attention,
/// shared experts, dense MLPs, latent projections and the LM head are ignored.
fn compressed_tensors(s: &SynthSpec) -> Option<Value> {
    let mut ignore = vec![
        json!("lm_head"),
        json!("re:.*self_attn.*"),
        json!("re:.*shared_experts.*"),
        json!("re:.*mlp\\.(gate|up|gate_up|down)_proj.*"),
    ];
    if s.routed_expert_hidden_size.is_some() {
        ignore.push(json!("re:.*routed_expert_(down|up)_proj.*"));
    }
    let (format, group) = match s.experts_format {
        ExpertsFormat::Bf16 => return None,
        ExpertsFormat::Int4 => (
            "pack-quantized",
            json!({
                "input_activations": null,
                "output_activations": null,
                "targets": ["Linear"],
                "weights": {
                    "actorder": null,
                    "block_structure": null,
                    "dynamic": false,
                    "group_size": 32,
                    "num_bits": 4,
                    "observer": "minmax",
                    "observer_kwargs": {},
                    "strategy": "group",
                    "symmetric": true,
                    "type": "int",
                },
            }),
        ),
        ExpertsFormat::Mxfp4 => (
            "mxfp4-pack-quantized",
            json!({
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 4,
                    "type": "float",
                    "symmetric": true,
                    "group_size": 32,
                    "strategy": "group",
                    "dynamic": false,
                    "scale_dtype": "torch.uint8",
                },
                "input_activations": null,
                "output_activations": null,
                "format": "mxfp4-pack-quantized",
            }),
        ),
    };
    Some(json!({
        "config_groups": {"group_0": group},
        "format": format,
        "ignore": ignore,
        "kv_cache_scheme": null,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
    }))
}

fn qwen3_moe(s: &SynthSpec) -> Value {
    json!({
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": s.hidden,
        "intermediate_size": s.expert_intermediate * 4,
        "moe_intermediate_size": s.expert_intermediate,
        "num_experts": s.experts,
        "num_experts_per_tok": s.top_k,
        "norm_topk_prob": true,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "vocab_size": s.vocab,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": false,
        "attention_bias": false,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": s.vocab - 1,
    })
}

fn deepseek_v3(s: &SynthSpec, d: &DeepseekShape) -> Value {
    json!({
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": s.hidden,
        "intermediate_size": s.expert_intermediate * 4,
        "moe_intermediate_size": s.expert_intermediate,
        "n_routed_experts": s.experts,
        "num_experts_per_tok": s.top_k,
        "n_shared_experts": d.n_shared_experts,
        "first_k_dense_replace": d.first_k_dense_replace,
        "moe_layer_freq": 1,
        "n_group": d.n_group,
        "topk_group": d.topk_group,
        "norm_topk_prob": true,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "q_lora_rank": d.q_lora_rank,
        "kv_lora_rank": d.kv_lora_rank,
        "qk_nope_head_dim": d.qk_nope_head_dim,
        "qk_rope_head_dim": d.qk_rope_head_dim,
        "v_head_dim": d.v_head_dim,
        "rope_interleave": true,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.heads,
        "vocab_size": s.vocab,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": false,
        "attention_bias": false,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": s.vocab - 1,
        "num_nextn_predict_layers": 0,
    })
}

/// Moonshot's Kimi-Linear-48B-A3B config.json fields (docs/kimi_linear.md),
/// with 1-based `kda_layers` / `full_attn_layers`; latent experts as K3
/// names them (`routed_expert_hidden_size`, `latent_moe_use_norm`).
fn kimi_linear(s: &SynthSpec, d: &DeepseekShape, k: &KdaShape) -> Value {
    let (kda, full) = s.layer_lists(k);
    let mut cfg = json!({
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "hidden_size": s.hidden,
        "intermediate_size": s.expert_intermediate * 4,
        "moe_intermediate_size": s.expert_intermediate,
        "num_experts": s.experts,
        "num_experts_per_token": s.top_k,
        "num_shared_experts": d.n_shared_experts,
        "first_k_dense_replace": d.first_k_dense_replace,
        "moe_layer_freq": 1,
        "moe_renormalize": true,
        "moe_router_activation_func": "sigmoid",
        "num_expert_group": d.n_group,
        "topk_group": d.topk_group,
        "routed_scaling_factor": 2.446,
        "linear_attn_config": {
            "kda_layers": kda,
            "full_attn_layers": full,
            "num_heads": k.heads,
            "head_dim": k.head_dim,
            "short_conv_kernel_size": k.conv_kernel,
        },
        "mla_use_nope": true,
        "q_lora_rank": d.q_lora_rank,
        "kv_lora_rank": d.kv_lora_rank,
        "qk_nope_head_dim": d.qk_nope_head_dim,
        "qk_rope_head_dim": d.qk_rope_head_dim,
        "v_head_dim": d.v_head_dim,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.heads,
        "vocab_size": s.vocab,
        "model_max_length": 8192,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": false,
        "attention_bias": false,
        "hidden_act": "silu",
        "dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": s.vocab - 1,
        "num_nextn_predict_layers": 0,
    });
    if let Some(latent) = s.routed_expert_hidden_size {
        cfg["routed_expert_hidden_size"] = json!(latent);
        cfg["latent_moe_use_norm"] = json!(s.latent_moe_use_norm);
    }
    cfg
}
