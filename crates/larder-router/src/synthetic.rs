//! Statistical routing: decode traces drawn from a few numbers instead of a
//! model, so the planner can replay "a model that routes like this" through
//! the cache simulator before any weights exist.
//!
//! A [`RoutingModel`] has two knobs. `skew` is the Zipf exponent of expert
//! popularity: expert of popularity rank r (a seeded permutation per layer) is
//! drawn with weight 1 / r^skew. `locality` is the chance that each of a
//! token's routes reuses one of the previous token's experts at that layer.
//! The presets are calibrated to published figures (docs/routing.md):
//! - `uniform` (GLM-class, Qwen3-Next-class: near-uniform routing): 0, 0.
//! - `local` (Qwen3-30B-A3B: experts come back within two tokens, LRU hit
//!   94.7% with 40% of experts cached): locality [`LOCAL_LOCALITY`].
//! - `skewed` (K3: 85.6% of decode routes in the hottest 30% of experts):
//!   the skew that puts [`SKEWED_HOT30`] of the weight in the hottest 30%.
//! - `mixed` (both at once, milder: K3-like popularity with half of the
//!   routes reused from the previous token).

use crate::trace::{Phase, Trace, TraceHeader, TraceToken};

/// Share of routes the hottest 30% of experts take under `skewed` (K3's heat).
pub const SKEWED_HOT30: f64 = 0.856;
/// `local`'s chance that a route repeats one of the previous token's experts
/// (an LRU cache of 40% of 128 experts, top-8, then hits about 94.7%).
pub const LOCAL_LOCALITY: f64 = 0.9;
/// `mixed`'s locality.
pub const MIXED_LOCALITY: f64 = 0.5;
/// The preset names.
pub const PRESETS: [&str; 4] = ["uniform", "local", "skewed", "mixed"];

/// How a synthetic stream of routes behaves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoutingModel {
    /// Zipf exponent of popularity (0: uniform).
    pub skew: f64,
    /// Chance a route reuses one of the previous token's experts (0 to 1).
    pub locality: f64,
}

impl RoutingModel {
    /// A preset (see the module doc) for layers of `experts` experts.
    pub fn preset(name: &str, experts: usize) -> Result<RoutingModel, String> {
        let skew = || skew_for_hot_share(experts, 0.3, SKEWED_HOT30);
        Ok(match name {
            "uniform" => RoutingModel { skew: 0.0, locality: 0.0 },
            "local" => RoutingModel {
                skew: 0.0,
                locality: LOCAL_LOCALITY,
            },
            "skewed" => RoutingModel {
                skew: skew(),
                locality: 0.0,
            },
            "mixed" => RoutingModel {
                skew: skew(),
                locality: MIXED_LOCALITY,
            },
            other => return Err(format!("unknown routing preset {other:?} (use {})", PRESETS.join(", "))),
        })
    }

    /// `tokens` decode tokens (one pass each) for `header`'s layers, seeded.
    pub fn trace(&self, header: TraceHeader, tokens: usize, seed: u64) -> Trace {
        let layers = header.moe_layers.len();
        let (e, k) = (header.experts, header.top_k.min(header.experts));
        let mut rng = seed ^ 0x5eed_0fda_7a00;
        let ranks: Vec<Vec<usize>> = (0..layers).map(|_| permutation(e, &mut rng)).collect();
        let cdf = zipf_cdf(e, self.skew);
        let mut previous: Vec<Vec<usize>> = vec![Vec::new(); layers];
        let mut out = Vec::with_capacity(tokens);
        for t in 0..tokens {
            let mut routes = Vec::with_capacity(layers);
            for (l, prev) in previous.iter_mut().enumerate() {
                let mut chosen: Vec<usize> = Vec::with_capacity(k);
                while chosen.len() < k {
                    let reuse = !prev.is_empty() && uniform(&mut rng) < self.locality;
                    let pick = if reuse {
                        prev[(next(&mut rng) % prev.len() as u64) as usize]
                    } else {
                        let u = uniform(&mut rng);
                        ranks[l][cdf.partition_point(|&c| c < u).min(e - 1)]
                    };
                    if !chosen.contains(&pick) {
                        chosen.push(pick);
                    }
                }
                *prev = chosen.clone();
                routes.push(chosen);
            }
            out.push(TraceToken {
                seq: 0,
                pos: t,
                phase: Phase::Decode,
                pass: t,
                routes,
                predicted: Vec::new(),
            });
        }
        Trace {
            header: TraceHeader { lookahead: 0, ..header },
            tokens: out,
        }
    }
}

/// The Zipf exponent whose hottest `fraction` of `experts` carries `share` of the weight.
pub fn skew_for_hot_share(experts: usize, fraction: f64, share: f64) -> f64 {
    let hot = ((experts as f64 * fraction).round() as usize).clamp(1, experts.max(1));
    let share_at = |s: f64| {
        let w: Vec<f64> = (1..=experts).map(|r| (r as f64).powf(-s)).collect();
        w[..hot].iter().sum::<f64>() / w.iter().sum::<f64>()
    };
    let (mut lo, mut hi) = (0.0, 8.0);
    for _ in 0..60 {
        let mid = (lo + hi) / 2.0;
        if share_at(mid) < share {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo + hi) / 2.0
}

fn zipf_cdf(experts: usize, skew: f64) -> Vec<f64> {
    let w: Vec<f64> = (1..=experts).map(|r| (r as f64).powf(-skew)).collect();
    let total: f64 = w.iter().sum();
    let mut acc = 0.0;
    w.iter()
        .map(|x| {
            acc += x / total;
            acc
        })
        .collect()
}

fn permutation(n: usize, rng: &mut u64) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        p.swap(i, (next(rng) % (i as u64 + 1)) as usize);
    }
    p
}

/// SplitMix64.
fn next(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn uniform(x: &mut u64) -> f64 {
    (next(x) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::TRACE_VERSION;

    fn header(experts: usize, top_k: usize) -> TraceHeader {
        TraceHeader {
            larder_trace: TRACE_VERSION,
            model: "synthetic".into(),
            experts,
            top_k,
            moe_layers: vec![0, 1, 2, 3],
            expert_bytes: vec![1; 4],
            lookahead: 0,
        }
    }

    #[test]
    fn presets_show_their_statistics() {
        let stats = |name: &str, e, k| {
            let m = RoutingModel::preset(name, e).unwrap();
            let t = m.trace(header(e, k), 2000, 1);
            t.check().unwrap();
            t.route_stats(None)
        };
        let uniform = stats("uniform", 128, 8);
        assert!((uniform.popularity[2].1 - 0.3).abs() < 0.03, "{uniform:?}");
        let skewed = stats("skewed", 896, 16);
        // Top-k without repeats flattens the draw a little below the weight share.
        assert!((skewed.popularity[2].1 - SKEWED_HOT30).abs() < 0.05, "{:?}", skewed.popularity);
        let local = stats("local", 128, 8);
        let within2 = local.reuse_distance[0].1 + local.reuse_distance[1].1;
        assert!(within2 > 0.8, "{:?}", local.reuse_distance);
        assert!(RoutingModel::preset("zipf", 8)
            .unwrap_err()
            .contains("uniform, local, skewed, mixed"));
    }
}
