//! Softmax routing (Mixtral, Qwen2-MoE, Qwen3-MoE): softmax over all experts
//! in f32, top-k, and optionally renormalise the k weights to sum to one.

use crate::{top_k_indices, Route, RouterError};

/// Softmax top-k router settings.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct SoftmaxTopK {
    pub num_experts: usize,
    pub top_k: usize,
    /// Divide the chosen weights by their sum (`norm_topk_prob`; Mixtral always does).
    pub renormalize: bool,
}

impl SoftmaxTopK {
    pub fn new(num_experts: usize, top_k: usize, renormalize: bool) -> Result<Self, RouterError> {
        if top_k == 0 || top_k > num_experts {
            return Err(RouterError::TopK { k: top_k, n: num_experts });
        }
        Ok(SoftmaxTopK {
            num_experts,
            top_k,
            renormalize,
        })
    }

    /// Routes one row of router logits (length `num_experts`).
    pub fn route(&self, logits: &[f32]) -> Route {
        softmax_topk(logits, self.top_k, self.renormalize)
    }
}

/// Softmax over `logits`, then the `k` most probable experts in canonical order.
pub(crate) fn softmax_topk(logits: &[f32], k: usize, renormalize: bool) -> Route {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut probs: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f32 = probs.iter().sum();
    for p in probs.iter_mut() {
        *p /= sum;
    }
    let experts = top_k_indices(&probs, k);
    let mut weights: Vec<f32> = experts.iter().map(|&e| probs[e]).collect();
    if renormalize {
        let s: f32 = weights.iter().sum();
        for w in weights.iter_mut() {
            *w /= s;
        }
    }
    Route { experts, weights }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renormalised_weights_sum_to_one() {
        let r = softmax_topk(&[1.0, 3.0, 2.0, 0.0], 2, true);
        assert_eq!(r.experts, vec![1, 2]);
        assert!((r.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(r.weights[0] > r.weights[1]);
    }

    #[test]
    fn raw_probabilities_without_renorm() {
        let r = softmax_topk(&[0.0, 0.0, 0.0, 0.0], 2, false);
        assert_eq!(r.experts, vec![0, 1]);
        assert_eq!(r.weights, vec![0.25, 0.25]);
    }

    #[test]
    fn rejects_bad_k() {
        assert!(SoftmaxTopK::new(4, 0, true).is_err());
        assert!(SoftmaxTopK::new(4, 5, true).is_err());
    }
}
