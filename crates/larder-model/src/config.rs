//! The architecture-independent description of a decoder model, and the
//! helpers each architecture uses to read its `config.json` with errors that
//! name the field.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::ModelError;
use crate::rope::RopeSpec;

/// Everything the shared decoder needs to build and run a model.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// `model_type` from config.json.
    pub model_type: String,
    pub hidden_size: usize,
    pub vocab_size: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub rope: RopeSpec,
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry biases.
    pub qkv_bias: bool,
    /// o projection carries a bias.
    pub o_bias: bool,
    /// Per-head RMSNorm of q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    pub layers: Vec<LayerSpec>,
    /// Tensor naming of the MoE block.
    pub moe_names: MoeNames,
    /// fp8 checkpoints (`quantization_config.quant_method: fp8`): the
    /// `weight_block_size` of their `*.weight_scale_inv` scales.
    pub fp8_block: Option<(usize, usize)>,
    /// compressed-tensors checkpoints (`quantization_config.quant_method:
    /// compressed-tensors`): which linear modules ship 4-bit packed, and how.
    pub compressed: Option<crate::quant::CompressedTensors>,
    /// gpt-oss checkpoints (`quantization_config.quant_method: mxfp4`):
    /// which layers' fused experts ship MXFP4 (`*_blocks` + `*_scales`).
    pub mxfp4_experts: Option<crate::quant::Mxfp4Experts>,
    /// Block attention residuals (Kimi Linear's K3 extension
    /// `n_layers_per_attn_res_block`, `attn_residual.rs`): the number of
    /// layers per block; `None` (every other architecture) for plain residuals.
    pub attn_res_block: Option<usize>,
    /// Per-head learned attention sinks (gpt-oss, `self_attn.sinks`
    /// `[num_heads]`): one extra logit per head in every softmax denominator.
    pub attention_sinks: bool,
    /// What MLA layers cache per position (not read from config.json: a
    /// choice of the caller, [`MlaCache::Compact`] unless set before
    /// [`DecoderModel::load`](crate::DecoderModel::load)).
    pub mla_cache: MlaCache,
}

/// What an MLA layer keeps per cached position.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MlaCache {
    /// The RMS-normed latent (`kv_lora_rank` floats) and the shared rope key
    /// (`qk_rope_head_dim`, post-RoPE): `kv_b_proj` is absorbed into the
    /// queries and the output (DeepSeek's `attn_impl="absorb"`).
    #[default]
    Compact,
    /// Every head's key (`nope + rope`) and value (`v_head_dim`), as
    /// transformers computes them (for comparison).
    Expanded,
}

impl MlaCache {
    /// Floats per position of one MLA layer: (key, value).
    pub fn dims(self, m: &MlaSpec, num_heads: usize) -> (usize, usize) {
        match self {
            MlaCache::Compact => (m.kv_lora_rank + m.qk_rope_head_dim, 0),
            MlaCache::Expanded => (num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim), num_heads * m.v_head_dim),
        }
    }
}

impl ModelSpec {
    /// KV-cache bytes each further position adds, summed over the layers,
    /// with MLA layers caching as `mla_cache` says (f32 keys and values;
    /// recurrent layers add none). Equals
    /// [`DecoderModel::kv_bytes_per_token`](crate::DecoderModel::kv_bytes_per_token)
    /// of a model loaded with that choice.
    pub fn kv_bytes_per_token(&self, mla_cache: MlaCache) -> usize {
        let floats: usize = self
            .layers
            .iter()
            .map(|l| match &l.mixer {
                MixerSpec::Gqa => 2 * self.num_kv_heads * self.head_dim,
                MixerSpec::Mla(m) => {
                    let (k, v) = mla_cache.dims(m, self.num_heads);
                    k + v
                }
                MixerSpec::Kda(_) => 0,
            })
            .sum();
        floats * 4
    }
}

/// The token mixer of one layer (what it computes and the state it keeps).
#[derive(Debug, Clone, PartialEq)]
pub enum MixerSpec {
    /// q/k/v/o projections, `num_kv_heads` shared key/value heads of
    /// `head_dim` (the [`ModelSpec`]'s attention fields); keys and values cached.
    Gqa,
    /// Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2, Kimi Linear's
    /// full-attention layers); keys and values cached.
    Mla(MlaSpec),
    /// Kimi Delta Attention (Kimi Linear's linear-attention layers): a
    /// fixed-size recurrent state per sequence.
    Kda(KdaSpec),
}

/// Multi-head latent attention dimensions.
#[derive(Debug, Clone, PartialEq)]
pub struct MlaSpec {
    /// Low-rank query (`q_a_proj`, `q_a_layernorm`, `q_b_proj`); `None`: one `q_proj`.
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    /// RoPE on interleaved pairs (DeepSeek's layout).
    pub rope_interleave: bool,
    /// Softmax scale: `qk_head_dim^-0.5`, times YaRN's `mscale(factor, mscale_all_dim)^2`.
    pub softmax_scale: f32,
    /// RoPE on the rope parts of q and k; `false`: they enter the dot product
    /// unrotated (Kimi Linear, `mla_use_nope`).
    pub rotary: bool,
    /// Epsilon of the latent RMSNorms (`q_a_layernorm`, `kv_a_layernorm`).
    pub latent_norm_eps: f32,
    /// A head-wise output gate (K3 extension, transformers 5.24.0
    /// bailing_hybrid's MLA): each head's attention output times
    /// `sigmoid(g_proj x)[head]` before `o_proj`, `g_proj` `[heads, hidden]`.
    pub output_gate: bool,
}

/// Kimi Delta Attention dimensions (`linear_attn_config`).
#[derive(Debug, Clone, PartialEq)]
pub struct KdaSpec {
    /// Heads H (`num_heads`).
    pub num_heads: usize,
    /// Key = value dim D per head (`head_dim`), also the rank of `f_a`/`g_a`.
    pub head_dim: usize,
    /// Taps K of the causal depthwise convolutions (`short_conv_kernel_size`).
    pub conv_kernel: usize,
    /// The lower-bounded forget gate's bound (K3 extension, transformers
    /// 5.24.0 glm5_next's `gate_lower_bound`): `g = bound ·
    /// sigmoid(exp(A_log) · u)`; `None`: kimi_linear's `-exp(A_log) · softplus(u)`.
    pub gate_lower_bound: Option<f32>,
    /// How the output norm's gate is projected from the layer input.
    pub output_gate: KdaOutputGate,
}

/// The projection of a KDA layer's output-norm gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KdaOutputGate {
    /// Kimi Linear's low rank: `g_b_proj(g_a_proj x)`, `[H·D, D]·[D, hidden]`.
    LowRank,
    /// One full-rank `g_proj` `[H·D, hidden]` (K3 extension, transformers
    /// 5.24.0 bailing_hybrid's `BailingHybridDeltaAttention.g_proj`).
    FullRank,
}

/// One decoder layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerSpec {
    /// The token mixer (attention or linear attention).
    pub mixer: MixerSpec,
    /// Attention layers: attend only to the last `n` positions (None: full causal attention).
    pub sliding_window: Option<usize>,
    pub ffn: FfnSpec,
}

/// The feed-forward part of a layer.
#[derive(Debug, Clone, PartialEq)]
pub enum FfnSpec {
    /// A SwiGLU MLP with this intermediate size.
    Dense { intermediate: usize },
    /// A routed mixture of SwiGLU experts.
    Moe(MoeSpec),
}

/// A routed MoE block.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeSpec {
    pub num_experts: usize,
    pub top_k: usize,
    /// Renormalise the top-k weights to sum to one.
    pub renormalize: bool,
    pub expert_intermediate: usize,
    /// Latent-space experts (Kimi Linear K3, NemotronH's `moe_latent_size`):
    /// the routed experts' input and output width. The router and the shared
    /// expert still see the full hidden state; the chosen rows go through
    /// `{block}.fc1_latent_proj` (`[latent, hidden]`), the experts' weighted
    /// sum through `{block}.fc2_latent_proj` (`[hidden, latent]`). `None`:
    /// experts are `hidden_size` wide.
    pub latent: Option<usize>,
    /// An always-applied shared expert.
    pub shared_expert: Option<SharedExpertSpec>,
    /// How router logits become expert choices and weights.
    pub scoring: Scoring,
    /// How the routed experts are stored and what they compute.
    pub experts: ExpertKind,
}

/// The routed experts' tensors and computation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExpertKind {
    /// One gate, up and down tensor per expert
    /// (`{block}.experts.{e}.{expert_proj}.weight`), no biases, `silu(gate) * up`.
    Swiglu,
    /// gpt-oss: per MoE layer fused `{block}.experts.gate_up_proj` `[E, H, 2I]`
    /// (input-major, output columns interleaved gate/up), `gate_up_proj_bias`
    /// `[E, 2I]`, `down_proj` `[E, I, H]`, `down_proj_bias` `[E, H]`; expert
    /// `e` is slice `[e]` of each; the clamped activation
    /// ([`GluActivation::GptOss`](larder_tensor::expert::GluActivation)).
    GptOss { alpha: f32, limit: f32 },
}

impl MoeSpec {
    /// The routed experts' input and output width: the latent size, else `hidden`.
    pub fn expert_width(&self, hidden: usize) -> usize {
        self.latent.unwrap_or(hidden)
    }
}

/// The routing function of a MoE block.
#[derive(Debug, Clone, PartialEq)]
pub enum Scoring {
    /// Softmax over all experts, top-k (`renormalize`: `norm_topk_prob`).
    Softmax,
    /// DeepSeek-V3: sigmoid, selection-only correction bias
    /// (`{router}.e_score_correction_bias`), group-limited top-k, scaled weights.
    SigmoidGroups { n_group: usize, topk_group: usize, scaling: f32 },
    /// gpt-oss: the router has a bias (`{router}.bias`); top-k over the
    /// biased logits, softmax over the k chosen.
    TopKSoftmax,
}

/// The shared expert of a MoE block.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedExpertSpec {
    pub intermediate: usize,
    /// Scaled by `sigmoid(shared_expert_gate(x))` (Qwen2-MoE).
    pub sigmoid_gate: bool,
}

/// How an architecture names its MoE tensors, relative to `model.layers.{L}.`.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeNames {
    /// The block's module name (`mlp`, `block_sparse_moe`).
    pub block: &'static str,
    /// Router weight module under the block (`gate`).
    pub router: &'static str,
    /// Per-expert projection names: gate, up, down.
    pub expert_proj: [&'static str; 3],
    /// Shared expert module under the block (`shared_expert`).
    pub shared_expert: &'static str,
    /// Shared expert gate module under the block (`shared_expert_gate`).
    pub shared_expert_gate: &'static str,
}

impl MoeNames {
    /// The Qwen / DeepSeek naming (`mlp.experts.E.gate_proj`).
    pub const QWEN: MoeNames = MoeNames {
        block: "mlp",
        router: "gate",
        expert_proj: ["gate_proj", "up_proj", "down_proj"],
        shared_expert: "shared_expert",
        shared_expert_gate: "shared_expert_gate",
    };

    /// DeepSeek-V3 / Kimi-K2 (`mlp.shared_experts`, ungated).
    pub const DEEPSEEK: MoeNames = MoeNames {
        block: "mlp",
        router: "gate",
        expert_proj: ["gate_proj", "up_proj", "down_proj"],
        shared_expert: "shared_experts",
        shared_expert_gate: "shared_expert_gate",
    };
}

/// The largest integer any config.json field may hold: far above every real
/// size, count or id, and small enough that products of a few never overflow
/// (found by `fuzz/`'s `config` target: `num_hidden_layers: 2^62` aborted).
pub const MAX_CONFIG_INT: u64 = 1 << 31;

/// The most decoder layers a model may have.
pub const MAX_LAYERS: usize = 4096;

/// The most elements one tensor a config.json implies may have (2^48: 512
/// TiB at bf16), counting derived sizes such as `num_heads x head_dim`. The
/// largest tensors released checkpoints ship are near 2^31 (gpt-oss-120b's
/// fused experts `[128, 2880, 5760]`, DeepSeek-V3's embedding
/// `[129280, 7168]`), so this refuses only the absurd (`doctor` still
/// estimates a 128 TiB embedding, to say it does not fit); it keeps every
/// element and byte count of a model within a u64, the KV-cache bytes per
/// token of 4096 layers included (at most 2^63). Checked by `read_spec`
/// (`spec_limits`).
pub const MAX_TENSOR_ELEMENTS: u64 = 1 << 48;

/// The widest attention head (`head_dim`, MLA's per-head dims, KDA's
/// `head_dim`) a config.json may declare: 2^16, 256 times the widest head of
/// any released model (256). Per-head buffers (the RoPE frequencies, a
/// query's scratch rows) are sized by it without a tensor to check it
/// against (Kimi Linear's unused RoPE table).
pub const MAX_HEAD_DIM: usize = 1 << 16;

/// A parsed config.json with the path kept for error messages.
pub struct ConfigJson {
    pub path: PathBuf,
    pub value: Value,
}

impl ConfigJson {
    /// Reads `dir/config.json`.
    pub fn read(dir: &Path) -> Result<Self, ModelError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io {
            path: path.clone(),
            source,
        })?;
        let value: Value = serde_json::from_str(&text).map_err(|e| ModelError::Json {
            path: path.clone(),
            message: e.to_string(),
        })?;
        if !value.is_object() {
            return Err(ModelError::Json {
                path,
                message: "top level is not an object".into(),
            });
        }
        Ok(ConfigJson { path, value })
    }

    pub fn err(&self, field: &str, message: impl Into<String>) -> ModelError {
        ModelError::config(&self.path, field, message)
    }

    fn get(&self, field: &str) -> Option<&Value> {
        self.value.get(field).filter(|v| !v.is_null())
    }

    /// A required positive integer.
    pub fn usize(&self, field: &str) -> Result<usize, ModelError> {
        match self.opt_usize(field)? {
            Some(0) => Err(self.err(field, "must be positive")),
            Some(v) => Ok(v),
            None => Err(self.err(field, "missing")),
        }
    }

    /// An optional non-negative integer.
    pub fn opt_usize(&self, field: &str) -> Result<Option<usize>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => self.bounded(field, v).map(Some),
        }
    }

    /// `v` as an integer in `0..=MAX_CONFIG_INT`.
    fn bounded(&self, field: &str, v: &Value) -> Result<usize, ModelError> {
        match v.as_u64() {
            Some(u) if u <= MAX_CONFIG_INT => Ok(u as usize),
            Some(u) => Err(self.err(field, format!("{u} is too large (at most {MAX_CONFIG_INT})"))),
            None => Err(self.err(field, format!("expected a non-negative integer, found {v}"))),
        }
    }

    /// `num_hidden_layers`, in `1..=MAX_LAYERS`.
    pub fn num_layers(&self) -> Result<usize, ModelError> {
        let n = self.usize("num_hidden_layers")?;
        if n > MAX_LAYERS {
            return Err(self.err("num_hidden_layers", format!("{n} is too large (at most {MAX_LAYERS})")));
        }
        Ok(n)
    }

    /// An optional number.
    pub fn opt_f64(&self, field: &str) -> Result<Option<f64>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a number, found {v}"))),
        }
    }

    /// An optional boolean.
    pub fn opt_bool(&self, field: &str) -> Result<Option<bool>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected true or false, found {v}"))),
        }
    }

    /// An optional string.
    pub fn opt_str(&self, field: &str) -> Result<Option<&str>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a string, found {v}"))),
        }
    }

    /// An optional list of non-negative integers.
    pub fn opt_usize_list(&self, field: &str) -> Result<Vec<usize>, ModelError> {
        match self.get(field) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items.iter().map(|v| self.bounded(field, v)).collect(),
            Some(v) => Err(self.err(field, format!("expected a list, found {v}"))),
        }
    }

    /// The raw value of a field (for nested objects like `rope_scaling`).
    pub fn raw(&self, field: &str) -> Option<&Value> {
        self.get(field)
    }

    /// `hidden_act` must be SiLU for the SwiGLU blocks larder implements.
    pub fn require_silu(&self) -> Result<(), ModelError> {
        let act = self.opt_str("hidden_act")?.unwrap_or("silu");
        if act != "silu" && act != "swish" {
            return Err(self.err("hidden_act", format!("{act:?} is not supported (only silu)")));
        }
        Ok(())
    }

    /// The attention geometry shared by every architecture:
    /// `(hidden, heads, kv_heads, head_dim)`, validated.
    pub fn attention_dims(&self) -> Result<(usize, usize, usize, usize), ModelError> {
        let hidden = self.usize("hidden_size")?;
        let heads = self.usize("num_attention_heads")?;
        let kv_heads = self.opt_usize("num_key_value_heads")?.unwrap_or(heads);
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(self.err(
                "num_key_value_heads",
                format!("{kv_heads} must be positive and divide num_attention_heads ({heads})"),
            ));
        }
        let head_dim = match self.opt_usize("head_dim")? {
            Some(d) => d,
            None => {
                if hidden % heads != 0 {
                    return Err(self.err(
                        "num_attention_heads",
                        format!("{heads} does not divide hidden_size ({hidden}) and head_dim is not given"),
                    ));
                }
                hidden / heads
            }
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(self.err("head_dim", format!("{head_dim} must be positive and even (RoPE rotates pairs)")));
        }
        Ok((hidden, heads, kv_heads, head_dim))
    }

    /// `rms_norm_eps` (default 1e-6), validated.
    pub fn rms_norm_eps(&self) -> Result<f32, ModelError> {
        let eps = self.opt_f64("rms_norm_eps")?.unwrap_or(1e-6);
        if !(eps > 0.0 && eps < 1.0) {
            return Err(self.err("rms_norm_eps", format!("{eps} out of range (0, 1)")));
        }
        Ok(eps as f32)
    }
}

/// The MoE top-k settings every softmax-routed architecture shares, validated.
pub fn check_top_k(cfg: &ConfigJson, num_experts: usize, top_k: usize) -> Result<(), ModelError> {
    if top_k == 0 || top_k > num_experts {
        return Err(cfg.err(
            "num_experts_per_tok",
            format!("{top_k} must be between 1 and the number of experts ({num_experts})"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use serde_json::Value;

    /// The tiny Qwen3-MoE fixture's config with `field` set to `value`, in a fresh folder.
    fn patched(name: &str, field: &str, value: Value) -> PathBuf {
        let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen3_moe_tiny/config.json");
        let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
        cfg[field] = value;
        let dir = std::env::temp_dir().join(format!("larder-config-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
        dir
    }

    #[test]
    fn absurd_sizes_are_errors_not_aborts() {
        // Found by fuzz/ (config target): 2^62 layers was a capacity-overflow panic.
        for (field, value) in [
            ("num_hidden_layers", 1u64 << 62),
            ("num_hidden_layers", 5000),
            ("hidden_size", 1 << 40),
            ("num_experts", u64::MAX),
        ] {
            let dir = patched(field, field, value.into());
            let err = crate::arch::read_spec(&dir).unwrap_err().to_string();
            assert!(err.contains(field) && err.contains("too large"), "{field}={value}: {err}");
            std::fs::remove_dir_all(dir).unwrap();
        }
        let dir = patched("ok", "num_hidden_layers", 3.into());
        assert_eq!(crate::arch::read_spec(&dir).unwrap().layers.len(), 3);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
