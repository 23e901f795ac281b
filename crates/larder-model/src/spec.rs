//! The architecture-independent description of a decoder model
//! ([`ModelSpec`] and the per-layer specs it holds): what every architecture
//! file under `arch/` produces from its config.json and what the shared
//! decoder builds and runs.
//!
//! Every spec struct has defaults (`Default`, or a constructor taking only
//! what has no sensible default), so an architecture file states only what
//! it changes (`ModelSpec { qk_norm: true, ..ModelSpec::default() }`) and a
//! new field touches this file and the architecture that sets it
//! (docs/design.md §6). The structs are `#[non_exhaustive]`: other crates
//! read and adjust a spec read from config.json, or start from the defaults,
//! but never build one field by field.

use larder_tensor::GluActivation;

use crate::quant::{CompressedTensors, Mxfp4Experts};
use crate::rope::RopeSpec;

/// Epsilon of MLA's latent RMSNorms (transformers' RMSNorm default, not
/// `rms_norm_eps`, in DeepSeek-V3, Kimi-K2 and Kimi Linear alike): the
/// default of [`MlaSpec::latent_norm_eps`].
pub const LATENT_NORM_EPS: f32 = 1e-6;

/// Everything the shared decoder needs to build and run a model.
#[derive(Debug, Clone)]
#[non_exhaustive]
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
    pub compressed: Option<CompressedTensors>,
    /// gpt-oss checkpoints (`quantization_config.quant_method: mxfp4`):
    /// which layers' fused experts ship MXFP4 (`*_blocks` + `*_scales`).
    pub mxfp4_experts: Option<Mxfp4Experts>,
    /// Block attention residuals (Kimi K3's `attn_res_block_size`,
    /// `attn_residual.rs`): the number of layers per block; `None` (every
    /// other architecture) for plain residuals.
    pub attn_res_block: Option<usize>,
    /// How every gated feed-forward unit (dense MLPs, shared and routed
    /// SwiGLU experts) combines its gate and up projections: `silu(gate) ·
    /// up` everywhere but Kimi K3 (SiTU). gpt-oss's fused experts carry
    /// their own ([`ExpertKind::GptOss`]).
    pub ffn_activation: GluActivation,
    /// The text model of a multimodal wrapper (Kimi K3's
    /// `language_model.model.` / `language_model.lm_head` tensors, beside a
    /// vision tower larder never reads): the checkpoint must ship that way.
    pub wrapped_text_model: bool,
    /// Where the text model's fields sit in config.json (`text_config.` for
    /// Kimi K3, else empty): errors found while loading weights name them so.
    pub config_prefix: &'static str,
    /// Per-head learned attention sinks (gpt-oss, `self_attn.sinks`
    /// `[num_heads]`): one extra logit per head in every softmax denominator.
    pub attention_sinks: bool,
    /// What MLA layers cache per position (not read from config.json: a
    /// choice of the caller, [`MlaCache::Compact`] unless set before
    /// [`DecoderModel::load`](crate::DecoderModel::load)).
    pub mla_cache: MlaCache,
}

impl Default for ModelSpec {
    /// No layers, zero sizes, and every option off: plain GQA without
    /// biases or q/k norms, RoPE theta 10000 unscaled, `rms_norm_eps` 1e-6,
    /// Qwen's MoE tensor names, weights as shipped without quantization,
    /// plain residuals, no sinks, the compact MLA cache.
    fn default() -> Self {
        ModelSpec {
            model_type: String::new(),
            hidden_size: 0,
            vocab_size: 0,
            num_heads: 0,
            num_kv_heads: 0,
            head_dim: 0,
            rms_norm_eps: 1e-6,
            max_position_embeddings: 0,
            rope: RopeSpec::default(),
            tie_word_embeddings: false,
            qkv_bias: false,
            o_bias: false,
            qk_norm: false,
            layers: Vec::new(),
            moe_names: MoeNames::default(),
            fp8_block: None,
            compressed: None,
            mxfp4_experts: None,
            attn_res_block: None,
            ffn_activation: GluActivation::Silu,
            wrapped_text_model: false,
            config_prefix: "",
            attention_sinks: false,
            mla_cache: MlaCache::default(),
        }
    }
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
#[non_exhaustive]
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
    /// Kimi K3's output gate (`mla_use_output_gate`): the attention output
    /// times `sigmoid(g_proj x)` element-wise before `o_proj`, `g_proj`
    /// `[heads · v_head_dim, hidden]`, `x` the layer's normed attention input.
    pub output_gate: bool,
}

impl MlaSpec {
    /// MLA of these widths with everything else plain: one `q_proj`, RoPE on
    /// non-interleaved pairs, softmax scale `(nope + rope)^-0.5` (no YaRN
    /// mscale), latent norms at [`LATENT_NORM_EPS`], no output gate.
    pub fn new(kv_lora_rank: usize, qk_nope_head_dim: usize, qk_rope_head_dim: usize, v_head_dim: usize) -> Self {
        MlaSpec {
            q_lora_rank: None,
            kv_lora_rank,
            qk_nope_head_dim,
            qk_rope_head_dim,
            v_head_dim,
            rope_interleave: false,
            softmax_scale: ((qk_nope_head_dim + qk_rope_head_dim) as f64).powf(-0.5) as f32,
            rotary: true,
            latent_norm_eps: LATENT_NORM_EPS,
            output_gate: false,
        }
    }
}

/// Kimi Delta Attention dimensions (`linear_attn_config`).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
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

impl KdaSpec {
    /// Kimi Linear's KDA of these sizes: the unbounded forget gate, the
    /// low-rank output gate.
    pub fn new(num_heads: usize, head_dim: usize, conv_kernel: usize) -> Self {
        KdaSpec {
            num_heads,
            head_dim,
            conv_kernel,
            gate_lower_bound: None,
            output_gate: KdaOutputGate::default(),
        }
    }
}

/// The projection of a KDA layer's output-norm gate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum KdaOutputGate {
    /// Kimi Linear's low rank: `g_b_proj(g_a_proj x)`, `[H·D, D]·[D, hidden]`.
    #[default]
    LowRank,
    /// One full-rank `g_proj` `[H·D, hidden]` (K3 extension, transformers
    /// 5.24.0 bailing_hybrid's `BailingHybridDeltaAttention.g_proj`).
    FullRank,
}

/// One decoder layer.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LayerSpec {
    /// The token mixer (attention or linear attention).
    pub mixer: MixerSpec,
    /// Attention layers: attend only to the last `n` positions (None: full causal attention).
    pub sliding_window: Option<usize>,
    pub ffn: FfnSpec,
}

impl LayerSpec {
    /// A layer mixing with `mixer` and feeding forward through `ffn`, with
    /// full causal attention (no sliding window).
    pub fn new(mixer: MixerSpec, ffn: FfnSpec) -> Self {
        LayerSpec {
            mixer,
            sliding_window: None,
            ffn,
        }
    }
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
#[non_exhaustive]
pub struct MoeSpec {
    pub num_experts: usize,
    pub top_k: usize,
    /// Renormalise the top-k weights to sum to one.
    pub renormalize: bool,
    pub expert_intermediate: usize,
    /// Latent-space experts (Kimi K3's `routed_expert_hidden_size`): the
    /// router and the shared experts still see the full hidden state; the
    /// routed experts run on `{block}.routed_expert_down_proj · x`, their
    /// weighted sum goes (through `routed_expert_norm` when it has one) to
    /// `{block}.routed_expert_up_proj`. `None`: experts are `hidden_size` wide.
    pub latent: Option<LatentSpec>,
    /// An always-applied shared expert.
    pub shared_expert: Option<SharedExpertSpec>,
    /// How router logits become expert choices and weights.
    pub scoring: Scoring,
    /// How the routed experts are stored and what they compute.
    pub experts: ExpertKind,
}

impl MoeSpec {
    /// `num_experts` SwiGLU experts of `expert_intermediate`, `top_k` per
    /// token, with everything else plain: softmax routing without
    /// renormalisation, experts at `hidden_size`, no shared expert.
    pub fn new(num_experts: usize, top_k: usize, expert_intermediate: usize) -> Self {
        MoeSpec {
            num_experts,
            top_k,
            renormalize: false,
            expert_intermediate,
            latent: None,
            shared_expert: None,
            scoring: Scoring::default(),
            experts: ExpertKind::default(),
        }
    }

    /// The routed experts' input and output width: the latent size, else `hidden`.
    pub fn expert_width(&self, hidden: usize) -> usize {
        self.latent.map_or(hidden, |l| l.width)
    }
}

/// Kimi K3's latent-space experts.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct LatentSpec {
    /// The experts' input and output width (`routed_expert_hidden_size`).
    pub width: usize,
    /// RMSNorm (`{block}.routed_expert_norm.weight` `[width]`, eps
    /// `rms_norm_eps`) of the weighted sum before `routed_expert_up_proj`
    /// (`latent_moe_use_norm`).
    pub norm: bool,
}

impl LatentSpec {
    /// Latent experts `width` wide, with or without the norm of their sum.
    pub fn new(width: usize, norm: bool) -> Self {
        LatentSpec { width, norm }
    }
}

/// The routed experts' tensors and computation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum ExpertKind {
    /// One gate, up and down tensor per expert
    /// (`{block}.experts.{e}.{expert_proj}.weight`), no biases, `silu(gate) * up`.
    #[default]
    Swiglu,
    /// gpt-oss: per MoE layer fused `{block}.experts.gate_up_proj` `[E, H, 2I]`
    /// (input-major, output columns interleaved gate/up), `gate_up_proj_bias`
    /// `[E, 2I]`, `down_proj` `[E, I, H]`, `down_proj_bias` `[E, H]`; expert
    /// `e` is slice `[e]` of each; the clamped activation
    /// ([`GluActivation::GptOss`](larder_tensor::GluActivation)).
    GptOss { alpha: f32, limit: f32 },
}

/// The routing function of a MoE block.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Scoring {
    /// Softmax over all experts, top-k (`renormalize`: `norm_topk_prob`).
    #[default]
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
#[non_exhaustive]
pub struct SharedExpertSpec {
    pub intermediate: usize,
    /// Scaled by `sigmoid(shared_expert_gate(x))` (Qwen2-MoE).
    pub sigmoid_gate: bool,
}

impl SharedExpertSpec {
    /// An ungated shared SwiGLU expert of `intermediate`.
    pub fn new(intermediate: usize) -> Self {
        SharedExpertSpec {
            intermediate,
            sigmoid_gate: false,
        }
    }
}

/// How an architecture names its MoE tensors, relative to `model.layers.{L}.`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
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
        shared_expert: "shared_experts",
        ..MoeNames::QWEN
    };
}

impl Default for MoeNames {
    /// [`MoeNames::QWEN`], transformers' usual naming.
    fn default() -> Self {
        MoeNames::QWEN
    }
}

/// The tensor names of a dense SwiGLU MLP's projections (`mlp.gate_proj`, ...):
/// every architecture's dense layers and shared experts.
pub(crate) const DENSE_MLP_PROJ: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];
