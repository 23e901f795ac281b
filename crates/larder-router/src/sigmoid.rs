//! DeepSeek-V3 / Kimi-K2 routing: sigmoid scores; a per-expert correction
//! bias (`e_score_correction_bias`) used **for selection only**;
//! group-limited top-k (experts split into `n_group` groups, a group scored
//! by the sum of its two best biased scores, only the best `topk_group`
//! groups eligible); weights are the unbiased sigmoid scores of the chosen
//! experts, optionally normalised to sum to one (`norm_topk_prob`, with the
//! reference's 1e-20 guard), times `routed_scaling_factor`.
//!
//! Canonical order: descending biased score, ties to the lower expert id
//! (groups likewise: descending group score, ties to the lower group).

use crate::{top_k_indices, Route, RouterError};

/// Group-limited sigmoid top-k router.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SigmoidGroupTopK {
    pub num_experts: usize,
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub renormalize: bool,
    pub scaling: f32,
    /// Added to the scores for selection only (zeros when the checkpoint has none).
    pub bias: Vec<f32>,
}

impl SigmoidGroupTopK {
    pub fn new(
        num_experts: usize,
        top_k: usize,
        n_group: usize,
        topk_group: usize,
        renormalize: bool,
        scaling: f32,
        bias: Option<Vec<f32>>,
    ) -> Result<Self, RouterError> {
        if top_k == 0 || top_k > num_experts {
            return Err(RouterError::TopK { k: top_k, n: num_experts });
        }
        if n_group == 0 || !num_experts.is_multiple_of(n_group) {
            return Err(RouterError::Groups {
                message: format!("n_group {n_group} must divide the {num_experts} experts"),
            });
        }
        if topk_group == 0 || topk_group > n_group {
            return Err(RouterError::Groups {
                message: format!("topk_group {topk_group} must be between 1 and n_group ({n_group})"),
            });
        }
        if top_k > topk_group * (num_experts / n_group) {
            return Err(RouterError::Groups {
                message: format!(
                    "top-{top_k} cannot be chosen from {topk_group} groups of {} experts",
                    num_experts / n_group
                ),
            });
        }
        let bias = bias.unwrap_or_else(|| vec![0.0; num_experts]);
        if bias.len() != num_experts {
            return Err(RouterError::Groups {
                message: format!("e_score_correction_bias has {} values for {num_experts} experts", bias.len()),
            });
        }
        Ok(SigmoidGroupTopK {
            num_experts,
            top_k,
            n_group,
            topk_group,
            renormalize,
            scaling,
            bias,
        })
    }

    /// Routes one row of router logits.
    pub fn route(&self, logits: &[f32]) -> Route {
        let scores: Vec<f32> = logits.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect();
        let biased: Vec<f32> = scores.iter().zip(&self.bias).map(|(s, b)| s + b).collect();
        let size = self.num_experts / self.n_group;
        let group_scores: Vec<f32> = biased
            .chunks_exact(size)
            .map(|g| top_k_indices(g, 2.min(size)).iter().map(|&i| g[i]).sum())
            .collect();
        let groups = top_k_indices(&group_scores, self.topk_group);
        let masked: Vec<f32> = biased
            .iter()
            .enumerate()
            .map(|(e, &s)| if groups.contains(&(e / size)) { s } else { f32::NEG_INFINITY })
            .collect();
        let experts = top_k_indices(&masked, self.top_k);
        let mut weights: Vec<f32> = experts.iter().map(|&e| scores[e]).collect();
        if self.renormalize {
            let denominator = weights.iter().sum::<f32>() + 1e-20;
            for w in weights.iter_mut() {
                *w /= denominator;
            }
        }
        for w in weights.iter_mut() {
            *w *= self.scaling;
        }
        Route { experts, weights }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logit(p: f32) -> f32 {
        (p / (1.0 - p)).ln()
    }

    #[test]
    fn groups_limit_the_choice() {
        // 8 experts in 4 groups of 2; only the best 2 groups are eligible.
        let probs = [0.9, 0.1, 0.2, 0.2, 0.8, 0.7, 0.3, 0.95];
        let logits: Vec<f32> = probs.iter().map(|&p| logit(p)).collect();
        let r = SigmoidGroupTopK::new(8, 3, 4, 2, false, 1.0, None).unwrap().route(&logits);
        // Group sums: g0 1.0, g1 0.4, g2 1.5, g3 1.25 -> groups 2 and 3.
        assert_eq!(r.experts, vec![7, 4, 5]);
        for (w, e) in r.weights.iter().zip(&r.experts) {
            assert!((w - probs[*e]).abs() < 1e-6);
        }
        // Without group limits, expert 0 (0.9) would be second.
        let r = SigmoidGroupTopK::new(8, 3, 1, 1, false, 1.0, None).unwrap().route(&logits);
        assert_eq!(r.experts, vec![7, 0, 4]);
    }

    #[test]
    fn bias_selects_but_does_not_weigh() {
        let logits = [0.0f32, 1.0, 2.0, 3.0];
        let bias = vec![10.0, 0.0, 0.0, 0.0];
        let r = SigmoidGroupTopK::new(4, 2, 1, 1, false, 1.0, Some(bias)).unwrap().route(&logits);
        assert_eq!(r.experts, vec![0, 3]);
        assert!((r.weights[0] - 0.5).abs() < 1e-6, "weight is the unbiased sigmoid");
    }

    #[test]
    fn normalisation_and_scaling() {
        let logits = [0.0f32, 0.0, 5.0, 0.0];
        let r = SigmoidGroupTopK::new(4, 2, 2, 2, true, 2.5, None).unwrap().route(&logits);
        assert_eq!(r.experts, vec![2, 0], "ties go to the lower id");
        assert!((r.weights.iter().sum::<f32>() - 2.5).abs() < 1e-5);
    }

    #[test]
    fn ties_between_groups_go_to_the_lower_group() {
        let logits = [0.0f32; 8];
        let r = SigmoidGroupTopK::new(8, 2, 4, 1, false, 1.0, None).unwrap().route(&logits);
        assert_eq!(r.experts, vec![0, 1]);
    }

    #[test]
    fn bad_settings_are_errors() {
        assert!(SigmoidGroupTopK::new(8, 2, 3, 1, false, 1.0, None).is_err());
        assert!(SigmoidGroupTopK::new(8, 2, 4, 5, false, 1.0, None).is_err());
        assert!(SigmoidGroupTopK::new(8, 5, 4, 1, false, 1.0, None).is_err());
        assert!(SigmoidGroupTopK::new(8, 2, 4, 1, false, 1.0, Some(vec![0.0; 7])).is_err());
    }
}
