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
//! - with Kimi K3's output gate (`output_gate`, `mla_use_output_gate`), the
//!   heads' output is multiplied element-wise by `sigmoid(g_proj x)`
//!   (`[heads · v_head_dim]`, `x` the normed attention input) before `o_proj`;
//! - the latent RMSNorms (`q_a_layernorm`, `kv_a_layernorm`) use their own
//!   epsilon, [`LATENT_NORM_EPS`](crate::LATENT_NORM_EPS) = 1e-6 whatever `rms_norm_eps` is: both
//!   transformers' `DeepseekV3Attention` and `KimiLinear`'s MLA build them
//!   with the RMSNorm's default eps.
//!
//! What the KV cache holds per position is the layer's [`MlaCache`]:
//!
//! - [`MlaCache::Compact`] (default): the normed latent and the rope key,
//!   `kv_lora_rank + rope` floats (a `KvLayer` with `v_dim = 0`). `kv_b_proj`
//!   is absorbed (DeepSeek's `attn_impl="absorb"`): split per head into
//!   `W_UK [nope, rank]` and `W_UV [v, rank]`, each query head becomes
//!   `[W_UK^T q_nope | q_rope]` and is dotted with `[latent_j | k_rope_j]`;
//!   the softmax-weighted sum of latents is mapped to the head's output by
//!   `W_UV`. Those matrices are `kv_b_proj`'s weights decoded to f32 once
//!   ([`Absorbed`], an exact widening through the weight's own decoder).
//! - [`MlaCache::Expanded`]: every head's key (`nope + rope`) and value
//!   (`v`), as transformers computes them; no up-projection per step.
//!
//! Either way each query row is computed on its own in a fixed order (every
//! score by the same dot, every sum in position order), so prefill chunking
//! and token-by-token decoding agree bit for bit.

use std::sync::OnceLock;

use larder_tensor::ops::{rms_norm_chunks_in_place, sigmoid, softmax_in_place};
use larder_tensor::vector::{axpy, dot};
use larder_tensor::{Linear, Mat};
use rayon::prelude::*;

use crate::error::ModelError;
use crate::kv_cache::KvLayer;
use crate::rope::Rope;
use crate::source::WeightView;
use crate::spec::{MlaCache, MlaSpec, ModelSpec};

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
    /// K3's element-wise output gate `g_proj` `[heads · v_head_dim, hidden]`.
    pub output_gate: Option<Linear>,
    /// What the cache holds per position.
    pub cache: MlaCache,
    /// `kv_b_proj` split and decoded for [`MlaCache::Compact`], made once
    /// (at load, or by the first compact pass).
    pub absorbed: OnceLock<Absorbed>,
}

/// `kv_b_proj`'s weights in f32, arranged for the absorbed (compact) path.
pub struct Absorbed {
    /// Per head, `W_UK^T` `[rank, nope]`: row `c` is column `c` of the head's key rows.
    uk_t: Vec<f32>,
    /// Per head, `W_UV` `[v, rank]`: the head's value rows.
    uv: Vec<f32>,
}

impl Absorbed {
    /// Splits `kv_b` (`[heads * (nope + v), rank]`) per head, each row
    /// decoded exactly as the kernels decode it.
    pub fn new(kv_b: &Linear, heads: usize, nope: usize, v: usize, rank: usize) -> Self {
        let w = kv_b.weight();
        let (mut uk_t, mut uv) = (vec![0.0f32; heads * rank * nope], vec![0.0f32; heads * v * rank]);
        let mut row = vec![0.0f32; rank];
        for h in 0..heads {
            for i in 0..nope {
                w.decode_row(h * (nope + v) + i, &mut row);
                for (c, &x) in row.iter().enumerate() {
                    uk_t[(h * rank + c) * nope + i] = x;
                }
            }
            for i in 0..v {
                w.decode_row(h * (nope + v) + nope + i, &mut uv[(h * v + i) * rank..(h * v + i + 1) * rank]);
            }
        }
        Absorbed { uk_t, uv }
    }
}

impl MlaAttention {
    /// The MLA projections and latent norms under `attn`
    /// (`model.layers.{l}.self_attn`), shaped by `m`; with the compact cache,
    /// `kv_b_proj` absorbed at once (not for a recorded load's zeros).
    pub fn load(spec: &ModelSpec, m: &MlaSpec, attn: &WeightView<'_>) -> Result<Self, ModelError> {
        let (h, heads) = (spec.hidden_size, spec.num_heads);
        let qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
        let q = match m.q_lora_rank {
            None => QueryProj::Direct(attn.linear("q_proj", heads * qk, h)?),
            Some(rank) => QueryProj::LowRank {
                a: attn.linear("q_a_proj", rank, h)?,
                norm: attn.vector("q_a_layernorm.weight", rank)?,
                b: attn.linear("q_b_proj", heads * qk, rank)?,
            },
        };
        let output_gate = attn.switched_linear("g_proj", m.output_gate, heads * m.v_head_dim, h, "mla_use_output_gate")?;
        let mla = MlaAttention {
            q,
            kv_a: attn.linear("kv_a_proj_with_mqa", m.kv_lora_rank + m.qk_rope_head_dim, h)?,
            kv_norm: attn.vector("kv_a_layernorm.weight", m.kv_lora_rank)?,
            kv_b: attn.linear("kv_b_proj", heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank)?,
            o_proj: attn.linear("o_proj", h, heads * m.v_head_dim)?,
            num_heads: heads,
            nope: m.qk_nope_head_dim,
            rope_dim: m.qk_rope_head_dim,
            v_dim: m.v_head_dim,
            kv_lora_rank: m.kv_lora_rank,
            softmax_scale: m.softmax_scale,
            interleave: m.rope_interleave,
            rotary: m.rotary,
            latent_norm_eps: m.latent_norm_eps,
            output_gate,
            cache: spec.mla_cache,
            absorbed: OnceLock::new(),
        };
        // A recorded load's zeros are never run: no f32 copy of them.
        if spec.mla_cache == MlaCache::Compact && !attn.zero_placeholders() {
            mla.absorbed();
        }
        Ok(mla)
    }

    /// Key floats per cached position.
    pub fn key_dim(&self) -> usize {
        match self.cache {
            MlaCache::Compact => self.kv_lora_rank + self.rope_dim,
            MlaCache::Expanded => self.num_heads * (self.nope + self.rope_dim),
        }
    }

    /// Value floats per cached position (none when compact).
    pub fn value_dim(&self) -> usize {
        match self.cache {
            MlaCache::Compact => 0,
            MlaCache::Expanded => self.num_heads * self.v_dim,
        }
    }

    /// The absorbed `kv_b_proj`, made on first use.
    pub fn absorbed(&self) -> &Absorbed {
        self.absorbed
            .get_or_init(|| Absorbed::new(&self.kv_b, self.num_heads, self.nope, self.v_dim, self.kv_lora_rank))
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

    fn cos_sin(&self, rope: &Rope, pos: usize) -> (Vec<f32>, Vec<f32>) {
        match self.rotary {
            true => rope.cos_sin(pos),
            false => (Vec::new(), Vec::new()),
        }
    }

    /// Queries, `[rows, heads * (nope + rope)]`, before RoPE.
    fn queries(&self, x: &Mat) -> Mat {
        match &self.q {
            QueryProj::Direct(p) => p.forward(x),
            QueryProj::LowRank { a, norm, b } => {
                let mut t = a.forward(x);
                let width = t.cols();
                rms_norm_chunks_in_place(t.as_mut_slice(), width, norm, self.latent_norm_eps);
                b.forward(&t)
            }
        }
    }

    /// `kv_a_proj_with_mqa(x)` and its normed latents `[rows, rank]`.
    fn latents(&self, x: &Mat) -> (Mat, Mat) {
        let rank = self.kv_lora_rank;
        let ckv = self.kv_a.forward(x);
        let mut latent = Mat::zeros(x.rows(), rank);
        for r in 0..x.rows() {
            latent.row_mut(r).copy_from_slice(&ckv.row(r)[..rank]);
        }
        rms_norm_chunks_in_place(latent.as_mut_slice(), rank, &self.kv_norm, self.latent_norm_eps);
        (ckv, latent)
    }

    /// See `crate::attention::Mixer::forward`.
    pub fn forward(&self, x: &Mat, start: usize, rope: &Rope, cache: &mut KvLayer) -> Mat {
        debug_assert_eq!(cache.len(), start);
        let out = match self.cache {
            MlaCache::Compact => self.attend_compact(x, start, rope, cache),
            MlaCache::Expanded => self.attend_expanded(x, start, rope, cache),
        };
        self.finish(x, out)
    }

    /// The output gate (when present) and `o_proj` on the heads' outputs.
    fn finish(&self, x: &Mat, mut out: Mat) -> Mat {
        if let Some(g_proj) = &self.output_gate {
            let gate = g_proj.forward(x);
            for (v, &g) in out.as_mut_slice().iter_mut().zip(gate.as_slice()) {
                *v *= sigmoid(g);
            }
        }
        self.o_proj.forward(&out)
    }

    /// Caches each row's latent and rotated rope key, rotates the queries'
    /// rope parts in place, and returns them.
    fn push_compact(&self, x: &Mat, start: usize, rope: &Rope, cache: &mut KvLayer) -> Mat {
        let (rank, rd, qk) = (self.kv_lora_rank, self.rope_dim, self.nope + self.rope_dim);
        let mut q = self.queries(x);
        let (ckv, latent) = self.latents(x);
        let (mut scratch, mut key) = (Vec::new(), vec![0.0f32; rank + rd]);
        for r in 0..x.rows() {
            let (cos, sin) = self.cos_sin(rope, start + r);
            key[..rank].copy_from_slice(latent.row(r));
            key[rank..].copy_from_slice(&ckv.row(r)[rank..rank + rd]);
            self.rotate(&mut key[rank..], &cos, &sin, &mut scratch);
            for head in q.row_mut(r).chunks_exact_mut(qk) {
                self.rotate(&mut head[self.nope..], &cos, &sin, &mut scratch);
            }
            cache.push(&key, &[]);
        }
        q
    }

    /// Absorbed attention over the compact cache: heads' outputs `[rows, heads * v]`.
    /// Rows are independent once the cache holds them: with at least as many
    /// rows as threads, one task per row; with fewer (decode), each row's
    /// heads in one group per thread. A head's sums are the same either way.
    fn attend_compact(&self, x: &Mat, start: usize, rope: &Rope, cache: &mut KvLayer) -> Mat {
        let (heads, vd) = (self.num_heads, self.v_dim);
        let q = self.push_compact(x, start, rope, cache);
        let mut out = Mat::zeros(x.rows(), heads * vd);
        let cache = &*cache;
        let threads = rayon::current_num_threads().clamp(1, heads.max(1));
        if x.rows() >= threads || threads == 1 {
            out.as_mut_slice()
                .par_chunks_mut(heads * vd)
                .enumerate()
                .for_each_init(Scratch::default, |scratch, (r, o)| {
                    self.attend_heads(q.row(r), start + r + 1, cache, 0..heads, o, scratch);
                });
            return out;
        }
        let per = heads.div_ceil(threads);
        for r in 0..x.rows() {
            out.row_mut(r)
                .par_chunks_mut(per * vd)
                .enumerate()
                .for_each_init(Scratch::default, |scratch, (g, o)| {
                    let first = g * per;
                    self.attend_heads(q.row(r), start + r + 1, cache, first..(first + per).min(heads), o, scratch);
                });
        }
        out
    }

    /// One query row (`q_row`, every head's `[nope | rope]`) against the
    /// first `n` cached positions, for the heads `hs` only: their outputs
    /// into `out` (`hs.len() * v_dim`), through the absorbed projections.
    fn attend_heads(&self, q_row: &[f32], n: usize, cache: &KvLayer, hs: std::ops::Range<usize>, out: &mut [f32], s: &mut Scratch) {
        let (nope, vd, rank) = (self.nope, self.v_dim, self.kv_lora_rank);
        let (qk, width, count) = (nope + self.rope_dim, rank + self.rope_dim, hs.len());
        let w = self.absorbed();
        s.q_abs.resize(count * width, 0.0);
        for (l, h) in hs.clone().enumerate() {
            let qh = &q_row[h * qk..(h + 1) * qk];
            let dst = &mut s.q_abs[l * width..(l + 1) * width];
            for (c, d) in dst[..rank].iter_mut().enumerate() {
                *d = dot(&w.uk_t[(h * rank + c) * nope..(h * rank + c + 1) * nope], &qh[..nope]);
            }
            dst[rank..].copy_from_slice(&qh[nope..]);
        }
        self.latent_scores(&s.q_abs, cache, n, count, &mut s.scores);
        s.ctx.clear();
        s.ctx.resize(count * rank, 0.0);
        for j in 0..n {
            let lat = &cache.key(j)[..rank];
            for l in 0..count {
                axpy(s.scores[l * n + j], lat, &mut s.ctx[l * rank..(l + 1) * rank]);
            }
        }
        for (l, h) in hs.enumerate() {
            let c = &s.ctx[l * rank..(l + 1) * rank];
            for i in 0..vd {
                out[l * vd + i] = dot(&w.uv[(h * vd + i) * rank..(h * vd + i + 1) * rank], c);
            }
        }
    }

    /// Softmaxed scores of `heads` heads (their absorbed queries in `q_abs`)
    /// against the first `n` cached positions, `scores[h * n + j]`; each one
    /// dot of `[q_lat | q_rope]` with `[latent_j | k_rope_j]`, positions
    /// outermost so a cached row is read once for all of them.
    fn latent_scores(&self, q_abs: &[f32], cache: &KvLayer, n: usize, heads: usize, scores: &mut Vec<f32>) {
        let width = self.kv_lora_rank + self.rope_dim;
        scores.clear();
        scores.resize(heads * n, 0.0);
        for j in 0..n {
            let k = cache.key(j);
            for h in 0..heads {
                scores[h * n + j] = dot(&q_abs[h * width..(h + 1) * width], k) * self.softmax_scale;
            }
        }
        for h in 0..heads {
            softmax_in_place(&mut scores[h * n..(h + 1) * n]);
        }
    }

    /// Attention over the expanded cache: heads' outputs `[rows, heads * v]`.
    fn attend_expanded(&self, x: &Mat, start: usize, rope: &Rope, cache: &mut KvLayer) -> Mat {
        let (heads, nope, rd, vd, rank) = (self.num_heads, self.nope, self.rope_dim, self.v_dim, self.kv_lora_rank);
        let qk = nope + rd;
        let mut q = self.queries(x);
        let (ckv, latent) = self.latents(x);
        let kv = self.kv_b.forward(&latent);

        let mut scratch = Vec::new();
        let (mut key, mut value) = (vec![0.0f32; heads * qk], vec![0.0f32; heads * vd]);
        for r in 0..x.rows() {
            let (cos, sin) = self.cos_sin(rope, start + r);
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
        let cache = &*cache;
        out.as_mut_slice()
            .par_chunks_mut(heads * vd)
            .enumerate()
            .for_each_init(Vec::new, |scores, (r, out_row)| {
                let pos = start + r;
                for h in 0..heads {
                    let qh = &q.row(r)[h * qk..(h + 1) * qk];
                    scores.clear();
                    scores.extend((0..=pos).map(|j| dot(qh, &cache.key(j)[h * qk..(h + 1) * qk]) * self.softmax_scale));
                    softmax_in_place(scores);
                    let o = &mut out_row[h * vd..(h + 1) * vd];
                    for (j, &p) in scores.iter().enumerate() {
                        axpy(p, &cache.value(j)[h * vd..(h + 1) * vd], o);
                    }
                }
            });
        out
    }
}

/// One attention task's buffers (absorbed queries, scores, latent contexts).
#[derive(Default)]
struct Scratch {
    q_abs: Vec<f32>,
    scores: Vec<f32>,
    ctx: Vec<f32>,
}
