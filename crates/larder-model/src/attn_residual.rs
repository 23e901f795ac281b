//! Block attention residuals (Kimi K3's `attn_res_block_size`), as Moonshot's
//! `modeling_kimi_linear.py` computes them (`_apply_attn_res`,
//! `KimiDecoderLayer._forward_attn_residual`, `KimiLinearModel.forward`;
//! docs/kimi_k3_reference.md §1.3).
//!
//! Per position the model keeps a list of block snapshots (empty at the
//! embeddings). Each site (a layer's mixer input, its MLP input, the final
//! norm's input) mixes the stack `V = [snapshots..., partial]`: score `s_j =
//! Σ_d rmsnorm(V_j)[d] · proj[d]` (the site's `*_res_norm` RMSNorm at
//! `rms_norm_eps`, then its `*_res_proj` `Linear(hidden, 1)`; no further
//! scale), `π = softmax(s)` over the stack, output `Σ_j π_j V_j` of the
//! *un-normalised* vectors. Layer `l > 0` mixes its mixer input (layer 0's
//! `self_attention_res_*` ship but are never read); at a block boundary (`l
//! % n == 0`) the layer input becomes a new snapshot and the stream restarts
//! from the mixer output, else the mixer output is added; the MLP input is
//! always mixed; after the last layer `model.output_attn_res_*` mixes the
//! final norm's input.
//!
//! Everything is per position (mixing over depth, not time): no sequence
//! state, and each row is computed on its own in a fixed order, so chunking
//! and batching stay bit-identical (docs/design.md §3).

use larder_tensor::ops::{rms_norm_row, softmax_in_place};
use larder_tensor::Mat;

use crate::error::ModelError;
use crate::source::WeightView;

/// One mixing site: its RMSNorm and its one-output projection.
#[derive(Debug, Clone)]
pub(crate) struct DepthAttention {
    /// `{site}_res_norm.weight` `[hidden]`.
    norm: Vec<f32>,
    /// `{site}_res_proj.weight` `[1, hidden]`, as a row.
    proj: Vec<f32>,
    /// `rms_norm_eps`.
    eps: f32,
}

impl DepthAttention {
    /// Loads `{site}_res_norm.weight` `[hidden]` and `{site}_res_proj.weight`
    /// `[1, hidden]` under `weights` (any shipped float dtype, widened to
    /// f32); a missing tensor or another shape is an error naming it.
    pub(crate) fn load(weights: &WeightView<'_>, site: &str, hidden: usize, eps: f32) -> Result<Self, ModelError> {
        let norm = weights.pp(format!("{site}_res_norm")).vector("weight", hidden)?;
        let (proj, _) = weights.pp(format!("{site}_res_proj")).tensor_f32_any("weight", &[&[1, hidden]])?;
        Ok(Self::new(norm, proj, eps))
    }

    pub(crate) fn new(norm: Vec<f32>, proj: Vec<f32>, eps: f32) -> Self {
        DepthAttention { norm, proj, eps }
    }

    /// Per row: the mix of `[blocks[0], .., blocks[n-1], partial]` (all
    /// `[rows, hidden]`).
    pub(crate) fn forward(&self, blocks: &[Mat], partial: &Mat) -> Mat {
        let h = partial.cols();
        let depth = blocks.len() + 1;
        let mut out = Mat::zeros(partial.rows(), h);
        let mut normed = vec![0.0f32; h];
        let mut weights = vec![0.0f32; depth];
        for r in 0..partial.rows() {
            let stack = || blocks.iter().map(|b| b.row(r)).chain([partial.row(r)]);
            for (v, w) in stack().zip(weights.iter_mut()) {
                rms_norm_row(v, &self.norm, self.eps, &mut normed);
                let dot: f64 = self.proj.iter().zip(&normed).map(|(&p, &k)| p as f64 * k as f64).sum();
                *w = dot as f32;
            }
            softmax_in_place(&mut weights);
            let o = out.row_mut(r);
            for (&w, v) in weights.iter().zip(stack()) {
                for (o, &v) in o.iter_mut().zip(v) {
                    *o += w * v;
                }
            }
        }
        out
    }
}

/// One decoder layer's attention-residual inputs.
#[derive(Debug, Clone)]
pub(crate) struct LayerAttnRes {
    /// `model.layers.{l}.self_attention_res_*` (not read for layer 0: its
    /// mixer reads the embeddings).
    pub attention_input: Option<DepthAttention>,
    /// `model.layers.{l}.mlp_res_*`.
    pub mlp_input: DepthAttention,
    /// `l % attn_res_block_size == 0`.
    pub block_boundary: bool,
}

impl LayerAttnRes {
    /// Layer `layer`'s sites under `weights` (`model.layers.{layer}`), with
    /// `block` layers per block and norms at `eps`.
    pub(crate) fn load(weights: &WeightView<'_>, layer: usize, block: usize, hidden: usize, eps: f32) -> Result<Self, ModelError> {
        let attention_input = match layer {
            0 => None,
            _ => Some(DepthAttention::load(weights, "self_attention", hidden, eps)?),
        };
        Ok(LayerAttnRes {
            attention_input,
            mlp_input: DepthAttention::load(weights, "mlp", hidden, eps)?,
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
    /// restarts from `mixed`; elsewhere `x = x + mixed`.
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

    /// A hand-computed two-entry mix: scores from the normed vectors, the
    /// un-normalised vectors mixed.
    #[test]
    fn mixes_the_unnormalised_stack_by_normed_scores() {
        let a = DepthAttention::new(vec![1.0, 2.0], vec![0.5, -1.0], 1e-5);
        let blocks = [Mat::from_vec(1, 2, vec![3.0, 4.0])];
        let partial = Mat::from_vec(1, 2, vec![-1.0, 0.0]);
        let out = a.forward(&blocks, &partial);
        let s0 = {
            let inv = 1.0 / (12.5f32 + 1e-5).sqrt();
            0.5 * (3.0 * inv) - 2.0 * (4.0 * inv)
        };
        let s1 = 0.5 * (-1.0 / (0.5f32 + 1e-5).sqrt());
        let (e0, e1) = ((s0 - s0.max(s1)).exp(), (s1 - s0.max(s1)).exp());
        let (p0, p1) = (e0 / (e0 + e1), e1 / (e0 + e1));
        let want = [p0 * 3.0 - p1, p0 * 4.0];
        for (g, w) in out.row(0).iter().zip(want) {
            assert!((g - w).abs() < 1e-5, "{g} vs {w}");
        }
    }

    #[test]
    fn rows_are_independent_of_their_batch() {
        let a = DepthAttention::new(vec![1.1, 0.9, 1.0], vec![0.7, -1.3, 2.0], 1e-5);
        let blocks = [Mat::from_vec(2, 3, vec![1.0, 2.0, 3.0, -4.0, 0.5, 0.25])];
        let partial = Mat::from_vec(2, 3, vec![0.1, -0.2, 0.3, 9.0, 8.0, -7.0]);
        let both = a.forward(&blocks, &partial);
        for r in 0..2 {
            let one = a.forward(&[blocks[0].gather_rows(&[r])], &partial.gather_rows(&[r]));
            assert_eq!(one.row(0), both.row(r));
        }
    }
}
