//! Synthetic Kimi K3 checkpoints (`--arch kimi_k3`), in the published
//! layout (docs/kimi_k3_reference.md §2, as fixtures/kimi_k3_tiny ships
//! it): config.json is the `KimiK3ForConditionalGeneration` wrapper, with
//! the text model's config under `text_config` (a `kimi_linear` config
//! carrying every K3 field at its released value: SiTU-GLU with betas 4.0
//! and 25.0, latent experts with their norm, attention residuals, the
//! full-rank KDA gate with lower bound −5.0, the MLA output gate, and the
//! released compressed-tensors `mxfp4-pack-quantized` config with its
//! `ignore` list) and a small `vision_config`. Tensors are the text model's
//! under `language_model.` (named by [`super::plan`] from the loader) and a
//! small vision tower and projector (`vision_tower.*`, `mm_projector.*`,
//! [`vision_tensors`]) in a shard of their own, which larder never reads.
//!
//! Presets: `tiny` and `k3`, the released geometry (hidden 7168, 93 layers
//! of which 24 MLA at 1-based 4, 8, ..., 92 and 93, 896 experts top-16 of
//! intermediate 3072 at latent width 3584, 2 shared experts, vocab 163840),
//! whose MXFP4 expert record is 17,547,264 bytes. `--layers` and
//! `--experts` shrink it with the per-expert geometry kept.

use serde_json::{json, Value};

use super::{DeepseekShape, ExpertsFormat, K3Shape, KdaShape, Routing, SynthSpec};

/// The released SiTU betas, KDA gate lower bound and norm eps.
const SITU_BETA: f64 = 4.0;
const SITU_LINEAR_BETA: f64 = 25.0;
const GATE_LOWER_BOUND: f64 = -5.0;

/// `tiny` or `k3`, with MXFP4 latent experts (as K3 ships).
pub(super) fn preset(preset: &str) -> Result<SynthSpec, String> {
    let real = match preset {
        "tiny" => false,
        "k3" => true,
        other => return Err(format!("unknown kimi_k3 preset {other:?} (tiny, k3)")),
    };
    let pick = |tiny: usize, k3: usize| if real { k3 } else { tiny };
    let heads = pick(4, 96);
    Ok(SynthSpec {
        arch: "kimi_k3".into(),
        preset: preset.into(),
        hidden: pick(64, 7168),
        expert_intermediate: pick(32, 3072),
        experts: pick(16, 896),
        top_k: pick(4, 16),
        // tiny: KDA x3, MLA, KDA, MLA (the last layer is MLA, as in K3).
        layers: pick(6, 93),
        heads,
        kv_heads: heads,
        head_dim: pick(16, 128),
        vocab: pick(512, 163_840),
        seed: 0,
        routing: Routing::Uniform,
        routing_knobs: None,
        deepseek: Some(DeepseekShape {
            q_lora_rank: Some(pick(48, 1536)),
            kv_lora_rank: pick(32, 512),
            qk_nope_head_dim: pick(16, 128),
            qk_rope_head_dim: pick(8, 64),
            v_head_dim: pick(16, 128),
            n_shared_experts: 2,
            first_k_dense_replace: 1,
            n_group: 1,
            topk_group: 1,
        }),
        kda: Some(KdaShape {
            heads: pick(2, 96),
            head_dim: pick(16, 128),
            conv_kernel: 4,
            mla_every: 4,
            mla_last: true,
        }),
        routed_expert_hidden_size: Some(pick(32, 3584)),
        latent_moe_use_norm: true,
        k3: Some(K3Shape {
            attn_res_block_size: pick(3, 12),
        }),
        experts_format: ExpertsFormat::Mxfp4,
        gpt_oss: None,
    })
}

/// The special token ids: the release's (`[BOS]` 163584, `<|end_of_msg|>`
/// 163586, `<|media_pad|>` 163605, `[PAD]` 163839 of 163840) at the same
/// distance from the end of any vocabulary of 256 ids or more; `(bos, eos,
/// media, pad)`.
pub(super) fn special_ids(vocab: usize) -> (usize, usize, usize, usize) {
    let last = vocab.saturating_sub(1);
    let base = vocab.saturating_sub(256);
    (base, (base + 2).min(last), (base + 21).min(last), last)
}

/// The released KDA `A_log` length for `heads` heads: padded with zeros to
/// the next multiple of 64 (96 heads ship 128 values).
pub(super) fn a_log_len(heads: usize) -> usize {
    heads.next_multiple_of(64)
}

/// Widths of the small vision tower synth writes (fixtures/kimi_k3_tiny's).
const VT_HIDDEN: usize = 16;
const QKV_HIDDEN: usize = 24;
const MM_HIDDEN: usize = 16;
/// Patches merged per token (`merge_kernel_size` 2 x 2).
const MERGE: usize = 4;

/// The vision tower's and projector's tensors (bf16; never read by larder).
pub(super) fn vision_tensors(s: &SynthSpec) -> Vec<(&'static str, Vec<usize>)> {
    vec![
        ("mm_projector.post_norm.weight", vec![s.hidden]),
        ("mm_projector.proj.0.weight", vec![MM_HIDDEN * MERGE, MM_HIDDEN * MERGE]),
        ("mm_projector.proj.2.weight", vec![s.hidden, MM_HIDDEN * MERGE]),
        ("vision_tower.encoder.blocks.0.wqkv.weight", vec![3 * QKV_HIDDEN, VT_HIDDEN]),
        ("vision_tower.patch_embed.proj.weight", vec![VT_HIDDEN, 3, 14, 14]),
    ]
}

/// config.json: the wrapper with the text model's config under
/// `text_config` and the vision tower's under `vision_config`, keys as
/// fixtures/kimi_k3_tiny (the release's), plus the `larder_synth` record
/// (bookkeeping) at the top level.
pub(super) fn config(s: &SynthSpec, d: &DeepseekShape, k: &KdaShape, k3: &K3Shape) -> Value {
    let (kda, full) = s.layer_lists(k);
    let (bos, eos, media, pad) = special_ids(s.vocab);
    let mut text = json!({
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "vocab_size": s.vocab,
        "hidden_size": s.hidden,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        // K3's dense first layer: 33792 = 11 x 3072.
        "intermediate_size": s.expert_intermediate * 11,
        "hidden_act": "situ",
        "activation_situ_beta": SITU_BETA,
        "activation_situ_linear_beta": SITU_LINEAR_BETA,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 1_048_576,
        "tie_word_embeddings": false,
        "q_lora_rank": d.q_lora_rank,
        "kv_lora_rank": d.kv_lora_rank,
        "qk_nope_head_dim": d.qk_nope_head_dim,
        "qk_rope_head_dim": d.qk_rope_head_dim,
        "v_head_dim": d.v_head_dim,
    });
    // Two literals: one is past serde_json's macro recursion limit.
    let moe = json!({
        "mla_use_nope": true,
        "mla_use_output_gate": true,
        "num_experts": s.experts,
        "num_experts_per_token": s.top_k,
        "num_shared_experts": d.n_shared_experts,
        "moe_intermediate_size": s.expert_intermediate,
        "routed_expert_hidden_size": s.routed_expert_hidden_size,
        "latent_moe_use_norm": s.latent_moe_use_norm,
        "moe_renormalize": true,
        "moe_router_activation_func": "sigmoid",
        "routed_scaling_factor": 1.0,
        "num_expert_group": d.n_group,
        "topk_group": d.topk_group,
        "use_grouped_topk": true,
        "topk_method": "noaux_tc",
        "first_k_dense_replace": d.first_k_dense_replace,
        "moe_layer_freq": 1,
        "num_nextn_predict_layers": 0,
        "attn_res_block_size": k3.attn_res_block_size,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "linear_attn_config": {
            "full_attn_layers": full,
            "kda_layers": kda,
            "num_heads": k.heads,
            "head_dim": k.head_dim,
            "short_conv_kernel_size": k.conv_kernel,
            "use_full_rank_gate": true,
            "gate_lower_bound": GATE_LOWER_BOUND,
        },
    });
    if let (Some(text), Value::Object(moe)) = (text.as_object_mut(), moe) {
        text.extend(moe);
    }
    if s.experts_format == ExpertsFormat::Mxfp4 {
        text["quantization_config"] = released_quantization();
    }
    let mut cfg = json!({
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3",
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "media_placeholder_token_id": media,
        "image_placeholder": "<|kimi_image_placeholder|>",
        "tie_word_embeddings": false,
        "dtype": "bfloat16",
        "text_config": text,
        "vision_config": {
            "patch_size": 14,
            "init_pos_emb_height": 4,
            "init_pos_emb_width": 4,
            "init_pos_emb_time": 2,
            "pos_emb_type": "divided_fixed",
            "vt_num_attention_heads": 2,
            "vt_num_hidden_layers": 1,
            "vt_hidden_size": VT_HIDDEN,
            "vt_intermediate_size": 2 * VT_HIDDEN,
            "qkv_hidden_size": QKV_HIDDEN,
            "merge_kernel_size": [2, 2],
            "merge_type": "sd2_tpool",
            "mm_projector_type": "patchmergerv2",
            "mm_hidden_size": MM_HIDDEN,
            "projector_hidden_act": "gelu",
            "projector_ln_eps": 1e-5,
            "text_hidden_size": s.hidden,
        },
        "larder_synth": {"preset": s.preset, "seed": s.seed, "routing": s.routing},
    });
    if !s.knobs().is_uniform() {
        cfg["larder_synth"]["routing_knobs"] = json!(s.knobs());
    }
    cfg
}

/// The released `quantization_config` (docs/kimi_k3_reference.md §2.3):
/// every `Linear` targeted but attention, shared experts, dense MLPs, the LM
/// head and the vision tower; the stored tensors say which are packed (only
/// routed experts: the latent projections and residual projections ship bf16).
fn released_quantization() -> Value {
    json!({
        "config_groups": {
            "group_0": {
                "format": "mxfp4-pack-quantized",
                "input_activations": null,
                "output_activations": null,
                "targets": ["Linear"],
                "weights": {
                    "actorder": null,
                    "block_structure": null,
                    "dynamic": false,
                    "group_size": 32,
                    "num_bits": 4,
                    "observer": null,
                    "observer_kwargs": {},
                    "scale_dtype": "torch.uint8",
                    "strategy": "group",
                    "symmetric": true,
                    "type": "float",
                },
            },
        },
        "format": "mxfp4-pack-quantized",
        "ignore": [
            "re:.*self_attn.*",
            "re:.*shared_experts.*",
            "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
            "re:.*lm_head.*",
            "re:.*vision_tower.*",
            "re:.*mm_projector.*",
        ],
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
    })
}
