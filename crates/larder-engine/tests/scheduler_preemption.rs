//! Preemption keeps every request bit-identical to running alone: under a KV
//! budget barely above the largest request's worst case, 6 requests (greedy
//! and seeded, different lengths, one cancelled by its sink, one by its flag
//! while prefilling, one by its flag while decoding, one the moment it is
//! preempted and queued) force the scheduler to drop and recompute states;
//! each finished request's ids, text, streamed text and finish reason equal
//! its solo run, the budget (states plus prefix cache) holds after every
//! step, and no state is left at the end. On qwen3_moe_tiny,
//! deepseek_v3_tiny (MLA) and a packed store streamed through a RAM cache
//! that holds no expert.

use larder_engine::{Engine, FinishReason, Outcome, Scheduler, SchedulerConfig};

mod scheduler_support;
use scheduler_support::*;

/// The scenario: [`specs`] with more cancellations, and longer generations
/// so that states outgrow the budget while decoding.
fn preemption_specs() -> Vec<Spec> {
    let mut v = specs();
    v[0].max_new = 20;
    v[1].max_new = 16;
    v[3].flag_at = Some(4); // arrives at step 3 with 31 tokens: still prefilling
    v[5].max_new = 18;
    v.push(spec(prompt(9, 7), 16, 0.9, 5, 1));
    v[6].cancel_when_preempted = true;
    v
}

fn check_preemption(engine: &Engine, label: &str) {
    let specs = preemption_specs();
    let per = Scheduler::new(engine, SchedulerConfig::default()).unwrap().bytes_per_token();
    let largest = specs.iter().map(|s| s.prompt.len() + s.max_new).max().unwrap();
    let alone: Vec<Outcome> = specs.iter().map(|s| solo(engine, s)).collect();
    for (max_batch, prefill_chunk, spare) in [(8, 4, 2), (4, 7, 12)] {
        let config = SchedulerConfig {
            max_batch,
            prefill_chunk,
            kv_budget: Some((largest + spare) * per),
            ..SchedulerConfig::default()
        };
        let arm = format!(
            "{label} max_batch={max_batch} chunk={prefill_chunk} budget={} positions",
            largest + spare
        );
        let run = batched(engine, &specs, config);
        assert!(run.preemptions > 0, "{arm}: no preemption");
        check_against_alone(&arm, &specs, &run.results, &alone);
        assert_eq!(run.results[2].0.finish_reason, FinishReason::Cancelled, "{arm}: sink cancel");
        if !run.cancelled_preempted.is_empty() {
            let (g, _) = &run.results[6];
            assert_eq!(g.finish_reason, FinishReason::Cancelled, "{arm}: cancelled while preempted");
        }
        for (i, (g, _)) in run.results.iter().enumerate() {
            if !specs[i].flagged() && specs[i].sink_cancel_after.is_none() {
                assert_eq!(g.stats.new_tokens, alone[i].ids.len(), "{arm} request {i}: stats");
            }
        }
    }
}

#[test]
fn preempted_requests_are_bit_identical_on_qwen3_moe() {
    let engine = Engine::load(&fixture("qwen3_moe_tiny")).unwrap();
    check_preemption(&engine, "qwen3_moe_tiny");
}

#[test]
fn preempted_requests_are_bit_identical_on_deepseek_v3_mla() {
    let engine = Engine::load(&fixture("deepseek_v3_tiny")).unwrap();
    check_preemption(&engine, "deepseek_v3_tiny");
}

#[test]
fn preempted_requests_are_bit_identical_on_a_streamed_store() {
    let (engine, out) = streamed_tiny("scheduler-preemption");
    check_preemption(&engine, "packed store, budget 0");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_request_cancelled_while_preempted_is_retired_with_no_state() {
    let engine = Engine::load(&fixture("qwen3_moe_tiny")).unwrap();
    let specs = preemption_specs();
    let per = Scheduler::new(&engine, SchedulerConfig::default()).unwrap().bytes_per_token();
    let largest = specs.iter().map(|s| s.prompt.len() + s.max_new).max().unwrap();
    let config = SchedulerConfig {
        max_batch: 8,
        prefill_chunk: 4,
        kv_budget: Some((largest + 2) * per),
        ..SchedulerConfig::default()
    };
    let run = batched(&engine, &specs, config);
    assert_eq!(run.cancelled_preempted, vec![6], "request 6 was preempted and then cancelled");
    let (g, _) = &run.results[6];
    assert_eq!(g.finish_reason, FinishReason::Cancelled);
    assert!(solo(&engine, &specs[6]).ids.starts_with(&g.ids));
}
