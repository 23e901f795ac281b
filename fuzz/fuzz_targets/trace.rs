//! Fuzzes route-trace files (JSON Lines, `larder_router::Trace`) through
//! what reads them: `Trace::read`, then, for a trace, what `larder trace
//! stats`, `bench cache --trace` and `plan --trace` compute from it: the
//! passes, heat and bank bytes, the routing statistics (all tokens and
//! decode only), depth-1 lookahead drawn for a trace without it, and the
//! cache replays (every eviction policy, Belady's optimum, Belady in fair
//! shares, the online bound, the prefetch replay of the decode passes) at a
//! few budgets. Any input is a trace or an error naming the line, never a
//! panic, an abort or a huge allocation (a header claiming 2^40 experts
//! aborted `trace stats`: issue 37).
#![no_main]

use std::collections::HashMap;

use larder_router::{with_predictions, Phase, Trace};
use larder_store::cache::online_bound::simulate_online_bound;
use larder_store::cache::prefetch_sim::{simulate_prefetch, DecodeStep, LayerAccess, PrefetchRule};
use larder_store::cache::sim::{simulate, simulate_belady, simulate_belady_shares};
use larder_store::cache::PolicyKind;
use libfuzzer_sys::fuzz_target;

/// The decode passes with their depth-1 predictions (as `plan` replays them).
fn decode_steps(trace: &Trace) -> Vec<DecodeStep> {
    let h = &trace.header;
    trace
        .passes()
        .into_iter()
        .filter(|p| p.phase == Phase::Decode)
        .map(|p| DecodeStep {
            tokens: p.tokens,
            layers: (0..h.moe_layers.len())
                .map(|i| LayerAccess {
                    layer: h.moe_layers[i],
                    bytes: h.expert_bytes[i],
                    demand: p.layers[i].clone(),
                    predicted: p.predicted[i].clone(),
                })
                .collect(),
        })
        .collect()
}

/// Every replay `bench cache` and `plan` make, at shares of the bank.
fn replay(trace: &Trace) {
    let steps = larder_engine::planner::trace_steps(trace);
    let layers = trace.header.moe_layers.len();
    let heat: HashMap<(usize, usize), u64> = trace
        .heat()
        .into_iter()
        .map(|((i, e), n)| ((trace.header.moe_layers[i], e), n))
        .collect();
    let decode = decode_steps(trace);
    let bank = trace.bank_bytes();
    for share in [0.1, 0.5] {
        let budget = (bank as f64 * share) as u64;
        for kind in PolicyKind::ALL {
            let _ = simulate(&steps, budget, kind.build(budget, layers, &heat).as_mut());
        }
        let _ = simulate_belady(&steps, budget);
        let _ = simulate_belady_shares(&steps, budget, layers);
        let _ = simulate_online_bound(&steps, budget);
        let mut policy = PolicyKind::default().build(budget, layers, &HashMap::new());
        let rule = PrefetchRule {
            per_layer: Some(4),
            ..PrefetchRule::default()
        };
        let _ = simulate_prefetch(&[], &decode, budget, policy.as_mut(), rule);
    }
}

fuzz_target!(|data: &[u8]| {
    let dir = larder_fuzz::scratch_dir("trace");
    larder_fuzz::write(dir, "trace.jsonl", data);
    let Ok(trace) = Trace::read(&dir.join("trace.jsonl")) else { return };
    let _ = trace.route_stats(None);
    let _ = trace.route_stats(Some(Phase::Decode));
    replay(&trace);
    let predicted = with_predictions(trace, 0.7, 1);
    let _ = predicted.route_stats(None);
    replay(&predicted);
});
