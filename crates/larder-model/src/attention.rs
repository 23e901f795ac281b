//! The token mixer of a layer ([`Mixer`]): grouped-query attention with
//! RoPE, optional q/k bias and per-head q/k RMSNorm (Qwen3), optional sliding
//! window, over a [`KvLayer`]; DeepSeek's multi-head latent attention
//! ([`crate::mla`]), over a [`KvLayer`]; or Kimi Delta Attention
//! ([`crate::kda`]), over a recurrent state. Each reads and updates its
//! [`LayerState`].
//!
//! Each query row is computed on its own, from the cache contents up to its
//! position, in a fixed order: a prompt prefilled in one chunk and the same
//! prompt fed token by token give bit-identical outputs.

use larder_tensor::kernels::scalar::dot;
use larder_tensor::ops::rms_norm_chunks_in_place;
use larder_tensor::{Linear, Mat};

use crate::error::ModelError;
use crate::kda::KdaMixer;
use crate::kv_cache::KvLayer;
use crate::mla::MlaAttention;
use crate::rope::Rope;
use crate::state::{LayerState, RecurrentLayer};

/// The token mixer of one layer.
// One per layer, so the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Mixer {
    Gqa(GqaAttention),
    Mla(MlaAttention),
    Kda(KdaMixer),
}

impl Mixer {
    /// Mixes rows `x` (positions `start..start + x.rows()`) into the layer's
    /// `state` (which must hold exactly `start` positions): attention appends
    /// their keys and values, KDA updates its recurrent state (uncommitted
    /// until the pass succeeds). An error when `state` is of another mixer.
    pub fn forward(&self, x: &Mat, start: usize, rope: &Rope, state: &mut LayerState) -> Result<Mat, ModelError> {
        match (self, state) {
            (Mixer::Gqa(a), LayerState::Kv(cache)) => Ok(a.forward(x, start, rope, cache)),
            (Mixer::Mla(a), LayerState::Kv(cache)) => Ok(a.forward(x, start, rope, cache)),
            (Mixer::Kda(k), LayerState::Recurrent(r)) => Ok(k.forward(x, r)),
            _ => Err(ModelError::State(
                "its state does not match the layer's mixer (attention vs recurrent); make it with new_state()".into(),
            )),
        }
    }

    /// Whether `state` is this mixer's kind of state, with its widths.
    pub fn fits(&self, state: &LayerState) -> bool {
        match (self, state) {
            (Mixer::Gqa(a), LayerState::Kv(kv)) => {
                let d = a.num_kv_heads * a.head_dim;
                kv.dims() == (d, d)
            }
            (Mixer::Mla(a), LayerState::Kv(kv)) => kv.dims() == (a.key_dim(), a.value_dim()),
            (Mixer::Kda(k), LayerState::Recurrent(r)) => {
                let (heads, dim, kernel) = k.dims();
                r.dims() == (heads, dim, 3 * heads * dim, kernel)
            }
            _ => false,
        }
    }

    /// An empty state for this mixer.
    pub fn new_state(&self) -> LayerState {
        match self {
            Mixer::Gqa(a) => {
                let d = a.num_kv_heads * a.head_dim;
                LayerState::Kv(KvLayer::new(d, d))
            }
            Mixer::Mla(a) => LayerState::Kv(KvLayer::new(a.key_dim(), a.value_dim())),
            Mixer::Kda(k) => {
                let (heads, dim, kernel) = k.dims();
                LayerState::Recurrent(RecurrentLayer::new(heads, dim, 3 * heads * dim, kernel))
            }
        }
    }
}

/// Grouped-query attention.
pub struct GqaAttention {
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub o_proj: Linear,
    /// Per-head RMSNorm weights for q and k (Qwen3).
    pub qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub sliding_window: Option<usize>,
}

impl GqaAttention {
    /// See [`Attention::forward`].
    pub fn forward(&self, x: &Mat, start: usize, rope: &Rope, cache: &mut KvLayer) -> Mat {
        let hd = self.head_dim;
        let mut q = self.q_proj.forward(x);
        let mut k = self.k_proj.forward(x);
        let v = self.v_proj.forward(x);
        if let Some((qn, kn)) = &self.qk_norm {
            rms_norm_chunks_in_place(q.as_mut_slice(), hd, qn, self.rms_norm_eps);
            rms_norm_chunks_in_place(k.as_mut_slice(), hd, kn, self.rms_norm_eps);
        }
        debug_assert_eq!(cache.len(), start);
        for r in 0..x.rows() {
            let (cos, sin) = rope.cos_sin(start + r);
            for head in q.row_mut(r).chunks_exact_mut(hd) {
                Rope::apply(head, &cos, &sin);
            }
            for head in k.row_mut(r).chunks_exact_mut(hd) {
                Rope::apply(head, &cos, &sin);
            }
            cache.push(k.row(r), v.row(r));
        }

        let scale = 1.0 / (hd as f32).sqrt();
        let group = self.num_heads / self.num_kv_heads;
        let mut out = Mat::zeros(x.rows(), self.num_heads * hd);
        let mut scores = Vec::new();
        for r in 0..x.rows() {
            let pos = start + r;
            let first = match self.sliding_window {
                Some(w) => (pos + 1).saturating_sub(w),
                None => 0,
            };
            for h in 0..self.num_heads {
                let kvh = h / group;
                let qh = &q.row(r)[h * hd..(h + 1) * hd];
                scores.clear();
                scores.extend((first..=pos).map(|j| dot(qh, &cache.key(j)[kvh * hd..(kvh + 1) * hd]) * scale));
                larder_tensor::ops::softmax_in_place(&mut scores);
                let o = &mut out.row_mut(r)[h * hd..(h + 1) * hd];
                for (p, j) in scores.iter().zip(first..=pos) {
                    let vj = &cache.value(j)[kvh * hd..(kvh + 1) * hd];
                    for (oo, vv) in o.iter_mut().zip(vj) {
                        *oo += p * vv;
                    }
                }
            }
        }
        self.o_proj.forward(&out)
    }
}
