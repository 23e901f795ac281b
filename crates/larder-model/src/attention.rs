//! The token mixer of a layer ([`Mixer`]): grouped-query attention with
//! RoPE, optional q/k bias and per-head q/k RMSNorm (Qwen3), optional sliding
//! window, optional per-head learned sinks (gpt-oss), over a [`KvLayer`]; DeepSeek's multi-head latent attention
//! ([`crate::mla`]), over a [`KvLayer`]; or Kimi Delta Attention
//! ([`crate::kda`]), over a recurrent state. Each reads and updates its
//! [`LayerState`].
//!
//! Each query row is computed on its own, from the cache contents up to its
//! position, in a fixed order: a prompt prefilled in one chunk and the same
//! prompt fed token by token give bit-identical outputs.

use std::ops::Range;

use larder_tensor::ops::rms_norm_chunks_in_place;
use larder_tensor::vector::{axpy, dot};
use larder_tensor::{Linear, Mat};
use rayon::prelude::*;

use crate::error::ModelError;
use crate::kda::KdaMixer;
use crate::kv_cache::KvLayer;
use crate::mla::MlaAttention;
use crate::rope::Rope;
use crate::source::WeightView;
use crate::spec::{LayerSpec, MixerSpec, ModelSpec};
use crate::state::{LayerState, RecurrentLayer};

/// One sequence's rows in a batch a mixer runs ([`Mixer::forward_rows`]):
/// rows `rows` of the batch matrix, at positions `start..`, over its layer
/// `state`.
pub(crate) struct MixerRows<'a> {
    pub rows: Range<usize>,
    pub start: usize,
    pub state: &'a mut LayerState,
}

fn state_mismatch() -> ModelError {
    ModelError::State("its state does not match the layer's mixer (attention vs recurrent); make it with new_state()".into())
}

/// The token mixer of one layer.
// One per layer, so the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Mixer {
    Gqa(GqaAttention),
    Mla(MlaAttention),
    Kda(KdaMixer),
}

impl Mixer {
    /// The mixer `layer` says, from its tensors under `attn` (`model.layers.{l}.self_attn`).
    pub(crate) fn load(spec: &ModelSpec, layer: &LayerSpec, attn: &WeightView<'_>) -> Result<Mixer, ModelError> {
        match &layer.mixer {
            MixerSpec::Gqa => GqaAttention::load(spec, attn, layer.sliding_window).map(Mixer::Gqa),
            MixerSpec::Mla(m) => MlaAttention::load(spec, m, attn).map(Mixer::Mla),
            MixerSpec::Kda(k) => KdaMixer::load(attn, k, spec.hidden_size, spec.rms_norm_eps).map(Mixer::Kda),
        }
    }

    /// Mixes rows `x` (positions `start..start + x.rows()`) into the layer's
    /// `state` (which must hold exactly `start` positions): attention appends
    /// their keys and values, KDA updates its recurrent state (uncommitted
    /// until the pass succeeds). An error when `state` is of another mixer.
    pub(crate) fn forward(&self, x: &Mat, start: usize, rope: &Rope, state: &mut LayerState) -> Result<Mat, ModelError> {
        match (self, state) {
            (Mixer::Gqa(a), LayerState::Kv(cache)) => Ok(a.forward(x, start, rope, cache)),
            (Mixer::Mla(a), LayerState::Kv(cache)) => Ok(a.forward(x, start, rope, cache)),
            (Mixer::Kda(k), LayerState::Recurrent(r)) => Ok(k.forward(x, r)),
            _ => Err(state_mismatch()),
        }
    }

    /// Mixes the rows of several sequences at once, as [`forward`](Self::forward)
    /// does each alone, bit for bit: GQA projects every row in one matrix
    /// product (batch-invariant kernels: a row's result never depends on the
    /// others) and attends per row; MLA and KDA run each sequence's rows on
    /// their own. An error names the part at fault (its index in `parts`).
    pub(crate) fn forward_rows(&self, x: &Mat, parts: &mut [MixerRows<'_>], rope: &Rope) -> Result<Mat, (usize, ModelError)> {
        if let Mixer::Gqa(a) = self {
            let mut caches = Vec::with_capacity(parts.len());
            for (i, p) in parts.iter_mut().enumerate() {
                match &mut *p.state {
                    LayerState::Kv(cache) => caches.push((p.rows.clone(), p.start, cache)),
                    _ => return Err((i, state_mismatch())),
                }
            }
            return Ok(a.forward_rows(x, &mut caches, rope));
        }
        let c = x.cols();
        let mut out = Mat::zeros(x.rows(), c);
        for (i, p) in parts.iter_mut().enumerate() {
            let rows = Mat::from_vec(p.rows.len(), c, x.as_slice()[p.rows.start * c..p.rows.end * c].to_vec());
            let y = self.forward(&rows, p.start, rope, p.state).map_err(|e| (i, e))?;
            out.as_mut_slice()[p.rows.start * c..p.rows.end * c].copy_from_slice(y.as_slice());
        }
        Ok(out)
    }

    /// Whether `state` is this mixer's kind of state, with its widths.
    pub(crate) fn fits(&self, state: &LayerState) -> bool {
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
    pub(crate) fn new_state(&self) -> LayerState {
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
pub(crate) struct GqaAttention {
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
    /// Per-head learned sinks (gpt-oss `self_attn.sinks`, `[num_heads]`):
    /// an extra logit in each head's softmax whose probability is dropped.
    pub sinks: Option<Vec<f32>>,
}

impl GqaAttention {
    /// The q/k/v/o projections under `attn` (biases as `spec` says), the
    /// per-head q/k norms (Qwen3) and sinks (gpt-oss) when it has them.
    pub(crate) fn load(spec: &ModelSpec, attn: &WeightView<'_>, sliding_window: Option<usize>) -> Result<Self, ModelError> {
        let (h, hd) = (spec.hidden_size, spec.head_dim);
        let (nq, nkv) = (spec.num_heads * hd, spec.num_kv_heads * hd);
        let qk_norm = match spec.qk_norm {
            true => Some((attn.vector("q_norm.weight", hd)?, attn.vector("k_norm.weight", hd)?)),
            false => None,
        };
        Ok(GqaAttention {
            q_proj: attn.biased_linear("q_proj", nq, h, spec.qkv_bias)?,
            k_proj: attn.biased_linear("k_proj", nkv, h, spec.qkv_bias)?,
            v_proj: attn.biased_linear("v_proj", nkv, h, spec.qkv_bias)?,
            o_proj: attn.biased_linear("o_proj", h, nq, spec.o_bias)?,
            qk_norm,
            num_heads: spec.num_heads,
            num_kv_heads: spec.num_kv_heads,
            head_dim: hd,
            rms_norm_eps: spec.rms_norm_eps,
            sliding_window,
            sinks: match spec.attention_sinks {
                true => Some(attn.vector("sinks", spec.num_heads)?),
                false => None,
            },
        })
    }

    /// See [`Mixer::forward`].
    pub(crate) fn forward(&self, x: &Mat, start: usize, rope: &Rope, cache: &mut KvLayer) -> Mat {
        self.forward_rows(x, &mut [(0..x.rows(), start, cache)], rope)
    }

    /// See [`Mixer::forward_rows`]: `parts` are each sequence's rows of `x`,
    /// their first position and its cache. The q/k/v and output projections
    /// run once over every row (one matrix product: each weight read once
    /// for all sequences, each row's result as alone), then each row attends
    /// over its own sequence's cache.
    pub(crate) fn forward_rows(&self, x: &Mat, parts: &mut [(Range<usize>, usize, &mut KvLayer)], rope: &Rope) -> Mat {
        let hd = self.head_dim;
        let mut q = self.q_proj.forward(x);
        let mut k = self.k_proj.forward(x);
        let v = self.v_proj.forward(x);
        if let Some((qn, kn)) = &self.qk_norm {
            rms_norm_chunks_in_place(q.as_mut_slice(), hd, qn, self.rms_norm_eps);
            rms_norm_chunks_in_place(k.as_mut_slice(), hd, kn, self.rms_norm_eps);
        }
        for (rows, start, cache) in parts.iter_mut() {
            debug_assert_eq!(cache.len(), *start);
            for r in rows.clone() {
                let (cos, sin) = rope.cos_sin(*start + r - rows.start);
                for head in q.row_mut(r).chunks_exact_mut(hd) {
                    Rope::apply(head, &cos, &sin);
                }
                for head in k.row_mut(r).chunks_exact_mut(hd) {
                    Rope::apply(head, &cos, &sin);
                }
                cache.push(k.row(r), v.row(r));
            }
        }
        // Each row's cache and position, now that the caches hold every row.
        let mut row_of: Vec<Option<(&KvLayer, usize)>> = vec![None; x.rows()];
        for (rows, start, cache) in parts.iter() {
            for r in rows.clone() {
                row_of[r] = Some((&**cache, *start + r - rows.start));
            }
        }
        let scale = 1.0 / (hd as f32).sqrt();
        let group = self.num_heads / self.num_kv_heads;
        let mut out = Mat::zeros(x.rows(), self.num_heads * hd);
        // Rows are independent once the caches hold them: one task per row,
        // whichever sequence it belongs to (each row's sums in the same
        // order whatever the threads).
        out.as_mut_slice()
            .par_chunks_mut(self.num_heads * hd)
            .enumerate()
            .for_each_init(Vec::new, |scores, (r, out_row)| {
                let Some((cache, pos)) = row_of[r] else { return };
                let first = match self.sliding_window {
                    Some(w) => (pos + 1).saturating_sub(w),
                    None => 0,
                };
                for h in 0..self.num_heads {
                    let kvh = h / group;
                    let qh = &q.row(r)[h * hd..(h + 1) * hd];
                    scores.clear();
                    scores.extend((first..=pos).map(|j| dot(qh, &cache.key(j)[kvh * hd..(kvh + 1) * hd]) * scale));
                    match &self.sinks {
                        None => larder_tensor::ops::softmax_in_place(scores),
                        Some(sinks) => softmax_with_sink(scores, sinks[h]),
                    }
                    let o = &mut out_row[h * hd..(h + 1) * hd];
                    for (&p, j) in scores.iter().zip(first..=pos) {
                        axpy(p, &cache.value(j)[kvh * hd..(kvh + 1) * hd], o);
                    }
                }
            });
        self.o_proj.forward(&out)
    }
}

/// Softmax of `scores` with one extra logit `sink` in the denominator, the
/// sink's own probability dropped (transformers 5.24.0 gpt_oss
/// `eager_attention_forward`: the sink concatenated to the scores, the row's
/// max subtracted, softmax, the sink column removed).
pub(crate) fn softmax_with_sink(scores: &mut [f32], sink: f32) {
    let max = scores.iter().copied().fold(sink, f32::max);
    let mut sum = 0.0f32;
    for v in scores.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    sum += (sink - max).exp();
    let inv = 1.0 / sum;
    for v in scores.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sink_takes_its_share_of_the_probability() {
        let mut s = [0.0f32, 0.0];
        softmax_with_sink(&mut s, 0.0);
        assert_eq!(s, [1.0 / 3.0, 1.0 / 3.0]);
        // A very negative sink is no sink; a dominant one leaves almost nothing.
        let mut s = [1.0f32, 2.0];
        softmax_with_sink(&mut s, -1e4);
        let mut plain = [1.0f32, 2.0];
        larder_tensor::ops::softmax_in_place(&mut plain);
        assert_eq!(s, plain);
        let mut s = [1.0f32, 2.0];
        softmax_with_sink(&mut s, 50.0);
        assert!(s.iter().all(|&p| p < 1e-20));
    }
}
