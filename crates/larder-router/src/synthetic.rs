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
//!
//! Drawing holds a popularity rank per MoE layer and expert and every route
//! drawn; both are bounded by [`MAX_DRAWN`] before anything is allocated
//! (the shape comes from a config.json, which may claim anything).

use crate::trace::{Phase, Trace, TraceHeader, TraceToken};

/// Share of routes the hottest 30% of experts take under `skewed` (K3's heat).
pub(crate) const SKEWED_HOT30: f64 = 0.856;
/// `local`'s chance that a route repeats one of the previous token's experts
/// (an LRU cache of 40% of 128 experts, top-8, then hits about 94.7%).
pub(crate) const LOCAL_LOCALITY: f64 = 0.9;
/// `mixed`'s locality.
pub(crate) const MIXED_LOCALITY: f64 = 0.5;
/// The preset names.
pub(crate) const PRESETS: [&str; 4] = ["uniform", "local", "skewed", "mixed"];
/// The most entries a draw may hold of each of: the popularity ranks (MoE
/// layers x experts) and the routes drawn (tokens x MoE layers x top_k):
/// 2^28 (2 GiB of indices). A K3-class shape (61 MoE layers of 896
/// experts, top-16) needs 54,656 ranks and, for 2,000 tokens, 1,952,000
/// routes.
pub(crate) const MAX_DRAWN: u64 = 1 << 28;

/// How a synthetic stream of routes behaves.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct RoutingModel {
    /// Zipf exponent of popularity (0: uniform).
    pub skew: f64,
    /// Chance a route reuses one of the previous token's experts (0 to 1).
    pub locality: f64,
}

impl RoutingModel {
    /// A preset (see the module doc) for layers of `experts` experts.
    pub fn preset(name: &str, experts: usize) -> Result<RoutingModel, String> {
        if experts as u64 > MAX_DRAWN {
            return Err(format!(
                "{experts} experts per layer: more than the {MAX_DRAWN} a routing preset draws from"
            ));
        }
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

    /// `tokens` decode tokens (one pass each) for `header`'s layers, seeded;
    /// an error when the draw would exceed `MAX_DRAWN` (2^28) ranks or routes.
    pub fn trace(&self, header: TraceHeader, tokens: usize, seed: u64) -> Result<Trace, String> {
        check_drawable(&header, tokens)?;
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
        Ok(Trace {
            header: TraceHeader { lookahead: 0, ..header },
            tokens: out,
        })
    }
}

/// An error unless drawing `tokens` tokens for `header`'s shape holds at
/// most [`MAX_DRAWN`] ranks and routes (see the module doc).
fn check_drawable(header: &TraceHeader, tokens: usize) -> Result<(), String> {
    let layers = header.moe_layers.len() as u64;
    let (e, k) = (header.experts as u64, header.top_k.min(header.experts) as u64);
    if e == 0 {
        return Err("a layer of 0 experts has nothing to route to".into());
    }
    let ranks = layers.saturating_mul(e);
    if ranks > MAX_DRAWN {
        return Err(format!(
            "{layers} MoE layers x {e} experts: {ranks} popularity ranks, more than the {MAX_DRAWN} a draw may hold"
        ));
    }
    let routes = (tokens as u64).saturating_mul(layers).saturating_mul(k);
    if routes > MAX_DRAWN {
        return Err(format!(
            "{tokens} tokens x {layers} MoE layers x top-{k}: {routes} routes, more than the {MAX_DRAWN} a draw may hold; draw fewer tokens"
        ));
    }
    Ok(())
}

/// `trace` with router lookahead of depth 1 added, for replaying prefetch
/// over a trace drawn from a model: at every MoE layer after the first, each
/// of a token's experts is predicted with chance `recall`, and the rest of
/// the `top_k` predictions are drawn uniformly from the experts it does not
/// route to there (seeded). A trace that records lookahead is returned as is.
pub fn with_predictions(mut trace: Trace, recall: f64, seed: u64) -> Trace {
    let layers = trace.header.moe_layers.len();
    if trace.header.lookahead > 0 || layers < 2 {
        return trace;
    }
    let e = trace.header.experts;
    let mut rng = seed ^ 0x9e37_79b9_7f4a_7c15;
    for t in &mut trace.tokens {
        let mut depth1 = vec![Vec::new(); layers];
        for (l, routes) in t.routes.iter().enumerate().skip(1) {
            let mut guess: Vec<usize> = routes.iter().copied().filter(|_| uniform(&mut rng) < recall).collect();
            let target = guess.len() + (routes.len() - guess.len()).min(e.saturating_sub(routes.len()));
            while guess.len() < target {
                let pick = (next(&mut rng) % e as u64) as usize;
                if !routes.contains(&pick) && !guess.contains(&pick) {
                    guess.push(pick);
                }
            }
            depth1[l] = guess;
        }
        t.predicted = vec![depth1];
    }
    trace.header.lookahead = 1;
    trace
}

/// The Zipf exponent whose hottest `fraction` of `experts` carries `share` of the weight.
pub(crate) fn skew_for_hot_share(experts: usize, fraction: f64, share: f64) -> f64 {
    let hot = ((experts as f64 * fraction).round() as usize).clamp(1, experts.max(1));
    // Summed in rank order, as a list of the weights would be, without one.
    let share_at = |s: f64| {
        let (mut hot_sum, mut all) = (0.0, 0.0);
        for r in 1..=experts {
            let w = (r as f64).powf(-s);
            if r <= hot {
                hot_sum += w;
            }
            all += w;
        }
        hot_sum / all
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
            let t = m.trace(header(e, k), 2000, 1).unwrap();
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

    #[test]
    fn added_predictions_recall_what_they_were_asked_to() {
        let t = RoutingModel::preset("uniform", 64).unwrap().trace(header(64, 8), 1000, 3).unwrap();
        let p = with_predictions(t, 0.7, 5);
        p.check().unwrap();
        let recall = p.route_stats(None).lookahead_recall[0].1;
        assert!((recall - 0.7).abs() < 0.03, "{recall}");
        assert!(p
            .tokens
            .iter()
            .all(|t| t.predicted[0][0].is_empty() && t.predicted[0][1].len() == 8));
        // A layer of as many experts as a token picks has no wrong guesses to draw.
        let tiny = RoutingModel::preset("uniform", 8).unwrap().trace(header(8, 8), 10, 3).unwrap();
        let tiny = with_predictions(tiny, 0.5, 1);
        tiny.check().unwrap();
        assert!(tiny.tokens.iter().all(|t| t.predicted[0][1].len() <= 8));
    }

    #[test]
    fn draws_too_big_to_hold_are_errors() {
        // A config.json's 2^31 experts per layer: refused before any table is made.
        let huge = 1usize << 31;
        assert!(RoutingModel::preset("skewed", huge).unwrap_err().contains("2147483648 experts"));
        let uniform = RoutingModel::preset("uniform", 8).unwrap();
        let err = uniform.trace(header(huge, 8), 10, 1).unwrap_err();
        assert!(err.contains("popularity ranks"), "{err}");
        let err = uniform.trace(header(1 << 20, 1 << 16), 2000, 1).unwrap_err();
        assert!(err.contains("routes") && err.contains("fewer tokens"), "{err}");
    }
}
