//! A model's byte sizes from the tensors its own loader reads: running
//! [`DecoderModel::load`] against a [`Recorder`] lists every tensor with
//! its shipped name, its shape, the dtypes it may ship in and, for a routed
//! expert, its [`ExpertTag`](larder_model::ExpertTag). A tensor's bytes are
//! its element count times its dtype's size; routed-expert tensors make the
//! bank, every other tensor the spine. Nothing here knows an
//! architecture's tensors: a tensor added to a loader is sized with no
//! change here.
//!
//! A float tensor may ship in F32, F16 or BF16 (the checkpoint's choice):
//! from a checkpoint its stored dtype counts ([`Floats::Stored`]); from a
//! config.json alone, `torch_dtype` ([`Floats::Config`],
//! [`config_float_dtype`]). fp8 and packed parts have exact dtypes (INT4's
//! group scales, a float, follow the same rule; its `weight_shape` counts
//! as I32).
//!
//! Recording a Kimi K3-scale config.json (93 layers, 896 experts: a
//! quarter of a million expert weights) takes about 1.4 s and 281 MB at
//! peak (dev profile; every answer is a placeholder over one shared zero
//! mapping, so the cost is the list of tensors, not their bytes).

use larder_model::checkpoint::Checkpoint;
use larder_model::{DecoderModel, ModelError, ModelSpec, RecordedTensor, Recorder};

use crate::error::EngineError;
use crate::plan::{ModelSizes, PlanError};

/// The most routed experts (over all layers) [`estimate_sizes`] records:
/// recording costs about 3.4 KB and 17 µs per expert (a K3-scale config,
/// 82,432 experts: 1.4 s and 281 MB at peak, dev profile), so this is
/// about 1.8 GB and 9 s, six times the largest model larder knows; a
/// config.json asking for more is refused, not recorded.
pub(crate) const MAX_ESTIMATED_EXPERTS: u64 = 1 << 19;

/// The dtype a float tensor is counted in.
#[derive(Clone, Copy)]
pub(crate) enum Floats<'a> {
    /// The safetensors dtype config.json declares (`BF16`, `F16` or `F32`;
    /// see [`config_float_dtype`]): sizes estimated.
    Config(&'static str),
    /// Each tensor's bytes as the checkpoint stores it.
    Stored(&'a Checkpoint),
}

/// The safetensors dtype of config.json's `torch_dtype` / `dtype` (default
/// bfloat16); fp8 and packed weights are the spec's business.
pub fn config_float_dtype(dtype: Option<&str>) -> Result<&'static str, PlanError> {
    Ok(match dtype.unwrap_or("bfloat16") {
        "bfloat16" | "bf16" => "BF16",
        "float16" | "fp16" | "half" => "F16",
        "float32" | "fp32" | "float" => "F32",
        other => return Err(PlanError::UnknownDType { dtype: other.to_string() }),
    })
}

/// Sizes of `spec` estimated from its config.json alone (`exact: false`):
/// every tensor its loader reads, with the optional ones a checkpoint made
/// from the config ships ([`Recorder::for_config`]), floats at `float_dtype`.
pub fn estimate_sizes(spec: &ModelSpec, float_dtype: &'static str) -> Result<ModelSizes, EngineError> {
    let experts: u64 = larder_model::expert_layers(spec).iter().map(|&(_, n)| n as u64).sum();
    if experts > MAX_ESTIMATED_EXPERTS {
        return Err(EngineError::Invalid {
            field: "config.json",
            message: format!(
                "{experts} routed experts in all are more than larder sizes from a config.json alone \
                 ({MAX_ESTIMATED_EXPERTS}); size the model from its checkpoint"
            ),
        });
    }
    let recorder = Recorder::for_config();
    DecoderModel::load(spec.clone(), &recorder, None)?;
    recorded_sizes(spec, &recorder.into_tensors(), Floats::Config(float_dtype))
}

/// Sizes of the tensors `spec`'s loader reads from checkpoint `ckpt`, at
/// their stored dtypes and shapes (`exact: true`). A checkpoint's headers
/// may also hold tensors no loader reads (multi-token-prediction layers),
/// which `pack` keeps in the spine: `larder doctor` sizes a checkpoint from
/// its headers ([`crate::sizing`]); this is what its loader accounts for.
pub fn checkpoint_recorded_sizes(spec: &ModelSpec, ckpt: &Checkpoint) -> Result<ModelSizes, EngineError> {
    let recorder = Recorder::for_checkpoint(ckpt)?;
    DecoderModel::load(spec.clone(), &recorder, None)?;
    recorded_sizes(spec, &recorder.into_tensors(), Floats::Stored(ckpt))
}

/// Sizes of recorded `tensors` of `spec`: routed-expert tensors (tagged)
/// are the bank, the rest the spine; floats counted as `floats` says.
pub(crate) fn recorded_sizes(spec: &ModelSpec, tensors: &[RecordedTensor], floats: Floats<'_>) -> Result<ModelSizes, EngineError> {
    let (mut spine, mut bank) = (0u64, 0u64);
    for t in tensors {
        let bytes = tensor_bytes(t, floats)?;
        let sum = if t.expert.is_some() { &mut bank } else { &mut spine };
        *sum = sum.saturating_add(bytes);
    }
    let sizes = ModelSizes::exact(spec, spine, bank);
    Ok(ModelSizes {
        exact: matches!(floats, Floats::Stored(_)),
        ..sizes
    })
}

/// Bytes of recorded tensor `t`: its stored bytes, or its first accepted
/// shape at its one dtype (a choice of dtypes: the config's float dtype
/// when among them, else the first).
fn tensor_bytes(t: &RecordedTensor, floats: Floats<'_>) -> Result<u64, EngineError> {
    let float = match floats {
        Floats::Stored(ckpt) => return Ok(ckpt.tensor_info(&t.name)?.len),
        Floats::Config(dtype) => dtype,
    };
    let bad = |m: String| EngineError::Model(ModelError::Source(format!("recorded tensor `{}`: {m}", t.name)));
    let dtype = match t.dtypes.contains(&float) {
        true => float,
        false => *t.dtypes.first().ok_or_else(|| bad("no dtype".to_string()))?,
    };
    let size = dtype_bytes(dtype).ok_or_else(|| bad(format!("unknown dtype {dtype}")))?;
    let shape = t.shapes.first().ok_or_else(|| bad("no shape".to_string()))?;
    Ok(shape.iter().fold(size, |n, &d| n.saturating_mul(d as u64)))
}

/// Bytes per element of a safetensors dtype.
fn dtype_bytes(dtype: &str) -> Option<u64> {
    match dtype {
        "U8" | "I8" | "F8_E4M3" => Some(1),
        "BF16" | "F16" => Some(2),
        "F32" | "I32" => Some(4),
        "I64" => Some(8),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
    }

    fn bf16_estimate(dir: &Path) -> ModelSizes {
        let spec = larder_model::arch::read_spec(dir).unwrap();
        estimate_sizes(&spec, "BF16").unwrap()
    }

    /// Every tensor's bytes of fixture `name`: (routed experts, the rest).
    fn fixture_bytes(name: &str, is_expert: impl Fn(&str) -> bool) -> (u64, u64) {
        let ckpt = Checkpoint::open(&fixture(name)).unwrap();
        let (mut bank, mut spine) = (0, 0);
        for n in ckpt.names() {
            let len = ckpt.tensor_info(n).unwrap().len;
            *(if is_expert(n) { &mut bank } else { &mut spine }) += len;
        }
        (bank, spine)
    }

    #[test]
    fn config_float_dtypes() {
        assert_eq!(config_float_dtype(None).unwrap(), "BF16");
        assert_eq!(config_float_dtype(Some("float16")).unwrap(), "F16");
        assert_eq!(config_float_dtype(Some("float32")).unwrap(), "F32");
        let e = config_float_dtype(Some("int3")).unwrap_err();
        assert!(e.to_string().contains("\"int3\""), "{e}");
    }

    #[test]
    fn estimate_matches_the_bf16_fixture_exactly() {
        let dir = fixture("qwen3_moe_tiny");
        let s = bf16_estimate(&dir);
        assert_eq!((s.layers, s.moe_layers, s.experts_per_layer, s.top_k), (4, 3, 8, 2));
        // From the fixture's safetensors header: every BF16 tensor, experts apart.
        assert_eq!((s.expert_bytes, s.bank_bytes, s.spine_bytes), (12288, 294912, 283008));
        assert!(!s.exact);
        // At f32 every tensor doubles.
        let spec = larder_model::arch::read_spec(&dir).unwrap();
        let f32 = estimate_sizes(&spec, "F32").unwrap();
        assert_eq!((f32.bank_bytes, f32.spine_bytes), (2 * 294912, 2 * 283008));
    }

    /// KDA heads of `spec`'s first KDA layer (0 without).
    fn kda_heads(spec: &ModelSpec) -> usize {
        spec.layers
            .iter()
            .find_map(|l| match &l.mixer {
                larder_model::config::MixerSpec::Kda(k) => Some(k.num_heads),
                _ => None,
            })
            .unwrap_or(0)
    }

    /// Every fixture's tensors as its loader reads them, at their stored
    /// dtypes, are exactly its safetensors headers, experts apart (as
    /// streaming indexes them); from config.json alone, the headers with
    /// every float tensor counted at `torch_dtype` (some fixtures ship a few
    /// in another: Kimi's f32 `A_log`, `dt_bias`, short-conv weights and
    /// router).
    #[test]
    fn recorded_sizes_equal_every_fixtures_headers() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
        let mut checked = 0;
        for entry in std::fs::read_dir(&root).unwrap() {
            let dir = entry.unwrap().path();
            if !dir.join("reference.json").exists() || !dir.join("config.json").exists() {
                continue;
            }
            let spec = larder_model::arch::read_spec(&dir).unwrap();
            let ckpt = Checkpoint::open(&dir).unwrap();
            let bank = crate::experts::direct_index(&spec, &ckpt).unwrap().total_bytes();
            let total: u64 = ckpt.names().into_iter().map(|n| ckpt.tensor_info(n).unwrap().len).sum();
            // Kimi K3 ships layer 0's mixer-input attention-residual site, which its model never reads.
            let unread: u64 = ckpt
                .names()
                .into_iter()
                .filter(|n| n.starts_with("model.layers.0.self_attention_res_"))
                .map(|n| ckpt.tensor_info(n).unwrap().len)
                .sum();
            let stored = checkpoint_recorded_sizes(&spec, &ckpt).unwrap();
            assert_eq!(
                (stored.bank_bytes, stored.spine_bytes),
                (bank, total - bank - unread),
                "{}",
                dir.display()
            );
            assert!(stored.exact);
            let cfg = larder_model::config::ConfigJson::read(&dir).unwrap();
            let dtype = config_float_dtype(cfg.opt_str("torch_dtype").unwrap().or(cfg.opt_str("dtype").unwrap())).unwrap();
            let (mut want_bank, mut want_spine) = (0, 0);
            for n in ckpt.names() {
                // The unread site again.
                if n.starts_with("model.layers.0.self_attention_res_") {
                    continue;
                }
                let info = ckpt.tensor_info(n).unwrap();
                // ... and pads `A_log` (read one value per head).
                let elements = match n.ends_with(".A_log") && info.shape.len() == 1 {
                    true => kda_heads(&spec),
                    false => info.shape.iter().product::<usize>(),
                };
                let len = match ["BF16", "F16", "F32"].contains(&info.dtype.as_str()) {
                    true => elements as u64 * dtype_bytes(dtype).unwrap(),
                    false => info.len,
                };
                *(if n.contains(".experts.") { &mut want_bank } else { &mut want_spine }) += len;
            }
            let estimate = estimate_sizes(&spec, dtype).unwrap();
            assert_eq!(
                (estimate.bank_bytes, estimate.spine_bytes),
                (want_bank, want_spine),
                "{}",
                dir.display()
            );
            checked += 1;
        }
        assert!(checked >= 15, "only {checked} fixtures");
    }

    #[test]
    fn too_many_experts_are_refused_before_recording() {
        let mut spec = larder_model::arch::read_spec(&fixture("qwen3_moe_tiny")).unwrap();
        for layer in &mut spec.layers {
            if let larder_model::FfnSpec::Moe(m) = &mut layer.ffn {
                m.num_experts = 1 << 30;
            }
        }
        let e = estimate_sizes(&spec, "BF16").unwrap_err().to_string();
        assert!(e.contains("3221225472 routed experts"), "{e}");
    }

    /// Block attention residuals: a norm `[hidden]` and a projection `[1,
    /// hidden]` per site (the MLP input of every layer, the mixer input of
    /// every layer but the first, the final norm's input), in the spine at
    /// the config's float dtype.
    #[test]
    fn attention_residual_sites_count_in_the_spine() {
        let spec = larder_model::arch::read_spec(&fixture("kimi_k3_tiny")).unwrap();
        let with = estimate_sizes(&spec, "BF16").unwrap().spine_bytes;
        let mut plain = spec.clone();
        plain.attn_res_block = None;
        // 7 layers, hidden 48: 6 + 7 + 1 sites of 2 x 48 values.
        assert_eq!(with - estimate_sizes(&plain, "BF16").unwrap().spine_bytes, 14 * 2 * 48 * 2);
    }

    /// Latent-space experts: experts are latent wide (MXFP4 as the scheme
    /// packs them), the projections around them are spine.
    #[test]
    fn latent_experts_are_latent_wide() {
        let s = bf16_estimate(&fixture("kimi_k3_tiny"));
        // 3 matrices of 32 x 32 in MXFP4: 16 code bytes and 1 scale per row.
        assert_eq!(s.expert_bytes, 3 * 32 * (16 + 1));
    }

    /// compressed-tensors 4-bit experts count at their packed size (codes,
    /// scales, INT4's weight_shape).
    #[test]
    fn compressed_tensors_4bit_experts_count_packed() {
        // hidden 64, expert intermediate 32: gate, up [32, 64], down [64, 32].
        for (name, expert) in [
            ("deepseek_v3_int4", 3 * (32 * 64 / 2 + 64 * 2 + 8)),
            ("deepseek_v3_mxfp4", 3 * (32 * 64 / 2 + 64)),
        ] {
            let s = bf16_estimate(&fixture(name));
            assert_eq!(s.expert_bytes, expert, "{name}");
            let (bank, spine) = fixture_bytes(name, |n| n.contains(".mlp.experts."));
            assert_eq!((s.bank_bytes, s.spine_bytes), (bank, spine), "{name}");
        }
    }

    /// gpt-oss: fused experts with biases (bf16, or MXFP4 blocks and
    /// scales) are the bank; router bias, attention biases and sinks spine.
    #[test]
    fn gpt_oss_fused_experts_are_the_bank() {
        let s = bf16_estimate(&fixture("gpt_oss_bf16"));
        // gate_up [64, 64] + down [32, 64] + biases 64 + 64, bf16.
        assert_eq!(s.expert_bytes, (3 * 32 * 64 + 64 + 64) * 2);
        let s = bf16_estimate(&fixture("gpt_oss_tiny"));
        // gate_up [128, 64] and down [64, 64] at 4 bits + a scale byte per 32, bf16 biases.
        assert_eq!(s.expert_bytes, 128 * 32 + 128 * 2 + 64 * 32 + 64 * 2 + (128 + 64) * 2);
        let experts = |n: &str| n.contains(".mlp.experts.");
        assert_eq!((s.bank_bytes, s.spine_bytes), fixture_bytes("gpt_oss_tiny", experts));
    }

    /// A Kimi K3-scale config.json alone (93 layers, 896 MXFP4 experts of
    /// 1536 x 7168, MLA every 4th layer, KDA the rest) sizes in seconds:
    /// the reference case of docs/routing.md (16.7 MiB experts, 1.32 TiB of
    /// experts, a 49.9 GiB spine).
    #[test]
    fn a_k3_scale_config_sizes_quickly() {
        let tiny = fixture("kimi_linear_tiny").join("config.json");
        let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(tiny).unwrap()).unwrap();
        let quant = std::fs::read_to_string(fixture("deepseek_v3_mxfp4").join("config.json")).unwrap();
        let quant: serde_json::Value = serde_json::from_str(&quant).unwrap();
        let full: Vec<usize> = (1..=93).filter(|l| l % 4 == 0).collect();
        let kda: Vec<usize> = (1..=93).filter(|l| l % 4 != 0).collect();
        let k3 = serde_json::json!({
            "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512, "num_hidden_layers": 93,
            "moe_intermediate_size": 1536, "num_attention_heads": 64, "num_key_value_heads": 64,
            "num_experts": 896, "num_experts_per_token": 16, "num_expert_group": 1, "topk_group": 1,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 163840,
            "model_max_length": 131072, "quantization_config": quant["quantization_config"],
            "linear_attn_config": {"full_attn_layers": full, "kda_layers": kda, "head_dim": 128,
                                   "num_heads": 64, "short_conv_kernel_size": 4},
        });
        for (k, v) in k3.as_object().unwrap() {
            cfg[k] = v.clone();
        }
        let tmp = std::env::temp_dir().join(format!("larder-k3-sizes-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        std::fs::write(tmp.join("config.json"), cfg.to_string()).unwrap();
        let spec = larder_model::arch::read_spec(&tmp);
        let _ = std::fs::remove_dir_all(&tmp);
        let spec = spec.unwrap();
        let start = std::time::Instant::now();
        let s = estimate_sizes(&spec, "BF16").unwrap();
        let took = start.elapsed();
        assert_eq!((s.layers, s.moe_layers, s.experts_per_layer, s.top_k), (93, 92, 896, 16));
        // gate, up [1536, 7168] and down [7168, 1536]: 4-bit codes + an e8m0 byte per 32.
        assert_eq!(s.expert_bytes, 3 * 1536 * 7168 / 32 * 17);
        assert_eq!(s.bank_bytes, 92 * 896 * s.expert_bytes);
        assert_eq!(s.spine_bytes, 53_594_140_928);
        assert!(took.as_secs() < 30, "sizing took {took:?}");
    }
}
