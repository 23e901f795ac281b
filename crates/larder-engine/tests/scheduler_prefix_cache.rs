//! The scheduler's prefix cache keeps several finished conversations: two
//! conversations interleaved (A turn 1, B turn 1, A turn 2, B turn 2) that
//! share a system prompt each reuse their own history on their second turn
//! (B's first turn copies the shared system prompt out of A's entry, which
//! stays whole), and every turn's output is bit-identical to a fresh
//! prefill; the least recently used conversation is the one evicted, by
//! count and under a KV budget (where the cache goes before any sequence is
//! preempted).

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use larder_engine::{Engine, Outcome, Scheduler, SchedulerConfig};

mod scheduler_support;
use scheduler_support::*;

/// The next turn of a conversation: its history (prompt and reply) and a new user message.
fn next_turn(turn: &Spec, reply: &Outcome, user: &[u32]) -> Spec {
    let mut next = turn.clone();
    next.prompt = turn.prompt.iter().chain(&reply.ids).chain(user).copied().collect();
    next
}

fn config(prefix_cache: usize, kv_budget: Option<usize>) -> SchedulerConfig {
    SchedulerConfig {
        max_batch: 4,
        prefill_chunk: 5,
        kv_budget,
        prefix_cache,
    }
}

#[test]
fn interleaved_conversations_each_reuse_their_own_prefix() {
    for name in ["qwen3_moe_tiny", "deepseek_v3_tiny"] {
        let engine = Engine::load(&fixture(name)).unwrap();
        let system = prompt(6, 9);
        let with_system = |user: Vec<u32>| system.iter().chain(&user).copied().collect::<Vec<u32>>();
        let a1 = spec(with_system(prompt(5, 1)), 8, 0.8, 21, 0);
        let b1 = spec(with_system(prompt(4, 2)), 7, 0.0, 0, 0);
        let mut sched = Scheduler::new(&engine, config(8, None)).unwrap();

        let a1_out = run_one(&mut sched, &a1, None);
        assert_eq!(a1_out.cached_tokens, 0, "{name}: nothing to reuse yet");
        let b1_out = run_one(&mut sched, &b1, None);
        assert_eq!(b1_out.cached_tokens, system.len(), "{name}: B shares the system prompt");
        assert_eq!((sched.kept_conversations(), sched.prefix_copies()), (2, 1), "{name}: A stays whole");

        let a2 = next_turn(&a1, &a1_out, &prompt(3, 3));
        let b2 = next_turn(&b1, &b1_out, &prompt(4, 4));
        let a2_out = run_one(&mut sched, &a2, None);
        let b2_out = run_one(&mut sched, &b2, None);
        // The last new id was never fed: every earlier position is reused.
        assert_eq!(a2_out.cached_tokens, a1.prompt.len() + a1_out.ids.len() - 1, "{name}: A's history");
        assert_eq!(b2_out.cached_tokens, b1.prompt.len() + b1_out.ids.len() - 1, "{name}: B's history");
        assert_eq!(sched.kept_conversations(), 2, "{name}: each second turn replaced its first");

        for (turn, got) in [(&a1, &a1_out), (&b1, &b1_out), (&a2, &a2_out), (&b2, &b2_out)] {
            let fresh = solo(&engine, turn);
            assert_eq!(got.ids, fresh.ids, "{name}: ids with reuse vs fresh prefill");
            assert_eq!(got.text, fresh.text, "{name}: text");
            assert_eq!(got.finish_reason, fresh.finish_reason, "{name}: finish reason");
        }
        sched.clear_kept();
        assert_eq!((sched.kept_bytes(), sched.kept_conversations()), (0, 0));
    }
}

#[test]
fn the_least_recently_used_conversation_is_evicted_first() {
    let engine = Engine::load(&fixture("qwen3_moe_tiny")).unwrap();
    let x = spec(prompt(8, 1), 5, 0.0, 0, 0);
    let y = spec(prompt(8, 2), 5, 0.0, 0, 0);
    let mut sched = Scheduler::new(&engine, config(2, None)).unwrap();
    let x_out = run_one(&mut sched, &x, None);
    let y_out = run_one(&mut sched, &y, None);
    // X shared in part: copied, which counts as a use of X, so Y is the least recent.
    let mut x_branch = x.clone();
    x_branch.prompt = x.prompt[..4].iter().chain(&[7, 7, 7]).copied().collect();
    assert_eq!(run_one(&mut sched, &x_branch, None).cached_tokens, 4);
    assert_eq!(sched.kept_conversations(), 2, "at most 2 kept");
    let x2 = next_turn(&x, &x_out, &[5, 6]);
    let x2_out = run_one(&mut sched, &x2, None);
    assert_eq!(x2_out.cached_tokens, x.prompt.len() + x_out.ids.len() - 1, "X was kept");
    let y2 = next_turn(&y, &y_out, &[5, 6]);
    assert_eq!(run_one(&mut sched, &y2, None).cached_tokens, 0, "Y was evicted");
    assert_eq!(x2_out.ids, solo(&engine, &x2).ids);
}

#[test]
fn the_kv_budget_evicts_cached_conversations_before_preempting() {
    let engine = Engine::load(&fixture("qwen3_moe_tiny")).unwrap();
    let per = Scheduler::new(&engine, SchedulerConfig::default()).unwrap().bytes_per_token();
    let (c, d) = (spec(prompt(10, 3), 8, 0.0, 0, 0), spec(prompt(12, 4), 9, 0.7, 4, 0));
    // Room for both requests' worst cases and no more.
    let budget = (c.prompt.len() + c.max_new + d.prompt.len() + d.max_new) * per;
    let mut sched = Scheduler::new(&engine, config(8, Some(budget))).unwrap();
    let warm = spec(prompt(15, 5), 6, 0.0, 0, 0);
    run_one(&mut sched, &warm, Some(budget));
    assert!(sched.kept_bytes() > 0, "the finished conversation is kept");

    let results: Results = Arc::new(Mutex::new(vec![None, None]));
    for (i, s) in [&c, &d].into_iter().enumerate() {
        submit(&mut sched, s, i, &results, Arc::new(AtomicBool::new(false))).unwrap();
    }
    while !sched.is_idle() {
        let report = sched.step();
        assert!(report.failed.is_empty() && report.preempted.is_empty(), "{report:?}");
        assert!(sched.state_bytes() + sched.kept_bytes() <= budget, "over the KV budget");
    }
    assert_eq!((sched.preemptions(), sched.state_bytes()), (0, 0));
    let got = results.lock().unwrap().clone();
    for (i, s) in [&c, &d].into_iter().enumerate() {
        assert_eq!(got[i].as_ref().expect("finished").0.ids, solo(&engine, s).ids, "request {i}");
    }
    let warm2 = next_turn(&warm, &solo(&engine, &warm), &[3]);
    assert_eq!(
        run_one(&mut sched, &warm2, Some(budget)).cached_tokens,
        0,
        "the warm conversation was evicted"
    );
}
