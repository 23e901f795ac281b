//! Top-k-then-softmax routing (gpt-oss, transformers' `GptOssTopKRouter`):
//! the `k` largest router logits (the router's bias already added to them),
//! then a softmax over those `k` logits only. The weights sum to one by
//! construction; experts outside the top k take no part in the softmax.

use crate::{top_k_indices, Route, RouterError};

/// Top-k-then-softmax router settings.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct TopKSoftmax {
    pub num_experts: usize,
    pub top_k: usize,
}

impl TopKSoftmax {
    pub fn new(num_experts: usize, top_k: usize) -> Result<Self, RouterError> {
        if top_k == 0 || top_k > num_experts {
            return Err(RouterError::TopK { k: top_k, n: num_experts });
        }
        Ok(TopKSoftmax { num_experts, top_k })
    }

    /// Routes one row of (biased) router logits, length `num_experts`.
    pub fn route(&self, logits: &[f32]) -> Route {
        topk_softmax(logits, self.top_k)
    }
}

/// The `k` largest `logits` in canonical order (descending, ties to the
/// lower id), weighted by the softmax over those `k` logits (max-subtracted,
/// in f32, as `torch.softmax(top_values)`).
pub(crate) fn topk_softmax(logits: &[f32], k: usize) -> Route {
    let experts = top_k_indices(logits, k);
    let chosen: Vec<f32> = experts.iter().map(|&e| logits[e]).collect();
    let max = chosen.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut weights: Vec<f32> = chosen.iter().map(|&l| (l - max).exp()).collect();
    let sum: f32 = weights.iter().sum();
    for w in weights.iter_mut() {
        *w /= sum;
    }
    Route { experts, weights }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_runs_over_the_chosen_logits_only() {
        // Experts 1 and 3 win; expert 0's logit must not enter the softmax.
        let r = topk_softmax(&[0.5, 2.0, -1.0, 1.0], 2);
        assert_eq!(r.experts, vec![1, 3]);
        let (a, b) = (1.0f32.exp(), 0.0f32.exp());
        let want = [a / (a + b), b / (a + b)];
        for (w, x) in r.weights.iter().zip(want) {
            assert!((w - x).abs() < 1e-7, "{:?}", r.weights);
        }
        assert!((r.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn ties_go_to_the_lower_id_with_equal_weights() {
        let r = topk_softmax(&[1.0, 3.0, 3.0, 3.0], 2);
        assert_eq!(r.experts, vec![1, 2]);
        assert_eq!(r.weights, vec![0.5, 0.5]);
    }

    #[test]
    fn differs_from_softmax_over_all_experts() {
        // Softmax over all four, top-2, is not renormalised: here it would
        // give weights that do not sum to one.
        let logits = [0.0, 1.0, 2.0, 3.0];
        let all = crate::softmax::softmax_topk(&logits, 2, false);
        let sel = topk_softmax(&logits, 2);
        assert_eq!(all.experts, sel.experts);
        assert!(all.weights.iter().sum::<f32>() < 0.99);
        assert!((sel.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn rejects_bad_k() {
        assert!(TopKSoftmax::new(4, 0).is_err());
        assert!(TopKSoftmax::new(4, 5).is_err());
        assert_eq!(TopKSoftmax::new(4, 4).unwrap().route(&[1.0; 4]).experts, vec![0, 1, 2, 3]);
    }
}
