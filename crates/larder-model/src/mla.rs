//! Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2), computed the way
//! transformers' `DeepseekV3Attention` does:
//!
//! - queries: `q_proj(x)`, or `q_b_proj(rms_norm(q_a_proj(x)))` with a low rank;
//!   each head is `[nope | rope]`;
//! - `kv_a_proj_with_mqa(x)` gives a latent (`kv_lora_rank`, RMS-normed) and
//!   one rope key shared by all heads; `kv_b_proj(latent)` expands the latent
//!   into each head's `[k_nope | v]`;
//! - RoPE on the rope parts (interleaved pairs by default, de-interleaved on
//!   output as transformers does), softmax scale `qk_head_dim^-0.5` times
//!   YaRN's `mscale^2`; Kimi Linear applies no RoPE (`rotary: false`: the
//!   rope parts enter the dot product as projected);
//! - with the K3 head-wise output gate (`output_gate`, transformers 5.24.0
//!   bailing_hybrid's MLA), each head's output is multiplied by
//!   `sigmoid(g_proj x)[head]` before `o_proj`;
//! - the latent RMSNorms (`q_a_layernorm`, `kv_a_layernorm`) use their own
//!   epsilon, [`LATENT_NORM_EPS`] = 1e-6 whatever `rms_norm_eps` is: both
//!   transformers' `DeepseekV3Attention` and `KimiLinear`'s MLA build them
//!   with the RMSNorm's default eps.
//!
//! The KV cache holds the **expanded** keys (`heads x (nope + rope)`) and
//! values (`heads x v`) per position: exact, and no up-projection per step.
//! (A compact latent cache would store `kv_lora_rank + rope` floats instead;
//! not done yet.) Each query row is computed on its own in a fixed order, so
//! prefill chunking and token-by-token decoding agree bit for bit.

use larder_tensor::kernels::scalar::dot;
use larder_tensor::ops::{rms_norm_chunks_in_place, sigmoid};
use larder_tensor::{Linear, Mat};

use crate::kv_cache::KvLayer;
use crate::rope::Rope;

/// Epsilon of MLA's latent RMSNorms (transformers' RMSNorm default, not
/// `rms_norm_eps`, in DeepSeek-V3, Kimi-K2 and Kimi Linear alike).
pub const LATENT_NORM_EPS: f32 = 1e-6;

/// How queries are projected.
pub enum QueryProj {
    Direct(Linear),
    LowRank { a: Linear, norm: Vec<f32>, b: Linear },
}

/// One MLA layer.
pub struct MlaAttention {
    pub q: QueryProj,
    pub kv_a: Linear,
    pub kv_norm: Vec<f32>,
    pub kv_b: Linear,
    pub o_proj: Linear,
    pub num_heads: usize,
    pub nope: usize,
    pub rope_dim: usize,
    pub v_dim: usize,
    pub kv_lora_rank: usize,
    pub softmax_scale: f32,
    pub interleave: bool,
    /// Apply RoPE to the rope parts (false: Kimi Linear).
    pub rotary: bool,
    /// Epsilon of `q_a_layernorm` and `kv_a_layernorm`.
    pub latent_norm_eps: f32,
    /// The head-wise output gate `g_proj` `[heads, hidden]` (K3 extension).
    pub output_gate: Option<Linear>,
}

impl MlaAttention {
    /// Key floats per cached position.
    pub fn key_dim(&self) -> usize {
        self.num_heads * (self.nope + self.rope_dim)
    }

    /// Value floats per cached position.
    pub fn value_dim(&self) -> usize {
        self.num_heads * self.v_dim
    }

    fn rotate(&self, x: &mut [f32], cos: &[f32], sin: &[f32], scratch: &mut Vec<f32>) {
        if !self.rotary {
            return;
        }
        if self.interleave {
            Rope::apply_interleaved(x, cos, sin, scratch);
        } else {
            Rope::apply(x, cos, sin);
        }
    }

    /// See [`crate::attention::Attention::forward`].
    pub fn forward(&self, x: &Mat, start: usize, rope: &Rope, cache: &mut KvLayer) -> Mat {
        let (heads, nope, rd, vd, rank) = (self.num_heads, self.nope, self.rope_dim, self.v_dim, self.kv_lora_rank);
        let qk = nope + rd;
        let mut q = match &self.q {
            QueryProj::Direct(p) => p.forward(x),
            QueryProj::LowRank { a, norm, b } => {
                let mut t = a.forward(x);
                let width = t.cols();
                rms_norm_chunks_in_place(t.as_mut_slice(), width, norm, self.latent_norm_eps);
                b.forward(&t)
            }
        };
        let ckv = self.kv_a.forward(x);
        let mut latent = Mat::zeros(x.rows(), rank);
        for r in 0..x.rows() {
            latent.row_mut(r).copy_from_slice(&ckv.row(r)[..rank]);
        }
        rms_norm_chunks_in_place(latent.as_mut_slice(), rank, &self.kv_norm, self.latent_norm_eps);
        let kv = self.kv_b.forward(&latent);

        debug_assert_eq!(cache.len(), start);
        let mut scratch = Vec::new();
        let (mut key, mut value) = (vec![0.0f32; heads * qk], vec![0.0f32; heads * vd]);
        for r in 0..x.rows() {
            let (cos, sin) = if self.rotary {
                rope.cos_sin(start + r)
            } else {
                (Vec::new(), Vec::new())
            };
            let mut k_rot = ckv.row(r)[rank..rank + rd].to_vec();
            self.rotate(&mut k_rot, &cos, &sin, &mut scratch);
            for head in q.row_mut(r).chunks_exact_mut(qk) {
                self.rotate(&mut head[nope..], &cos, &sin, &mut scratch);
            }
            for h in 0..heads {
                let src = &kv.row(r)[h * (nope + vd)..(h + 1) * (nope + vd)];
                key[h * qk..h * qk + nope].copy_from_slice(&src[..nope]);
                key[h * qk + nope..(h + 1) * qk].copy_from_slice(&k_rot);
                value[h * vd..(h + 1) * vd].copy_from_slice(&src[nope..]);
            }
            cache.push(&key, &value);
        }

        let mut out = Mat::zeros(x.rows(), heads * vd);
        let mut scores = Vec::new();
        for r in 0..x.rows() {
            let pos = start + r;
            for h in 0..heads {
                let qh = &q.row(r)[h * qk..(h + 1) * qk];
                scores.clear();
                scores.extend((0..=pos).map(|j| dot(qh, &cache.key(j)[h * qk..(h + 1) * qk]) * self.softmax_scale));
                larder_tensor::ops::softmax_in_place(&mut scores);
                let o = &mut out.row_mut(r)[h * vd..(h + 1) * vd];
                for (p, j) in scores.iter().zip(0..=pos) {
                    for (oo, vv) in o.iter_mut().zip(&cache.value(j)[h * vd..(h + 1) * vd]) {
                        *oo += p * vv;
                    }
                }
            }
        }
        if let Some(g_proj) = &self.output_gate {
            let gate = g_proj.forward(x);
            for r in 0..x.rows() {
                for (head, &g) in out.row_mut(r).chunks_exact_mut(vd).zip(gate.row(r)) {
                    let s = sigmoid(g);
                    head.iter_mut().for_each(|v| *v *= s);
                }
            }
        }
        self.o_proj.forward(&out)
    }
}
