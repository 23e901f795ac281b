//! The tensors of a synthetic checkpoint: names and shapes as the
//! architecture's real checkpoints have them, dtype, and how each is
//! initialised (see the module doc of [`super`] for the scales).
//!
//! 4-bit experts: codes are uniform random bytes (every nibble equally
//! likely); scales are set so the dequantized weights have the std the bf16
//! experts would have. INT4 codes q = u - 8 in [-8, 7] have rms
//! sqrt(21.5) = 4.64, so the bf16 scale is std / 4.64 (times 2^U(-0.5, 0.5)
//! per group, so groups differ); e2m1 codes have rms sqrt(8.5625) = 2.93,
//! so the e8m0 exponent is round(log2(std / 2.93)) plus a per-block step of
//! -1, 0 or +1.

use super::{DeepseekShape, ExpertsFormat, KdaShape, SynthSpec};

/// One tensor to generate.
pub(super) struct TensorPlan {
    pub name: String,
    pub shape: Vec<usize>,
    pub kind: Init,
    pub dtype: Dtype,
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy)]
pub(super) enum Init {
    /// Uniform with this std, seeded by the tensor's index.
    Uniform(f32),
    Ones,
    Zeros,
    /// Every element this value.
    Const(f32),
    Embedding,
    LmHead,
    Router,
    /// Uniform random bytes: 4-bit codes (INT4 words or e2m1 pairs).
    Codes,
    /// bf16 INT4 group scales for dequantized weights of this std.
    Int4Scale(f32),
    /// e8m0 scale bytes for dequantized e2m1 weights of this std.
    E8m0(f32),
    /// The i32 pair `[rows, cols]` (`weight_shape`).
    Shape(usize, usize),
}

/// The stored element type.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Dtype {
    Bf16,
    F32,
    I32,
    U8,
}

impl Dtype {
    pub fn size(self) -> usize {
        match self {
            Dtype::U8 => 1,
            Dtype::Bf16 => 2,
            Dtype::F32 | Dtype::I32 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "BF16",
            Dtype::F32 => "F32",
            Dtype::I32 => "I32",
            Dtype::U8 => "U8",
        }
    }
}

impl TensorPlan {
    pub fn bytes(&self) -> u64 {
        (self.shape.iter().product::<usize>() * self.dtype.size()) as u64
    }
}

/// A bf16 tensor.
pub(super) fn t(name: &str, shape: &[usize], kind: Init) -> TensorPlan {
    TensorPlan {
        name: name.into(),
        shape: shape.to_vec(),
        kind,
        dtype: Dtype::Bf16,
    }
}

/// An f32 tensor (what transformers keeps in f32 when it saves bf16 Kimi Linear).
fn t32(name: &str, shape: &[usize], kind: Init) -> TensorPlan {
    TensorPlan {
        dtype: Dtype::F32,
        ..t(name, shape, kind)
    }
}

/// A tensor of another dtype.
pub(super) fn typed(name: &str, shape: &[usize], kind: Init, dtype: Dtype) -> TensorPlan {
    TensorPlan {
        dtype,
        ..t(name, shape, kind)
    }
}

/// Output projections: small, so the residual stays dominated by the current token.
pub(super) const SMALL: f32 = 0.002;
/// Input projections.
pub(super) const PROJ: f32 = 0.02;

/// Embeddings, final norm and LM head (the first shard; same names in every architecture).
pub(super) fn top_tensors(spec: &SynthSpec) -> Vec<TensorPlan> {
    vec![
        t("model.embed_tokens.weight", &[spec.vocab, spec.hidden], Init::Embedding),
        t("model.norm.weight", &[spec.hidden], Init::Ones),
        t("lm_head.weight", &[spec.vocab, spec.hidden], Init::LmHead),
    ]
}

/// Every tensor of layer `l`, named as the architecture's checkpoints name them.
pub(super) fn layer_tensors(spec: &SynthSpec, l: usize) -> Vec<TensorPlan> {
    let h = spec.hidden;
    let p = format!("model.layers.{l}");
    if spec.gpt_oss.is_some() {
        return super::gpt_oss::layer_tensors(spec, l);
    }
    let mut v = vec![
        t(&format!("{p}.input_layernorm.weight"), &[h], Init::Ones),
        t(&format!("{p}.post_attention_layernorm.weight"), &[h], Init::Ones),
    ];
    let a = format!("{p}.self_attn");
    match (&spec.deepseek, &spec.kda) {
        (None, _) => {
            v.extend(gqa(spec, &a));
            v.extend(routed(
                spec,
                &format!("{p}.mlp"),
                ["gate_proj", "up_proj", "down_proj"],
                Dtype::Bf16,
            ));
        }
        (Some(d), kda) => {
            match kda {
                Some(k) if k.is_kda(l) => v.extend(kda_mixer(spec, k, &a)),
                _ => v.extend(mla(spec, d, &a)),
            }
            let moe = if kda.is_some() { "block_sparse_moe" } else { "mlp" };
            if l < d.first_k_dense_replace {
                v.extend(swiglu(h, spec.expert_intermediate * 4, &format!("{p}.mlp")));
            } else {
                // transformers saves a bf16 Kimi Linear's router and correction bias in f32.
                let (router_dtype, names) = match kda {
                    Some(_) => (Dtype::F32, ["w1", "w3", "w2"]),
                    None => (Dtype::Bf16, ["gate_proj", "up_proj", "down_proj"]),
                };
                v.push(TensorPlan {
                    dtype: router_dtype,
                    ..t(&format!("{p}.{moe}.gate.e_score_correction_bias"), &[spec.experts], Init::Zeros)
                });
                let shared = spec.expert_intermediate * d.n_shared_experts;
                v.extend(swiglu(h, shared, &format!("{p}.{moe}.shared_experts")));
                if let Some(latent) = spec.moe_latent_size {
                    // Latent-space experts: into the latent space and back (bf16, no bias).
                    v.push(t(&format!("{p}.{moe}.fc1_latent_proj.weight"), &[latent, h], Init::Uniform(PROJ)));
                    v.push(t(&format!("{p}.{moe}.fc2_latent_proj.weight"), &[h, latent], Init::Uniform(PROJ)));
                }
                v.extend(routed(spec, &format!("{p}.{moe}"), names, router_dtype));
            }
        }
    }
    v
}

/// Qwen3-MoE's grouped-query attention with q/k norms.
fn gqa(spec: &SynthSpec, a: &str) -> Vec<TensorPlan> {
    let (h, hd) = (spec.hidden, spec.head_dim);
    vec![
        t(&format!("{a}.q_proj.weight"), &[spec.heads * hd, h], Init::Uniform(PROJ)),
        t(&format!("{a}.k_proj.weight"), &[spec.kv_heads * hd, h], Init::Uniform(PROJ)),
        t(&format!("{a}.v_proj.weight"), &[spec.kv_heads * hd, h], Init::Uniform(PROJ)),
        t(&format!("{a}.o_proj.weight"), &[h, spec.heads * hd], Init::Uniform(SMALL)),
        t(&format!("{a}.q_norm.weight"), &[hd], Init::Ones),
        t(&format!("{a}.k_norm.weight"), &[hd], Init::Ones),
    ]
}

/// DeepSeek-V3's MLA (Kimi Linear's too): a q LoRA or one `q_proj`, the compressed KV.
fn mla(spec: &SynthSpec, d: &DeepseekShape, a: &str) -> Vec<TensorPlan> {
    let (h, heads) = (spec.hidden, spec.heads);
    let qk = d.qk_nope_head_dim + d.qk_rope_head_dim;
    let mut v = match d.q_lora_rank {
        Some(rank) => vec![
            t(&format!("{a}.q_a_proj.weight"), &[rank, h], Init::Uniform(PROJ)),
            t(&format!("{a}.q_a_layernorm.weight"), &[rank], Init::Ones),
            t(&format!("{a}.q_b_proj.weight"), &[heads * qk, rank], Init::Uniform(PROJ)),
        ],
        None => vec![t(&format!("{a}.q_proj.weight"), &[heads * qk, h], Init::Uniform(PROJ))],
    };
    let rank = d.kv_lora_rank;
    v.extend([
        t(
            &format!("{a}.kv_a_proj_with_mqa.weight"),
            &[rank + d.qk_rope_head_dim, h],
            Init::Uniform(PROJ),
        ),
        t(&format!("{a}.kv_a_layernorm.weight"), &[rank], Init::Ones),
        t(
            &format!("{a}.kv_b_proj.weight"),
            &[heads * (d.qk_nope_head_dim + d.v_head_dim), rank],
            Init::Uniform(PROJ),
        ),
        t(&format!("{a}.o_proj.weight"), &[h, heads * d.v_head_dim], Init::Uniform(SMALL)),
    ]);
    v
}

/// Kimi Linear's KDA mixer (docs/kimi_linear.md, "Tensors"). `A_log` = 0 and
/// `dt_bias` = -2 give every channel a decay of exp(-softplus(-2)) = 0.88 per
/// token (plus the small low-rank term), so the state remembers a few tokens;
/// `A_log` and `dt_bias` in f32 as transformers saves a bf16 checkpoint.
fn kda_mixer(spec: &SynthSpec, k: &KdaShape, a: &str) -> Vec<TensorPlan> {
    let (h, d, heads) = (spec.hidden, k.head_dim, k.heads);
    let hd = heads * d;
    let mut v = Vec::new();
    for x in ["q", "k", "v"] {
        v.push(t(&format!("{a}.{x}_proj.weight"), &[hd, h], Init::Uniform(PROJ)));
    }
    for x in ["q", "k", "v"] {
        v.push(t(&format!("{a}.{x}_conv1d.weight"), &[hd, 1, k.conv_kernel], Init::Uniform(0.5)));
    }
    v.extend([
        t(&format!("{a}.f_a_proj.weight"), &[d, h], Init::Uniform(PROJ)),
        t(&format!("{a}.f_b_proj.weight"), &[hd, d], Init::Uniform(PROJ)),
        t32(&format!("{a}.A_log"), &[1, 1, heads, 1], Init::Zeros),
        t32(&format!("{a}.dt_bias"), &[hd], Init::Const(-2.0)),
        t(&format!("{a}.b_proj.weight"), &[heads, h], Init::Uniform(PROJ)),
        t(&format!("{a}.g_a_proj.weight"), &[d, h], Init::Uniform(PROJ)),
        t(&format!("{a}.g_b_proj.weight"), &[hd, d], Init::Uniform(PROJ)),
        t(&format!("{a}.o_norm.weight"), &[d], Init::Ones),
        t(&format!("{a}.o_proj.weight"), &[h, hd], Init::Uniform(SMALL)),
    ]);
    v
}

/// A SwiGLU MLP (`gate_proj`, `up_proj`, `down_proj`) of width `width` under `prefix`.
fn swiglu(h: usize, width: usize, prefix: &str) -> Vec<TensorPlan> {
    vec![
        t(&format!("{prefix}.gate_proj.weight"), &[width, h], Init::Uniform(PROJ)),
        t(&format!("{prefix}.up_proj.weight"), &[width, h], Init::Uniform(PROJ)),
        t(&format!("{prefix}.down_proj.weight"), &[h, width], Init::Uniform(SMALL)),
    ]
}

/// The router (`gate.weight`) and the routed experts named `[gate, up, down]`.
fn routed(spec: &SynthSpec, block: &str, names: [&str; 3], router_dtype: Dtype) -> Vec<TensorPlan> {
    let (w, i) = (spec.expert_width(), spec.expert_intermediate);
    let mut v = vec![TensorPlan {
        dtype: router_dtype,
        ..t(&format!("{block}.gate.weight"), &[spec.experts, spec.hidden], Init::Router)
    }];
    for e in 0..spec.experts {
        let x = format!("{block}.experts.{e}");
        v.extend(expert_matrix(spec.experts_format, &format!("{x}.{}", names[0]), i, w, PROJ));
        v.extend(expert_matrix(spec.experts_format, &format!("{x}.{}", names[1]), i, w, PROJ));
        v.extend(expert_matrix(spec.experts_format, &format!("{x}.{}", names[2]), w, i, SMALL));
    }
    v
}

/// One routed expert's `[rows, cols]` projection `module` with weights of
/// std `std`: bf16 `weight`, or compressed-tensors `weight_packed`,
/// `weight_scale` (and `weight_shape` for INT4), group 32.
fn expert_matrix(format: ExpertsFormat, module: &str, rows: usize, cols: usize, std: f32) -> Vec<TensorPlan> {
    let groups = cols / 32;
    match format {
        ExpertsFormat::Bf16 => vec![t(&format!("{module}.weight"), &[rows, cols], Init::Uniform(std))],
        ExpertsFormat::Int4 => vec![
            typed(&format!("{module}.weight_packed"), &[rows, cols / 8], Init::Codes, Dtype::I32),
            t(&format!("{module}.weight_scale"), &[rows, groups], Init::Int4Scale(std)),
            typed(&format!("{module}.weight_shape"), &[2], Init::Shape(rows, cols), Dtype::I32),
        ],
        ExpertsFormat::Mxfp4 => vec![
            typed(&format!("{module}.weight_packed"), &[rows, cols / 2], Init::Codes, Dtype::U8),
            typed(&format!("{module}.weight_scale"), &[rows, groups], Init::E8m0(std), Dtype::U8),
        ],
    }
}
