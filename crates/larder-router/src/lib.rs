//! larder-router: which experts a token goes to, and with what weight.
//!
//! Routing is pure math on one row of router logits. Its output, a [`Route`],
//! lists the chosen experts in **canonical router order** (descending score,
//! ties broken by the lower expert id, the order `torch.topk` returns them).
//! The MoE step sums expert outputs in exactly this order, so results do not
//! depend on when or where expert bytes arrive.
//!
//! It also owns route traces ([`Trace`]: the file format, [`RouteStats`]:
//! what they say) and statistical routing ([`RoutingModel`]) for planning.

mod sigmoid;
mod softmax;
mod synthetic;
mod topk_softmax;
mod trace;
mod trace_stats;

// Routing functions.
pub use sigmoid::SigmoidGroupTopK;
pub use softmax::SoftmaxTopK;
pub use topk_softmax::TopKSoftmax;
// Route traces: the file format and what they say.
pub use trace::{Phase, Trace, TraceError, TraceHeader, TraceToken, MAX_EXPERTS, MAX_EXPERT_BYTES, TRACE_VERSION};
pub use trace_stats::{PassRoutes, RouteStats};
// Statistical routing for planning.
pub use synthetic::{with_predictions, RoutingModel};

/// The routing function of a MoE block.
#[derive(Debug, Clone, PartialEq)]
pub enum Router {
    Softmax(SoftmaxTopK),
    SigmoidGroup(SigmoidGroupTopK),
    /// gpt-oss: top-k over the (biased) logits, softmax over the k chosen.
    TopKSoftmax(TopKSoftmax),
}

impl Router {
    /// Routes one row of router logits.
    pub fn route(&self, logits: &[f32]) -> Route {
        match self {
            Router::Softmax(r) => r.route(logits),
            Router::SigmoidGroup(r) => r.route(logits),
            Router::TopKSoftmax(r) => r.route(logits),
        }
    }
}

/// One row's routing decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Chosen expert ids, canonical router order.
    pub experts: Vec<usize>,
    /// The weight applied to each chosen expert's output (same order).
    pub weights: Vec<f32>,
}

/// Errors from routing configuration.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum RouterError {
    #[error("top-k of {k} experts out of {n}: k must be between 1 and the number of experts")]
    TopK { k: usize, n: usize },
    #[error("{message}")]
    Groups { message: String },
}

/// Indices of the `k` largest `scores`, by descending score, ties to the lower
/// index. NaN scores sort last.
pub(crate) fn top_k_indices(scores: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| {
        let (sa, sb) = (scores[a], scores[b]);
        match sb.partial_cmp(&sa) {
            Some(o) if o != std::cmp::Ordering::Equal => o,
            Some(_) => a.cmp(&b),
            None => sa.is_nan().cmp(&sb.is_nan()).then(a.cmp(&b)),
        }
    });
    idx.truncate(k);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_orders_by_score_then_index() {
        assert_eq!(top_k_indices(&[0.1, 0.5, 0.5, 0.9], 3), vec![3, 1, 2]);
        assert_eq!(top_k_indices(&[f32::NAN, 1.0, 0.0], 2), vec![1, 2]);
    }
}
