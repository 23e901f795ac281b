//! Block attention residuals (Kimi Linear's K3 extension
//! `n_layers_per_attn_res_block`), as transformers 5.24.0's inkling2
//! computes them (`models/inkling2/modeling_inkling2.py`:
//! `Inkling2BlockAttentionResidual`, `Inkling2UnweightedRMSNorm`,
//! `Inkling2SlidingDecoderLayer.forward`, `Inkling2TextModel.forward`;
//! docs/kimi_linear.md, "Attention-residual blocks").
//!
//! Per position the model keeps a list of block states (empty at the
//! embeddings). A learned query `[hidden]` attends over the depth axis: the
//! stack `[block states..., partial]`, each vector RMS-normalised without a
//! weight (eps 1e-6), is both keys and values; scores are `query · v ·
//! hidden^-0.5`, softmaxed over the stack. Layer `l > 0` replaces its mixer
//! input by `attention_input` over (blocks, stream); at a block boundary
//! (`l % n == 0`) the layer input becomes a new block state and the stream
//! restarts from the mixer output, else the mixer output is added; the MLP
//! input is `mlp_input` over (blocks, stream); after the last layer
//! `final_input` feeds the final norm. inkling2's full-attention layers use
//! three queries (separate q/k/v inputs); Kimi Linear's MLA and KDA take one
//! input, so every layer uses the one-query form.
//!
//! Everything is per position (attention over depth, not time): no sequence
//! state, and each row is computed on its own in a fixed order, so chunking
//! and batching stay bit-identical (docs/design.md §3).

use larder_tensor::ops::softmax_in_place;
use larder_tensor::Mat;

use crate::error::ModelError;
use crate::source::WeightView;

/// `Inkling2UnweightedRMSNorm`'s eps (its default; not `rms_norm_eps`).
pub(crate) const UNWEIGHTED_NORM_EPS: f32 = 1e-6;

/// One learned query attending over the depth axis (`*_input.query`).
#[derive(Debug, Clone)]
pub(crate) struct DepthAttention {
    query: Vec<f32>,
    /// `hidden^-0.5`, rounded to f32 as torch applies it.
    scale: f32,
}

impl DepthAttention {
    /// Loads the `[hidden]` `query` under `module` (`*_input`; any shipped
    /// float dtype, widened to f32); a missing tensor is an error naming it.
    pub(crate) fn load(module: &WeightView<'_>, hidden: usize) -> Result<Self, ModelError> {
        Ok(Self::new(module.vector("query", hidden)?))
    }

    pub(crate) fn new(query: Vec<f32>) -> Self {
        let scale = (query.len() as f64).powf(-0.5) as f32;
        DepthAttention { query, scale }
    }

    /// Per row: attention of the query over `[blocks[0], .., blocks[n-1],
    /// partial]` (all `[rows, hidden]`).
    pub(crate) fn forward(&self, blocks: &[Mat], partial: &Mat) -> Mat {
        let h = partial.cols();
        let depth = blocks.len() + 1;
        let mut out = Mat::zeros(partial.rows(), h);
        let mut normed = vec![0.0f32; depth * h];
        let mut weights = vec![0.0f32; depth];
        for r in 0..partial.rows() {
            let stack = blocks.iter().map(|b| b.row(r)).chain([partial.row(r)]);
            for ((v, dst), w) in stack.zip(normed.chunks_exact_mut(h)).zip(weights.iter_mut()) {
                unweighted_rms_norm(v, dst);
                let dot: f64 = self.query.iter().zip(dst.iter()).map(|(&q, &k)| q as f64 * k as f64).sum();
                *w = dot as f32 * self.scale;
            }
            softmax_in_place(&mut weights);
            let o = out.row_mut(r);
            for (&w, v) in weights.iter().zip(normed.chunks_exact(h)) {
                for (o, &v) in o.iter_mut().zip(v) {
                    *o += w * v;
                }
            }
        }
        out
    }
}

/// `x * rsqrt(mean(x^2) + 1e-6)` in f32 (mean accumulated in f64, rounded once).
fn unweighted_rms_norm(x: &[f32], out: &mut [f32]) {
    let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
    let inv = 1.0 / ((ss / x.len() as f64) as f32 + UNWEIGHTED_NORM_EPS).sqrt();
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v * inv;
    }
}

/// One decoder layer's attention-residual inputs.
#[derive(Debug, Clone)]
pub(crate) struct LayerAttnRes {
    /// `model.layers.{l}.attention_input` (absent for layer 0: its mixer
    /// reads the embeddings).
    pub attention_input: Option<DepthAttention>,
    /// `model.layers.{l}.mlp_input`.
    pub mlp_input: DepthAttention,
    /// `l % n_layers_per_attn_res_block == 0`.
    pub block_boundary: bool,
}

impl LayerAttnRes {
    /// Layer `layer`'s queries under `weights` (`model.layers.{layer}`), with
    /// `block` layers per block.
    pub(crate) fn load(weights: &WeightView<'_>, layer: usize, block: usize, hidden: usize) -> Result<Self, ModelError> {
        let attention_input = match layer {
            0 => None,
            _ => Some(DepthAttention::load(&weights.pp("attention_input"), hidden)?),
        };
        Ok(LayerAttnRes {
            attention_input,
            mlp_input: DepthAttention::load(&weights.pp("mlp_input"), hidden)?,
            block_boundary: layer.is_multiple_of(block),
        })
    }

    /// The mixer's input (before `input_layernorm`): `None` means the
    /// stream `x` itself (layer 0).
    pub(crate) fn mixer_input(&self, blocks: &[Mat], x: &Mat) -> Option<Mat> {
        self.attention_input.as_ref().map(|a| a.forward(blocks, x))
    }

    /// Folds the mixer output `mixed` into the stream `x` (the layer input)
    /// and returns the MLP input (before `post_attention_layernorm`). At a
    /// block boundary the layer input is appended to `blocks` and the stream
    /// restarts from `mixed`; elsewhere `x = x + mixed`. inkling2 appends the
    /// same layer input twice, inside the layer (for `mlp_input`) and in the
    /// model loop after the layer (for the next layers): one append here is
    /// both.
    pub(crate) fn after_mixer(&self, blocks: &mut Vec<Mat>, x: &mut Mat, mixed: Mat) -> Mat {
        if self.block_boundary {
            blocks.push(std::mem::replace(x, mixed));
        } else {
            x.add_assign(&mixed);
        }
        self.mlp_input.forward(blocks, x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_query_averages_the_normalised_stack() {
        let a = DepthAttention::new(vec![0.0; 2]);
        let blocks = [Mat::from_vec(1, 2, vec![3.0, 4.0])];
        let partial = Mat::from_vec(1, 2, vec![-1.0, 0.0]);
        let out = a.forward(&blocks, &partial);
        let inv = 1.0 / (12.5f32 + 1e-6).sqrt();
        let unit = 1.0 / (0.5f32 + 1e-6).sqrt();
        let want = [0.5 * (3.0 * inv) + 0.5 * -unit, 0.5 * (4.0 * inv)];
        for (g, w) in out.row(0).iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{g} vs {w}");
        }
    }

    #[test]
    fn rows_are_independent_of_their_batch() {
        let a = DepthAttention::new(vec![0.7, -1.3, 2.0]);
        let blocks = [Mat::from_vec(2, 3, vec![1.0, 2.0, 3.0, -4.0, 0.5, 0.25])];
        let partial = Mat::from_vec(2, 3, vec![0.1, -0.2, 0.3, 9.0, 8.0, -7.0]);
        let both = a.forward(&blocks, &partial);
        for r in 0..2 {
            let one = a.forward(&[blocks[0].gather_rows(&[r])], &partial.gather_rows(&[r]));
            assert_eq!(one.row(0), both.row(r));
        }
    }
}
