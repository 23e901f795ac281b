//! What a route trace says about routing, independent of any cache: how
//! skewed expert popularity is, how soon a token's experts come back (reuse
//! distance), how many experts consecutive tokens share, and how well a
//! later layer's router guesses its experts from an earlier layer's input
//! (recall by lookahead depth). Cache hit curves (LRU, Belady) are the
//! store's simulator's job; [`Trace::passes`] gives it the request order.
//!
//! Everything here is sized by the routes a trace holds, never by the
//! expert count its header claims: popularity counts only the experts
//! routed to (one never routed to adds a zero, which no hottest share
//! takes ahead of a used one).

use std::collections::HashMap;

use serde::Serialize;

use crate::trace::{Phase, Trace};

/// Shares of the hottest experts whose route shares [`RouteStats::popularity`] reports.
pub(crate) const HOT_SHARES: [f64; 4] = [0.1, 0.2, 0.3, 0.5];
/// Upper bounds (in tokens) of the reuse-distance buckets; the last bucket is open.
pub(crate) const REUSE_BUCKETS: [usize; 6] = [1, 2, 4, 8, 16, 64];

/// One forward pass as a cache sees it: per MoE layer, the union of its
/// rows' experts (ascending), and how many tokens it carried.
#[derive(Debug, Clone, PartialEq)]
pub struct PassRoutes {
    pub tokens: usize,
    pub phase: Phase,
    pub layers: Vec<Vec<usize>>,
    /// Per MoE layer, the union of the experts the previous MoE layer's
    /// router picked for it (the trace's lookahead depth 1; empty when not
    /// recorded and for the first MoE layer).
    pub predicted: Vec<Vec<usize>>,
}

/// Routing statistics of a trace (or of one phase of it).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouteStats {
    pub tokens: usize,
    pub routes: usize,
    /// `(x, y)`: the hottest share `x` of each layer's experts took share `y`
    /// of that layer's routes (summed over layers), for `x` in `HOT_SHARES` (0.1, 0.2, 0.3, 0.5).
    pub popularity: Vec<(f64, f64)>,
    /// `(bucket upper bound, share)`: the share of routes whose expert the
    /// same sequence used at the same layer at most that many tokens before
    /// (`None`: further back); `first_use` is the share never used before.
    pub reuse_distance: Vec<(Option<usize>, f64)>,
    pub first_use: f64,
    /// Mean share of a token's experts the previous token of its sequence
    /// also chose at that layer (uniform routing: about top_k / experts).
    pub consecutive_overlap: f64,
    /// `(depth, recall)`: the share of a layer's experts its router picks on
    /// the input of the MoE layer `depth` earlier (depth 1 is prefetch).
    pub lookahead_recall: Vec<(usize, f64)>,
}

impl Trace {
    /// The passes in order, each layer's experts as one union (what the
    /// engine requests from the store: each expert once per pass and layer).
    pub fn passes(&self) -> Vec<PassRoutes> {
        let mut out: Vec<PassRoutes> = Vec::new();
        let mut current = None;
        for t in &self.tokens {
            if current != Some(t.pass) {
                current = Some(t.pass);
                out.push(PassRoutes {
                    tokens: 0,
                    phase: t.phase,
                    layers: vec![Vec::new(); self.header.moe_layers.len()],
                    predicted: vec![Vec::new(); self.header.moe_layers.len()],
                });
            }
            let Some(p) = out.last_mut() else { continue };
            p.tokens += 1;
            for (union, experts) in p.layers.iter_mut().zip(&t.routes) {
                union.extend(experts);
            }
            if let Some(depth1) = t.predicted.first() {
                for (union, experts) in p.predicted.iter_mut().zip(depth1) {
                    union.extend(experts);
                }
            }
        }
        for p in &mut out {
            for union in p.layers.iter_mut().chain(&mut p.predicted) {
                union.sort_unstable();
                union.dedup();
            }
        }
        out
    }

    /// How often each (MoE layer index, expert) was routed to: the heat a
    /// store would have learned from this workload.
    pub fn heat(&self) -> HashMap<(usize, usize), u64> {
        let mut heat = HashMap::new();
        for t in &self.tokens {
            for (i, experts) in t.routes.iter().enumerate() {
                for &e in experts {
                    *heat.entry((i, e)).or_insert(0) += 1;
                }
            }
        }
        heat
    }

    /// Routing statistics over the tokens of `phase` (all tokens: `None`).
    /// Reuse and overlap look back over every earlier token of a sequence.
    pub fn route_stats(&self, phase: Option<Phase>) -> RouteStats {
        let h = &self.header;
        let layers = h.moe_layers.len();
        let counted = |t: &crate::trace::TraceToken| phase.is_none_or(|p| t.phase == p);
        // Per layer, routes per expert routed to (sparse: see the module doc).
        let mut counts: Vec<HashMap<usize, u64>> = vec![HashMap::new(); layers];
        let mut last_use: HashMap<(usize, usize, usize), usize> = HashMap::new();
        let mut previous: HashMap<usize, usize> = HashMap::new(); // seq -> token index
        let mut seq_index: HashMap<usize, usize> = HashMap::new(); // seq -> tokens seen
        let mut buckets = vec![0u64; REUSE_BUCKETS.len() + 1];
        let (mut first, mut routes, mut tokens) = (0u64, 0u64, 0usize);
        let (mut overlap_sum, mut overlap_n) = (0.0, 0u64);
        let (mut hits, mut wanted) = (vec![0u64; h.lookahead], vec![0u64; h.lookahead]);
        for (ti, t) in self.tokens.iter().enumerate() {
            let n = seq_index.entry(t.seq).or_insert(0);
            let now = *n;
            *n += 1;
            let prev = previous.insert(t.seq, ti);
            if !counted(t) {
                for (l, experts) in t.routes.iter().enumerate() {
                    for &e in experts {
                        last_use.insert((t.seq, l, e), now);
                    }
                }
                continue;
            }
            tokens += 1;
            for (l, experts) in t.routes.iter().enumerate() {
                for &e in experts {
                    *counts[l].entry(e).or_insert(0) += 1;
                    routes += 1;
                    match last_use.insert((t.seq, l, e), now) {
                        None => first += 1,
                        Some(at) => {
                            let d = now - at;
                            let b = REUSE_BUCKETS.iter().position(|&ub| d <= ub).unwrap_or(REUSE_BUCKETS.len());
                            buckets[b] += 1;
                        }
                    }
                }
                if let Some(p) = prev.map(|p| &self.tokens[p].routes[l]).filter(|_| !experts.is_empty()) {
                    overlap_sum += experts.iter().filter(|e| p.contains(e)).count() as f64 / experts.len() as f64;
                    overlap_n += 1;
                }
                for (d, depth) in t.predicted.iter().enumerate() {
                    if l > d {
                        wanted[d] += experts.len() as u64;
                        hits[d] += experts.iter().filter(|e| depth[l].contains(e)).count() as u64;
                    }
                }
            }
        }
        let share = |x: u64, of: u64| if of == 0 { 0.0 } else { x as f64 / of as f64 };
        RouteStats {
            tokens,
            routes: routes as usize,
            popularity: HOT_SHARES.iter().map(|&x| (x, hot_share(&counts, h.experts, x))).collect(),
            reuse_distance: (0..buckets.len())
                .map(|b| (REUSE_BUCKETS.get(b).copied(), share(buckets[b], routes)))
                .collect(),
            first_use: share(first, routes),
            consecutive_overlap: if overlap_n == 0 { 0.0 } else { overlap_sum / overlap_n as f64 },
            lookahead_recall: (0..h.lookahead).map(|d| (d + 1, share(hits[d], wanted[d]))).collect(),
        }
    }
}

/// Share of all routes taken by the hottest `fraction` of each layer's
/// `experts` experts, from the counts of those routed to (the rest count 0).
fn hot_share(counts: &[HashMap<usize, u64>], experts: usize, fraction: f64) -> f64 {
    let (mut hot, mut all) = (0u64, 0u64);
    for layer in counts {
        let mut sorted: Vec<u64> = layer.values().copied().collect();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let take = ((experts as f64 * fraction).round() as usize).max(1);
        hot += sorted.iter().take(take).sum::<u64>();
        all += sorted.iter().sum::<u64>();
    }
    if all == 0 {
        0.0
    } else {
        hot as f64 / all as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{TraceHeader, TraceToken, TRACE_VERSION};

    fn trace(routes: &[[usize; 2]], predicted: bool) -> Trace {
        let header = TraceHeader {
            larder_trace: TRACE_VERSION,
            model: "m".into(),
            experts: 10,
            top_k: 2,
            moe_layers: vec![0, 1],
            expert_bytes: vec![1, 1],
            lookahead: usize::from(predicted),
        };
        let tokens = routes
            .iter()
            .enumerate()
            .map(|(i, r)| TraceToken {
                seq: 0,
                pos: i,
                phase: if i < 2 { Phase::Prompt } else { Phase::Decode },
                pass: i.saturating_sub(1),
                routes: vec![r.to_vec(), r.to_vec()],
                predicted: if predicted { vec![vec![vec![], vec![r[0], 9]]] } else { vec![] },
            })
            .collect();
        Trace { header, tokens }
    }

    #[test]
    fn passes_take_the_union_of_their_rows() {
        let t = trace(&[[0, 1], [1, 2], [3, 4]], false);
        let p = t.passes();
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].tokens, &p[0].layers[0]), (2, &vec![0, 1, 2]));
        assert_eq!(p[1].layers[1], vec![3, 4]);
        assert!(p[0].predicted.iter().all(Vec::is_empty));
        let p = trace(&[[0, 1], [1, 2], [3, 4]], true).passes();
        assert_eq!(p[0].predicted, vec![vec![], vec![0, 1, 9]]);
        assert_eq!(p[1].predicted[1], vec![3, 9]);
    }

    #[test]
    fn reuse_overlap_popularity_and_recall() {
        let t = trace(&[[0, 1], [0, 2], [0, 1], [5, 6]], true);
        let s = t.route_stats(None);
        assert_eq!((s.tokens, s.routes), (4, 16));
        // Layer by layer: 0,1 first; 0 at distance 1, 2 first; 0 at 1, 1 at 2; 5, 6 first.
        assert!((s.first_use - 10.0 / 16.0).abs() < 1e-9);
        assert!((s.reuse_distance[0].1 - 4.0 / 16.0).abs() < 1e-9);
        assert!((s.reuse_distance[1].1 - 2.0 / 16.0).abs() < 1e-9);
        // Overlaps 1/2, 1/2, 0 at both layers.
        assert!((s.consecutive_overlap - 1.0 / 3.0).abs() < 1e-9);
        // The hottest 10% (1 expert of 10): expert 0, 3 of 8 routes per layer.
        assert!((s.popularity[0].1 - 3.0 / 8.0).abs() < 1e-9);
        // Layer 1 predicted [r0, 9]: half of its experts.
        assert_eq!(s.lookahead_recall, vec![(1, 0.5)]);
        let decode = t.route_stats(Some(Phase::Decode));
        assert_eq!(decode.tokens, 2);
        assert!((decode.first_use - 0.5).abs() < 1e-9, "{decode:?}");
    }
}
