//! How a written synthetic checkpoint routes: a short greedy decode from a
//! seeded first token with routes recorded, then the statistics `synth`
//! reports (consecutive-token overlap, popularity, reuse distance, router
//! lookahead recall, and an LRU hit rate from `bench cache`'s simulator).

use std::path::Path;

use larder_model::synth::SynthSpec;
use larder_model::RouteTrace;

use crate::{Result, ToolsError};

/// What `--measure-tokens` measured (JSON: `routing_overlap`, `routing_stats`).
pub struct Measured {
    /// Mean share of a token's experts the previous token also chose, overall and per layer.
    pub overlap: f64,
    pub per_layer: Vec<(usize, f64)>,
    pub stats: RoutingStats,
}

/// The routing statistics synth reports (`routing_stats` in `--json`), from
/// `larder_router::Trace::route_stats` and the cache simulator.
#[derive(serde::Serialize)]
pub struct RoutingStats {
    pub tokens: usize,
    /// Share of routes taken by the hottest 10% / 30% of each layer's experts.
    pub hot_10: f64,
    pub hot_30: f64,
    /// Mean share of a token's experts the previous token also chose.
    pub consecutive_overlap: f64,
    /// Share of routes whose expert the same layer used at most 1 / 2 tokens before.
    pub reuse_within_1: f64,
    pub reuse_within_2: f64,
    /// `(depth, recall)`: share of a layer's experts its router picks on the
    /// input of the MoE layer `depth` before it.
    pub lookahead_recall: Vec<(usize, f64)>,
    /// LRU hit rate with 40% of the expert bank cached (`bench cache`'s simulator).
    pub lru_hit_40: f64,
}

/// The route-trace statistics of a recorded greedy decode.
fn routing_stats(rt: &RouteTrace, model: &larder_model::DecoderModel, dir: &Path, spec: &SynthSpec) -> Result<RoutingStats> {
    let trace = larder_bench::trace::to_file(rt, model.spec(), dir, 0, spec.expert_bytes() as u64)?;
    let s = trace.route_stats(None);
    let hot = |x: f64| s.popularity.iter().find(|p| (p.0 - x).abs() < 1e-9).map_or(0.0, |p| p.1);
    let within = |n: usize| {
        s.reuse_distance
            .iter()
            .filter(|(ub, _)| ub.is_some_and(|ub| ub <= n))
            .map(|(_, v)| v)
            .sum::<f64>()
    };
    let curves = larder_bench::cache::hit_curves(&trace, &[0.4], &["lru"])?;
    Ok(RoutingStats {
        tokens: s.tokens,
        hot_10: hot(0.1),
        hot_30: hot(0.3),
        consecutive_overlap: s.consecutive_overlap,
        reuse_within_1: within(1),
        reuse_within_2: within(2),
        lookahead_recall: s.lookahead_recall.clone(),
        lru_hit_40: curves.first().map_or(0.0, |c| c.hit("lru")),
    })
}

/// Greedy decoding from a seeded first token, recording routes (with router
/// lookahead 3). The experts stream from the new checkpoint's files through a
/// bounded cache (routing is the same as in RAM: streaming changes when bytes
/// arrive, not what is computed), so a checkpoint larger than RAM (a
/// 120b-like preset) is measured too.
pub fn measure_routing(dir: &Path, tokens: usize, spec: &SynthSpec) -> Result<Measured> {
    let opts = larder_engine::LoadOptions {
        experts: larder_engine::ExpertMode::Stream(larder_store::StoreOptions {
            ram_budget: 1 << 30,
            ..larder_store::StoreOptions::default()
        }),
        ..Default::default()
    };
    let engine = larder_engine::Engine::load_with(dir, &opts)
        .map_err(|e| ToolsError::from(e).during(format!("cannot load {} to measure routing", dir.display())))?;
    let model = engine.model();
    let mut state = model.new_state();
    let mut trace = RouteTrace::with_lookahead(larder_bench::trace::LOOKAHEAD);
    let mut tok = (spec.seed % model.spec().vocab_size as u64) as u32 + 1;
    for _ in 0..tokens {
        let logits = model.forward_last(&[tok], &mut state, Some(&mut trace))?;
        tok = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i as u32)
            .unwrap_or(0);
    }
    let (overlap, per_layer) = trace.consecutive_overlap();
    let stats = routing_stats(&trace, model, dir, spec)?;
    Ok(Measured { overlap, per_layer, stats })
}
