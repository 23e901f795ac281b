//! The scheduler decodes many requests together, each bit-identical to
//! running alone: 6 requests of different prompts, lengths and sampling
//! (greedy and seeded), arriving at different steps, some cancelled midway
//! (by their sink or by their cancel flag, running or queued), with a small
//! prefill chunk and batch sizes 1, 3 and 8, give each the ids, text and
//! finish reason `Engine::run` gives it alone. On qwen3_moe_tiny,
//! deepseek_v3_tiny (MLA), a packed store streamed through a RAM cache that
//! holds no expert, and qwen3_moe_tok (real text, stop strings). Also: the KV
//! budget refuses what cannot fit before generating (`EngineError::KvBudget`
//! with its numbers) and holds the rest in the queue, `max_batch` is
//! respected, and no state is left when idle. Preemption and the prefix
//! cache have their own files (`scheduler_preemption.rs`,
//! `scheduler_prefix_cache.rs`); the helpers are in `scheduler_support`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use larder_engine::{Engine, EngineError, FinishReason, Outcome, Scheduler, SchedulerConfig};

mod scheduler_support;
use scheduler_support::*;

#[test]
fn batched_requests_are_bit_identical_to_each_alone() {
    for name in ["qwen3_moe_tiny", "deepseek_v3_tiny"] {
        let engine = Engine::load(&fixture(name)).unwrap();
        check_model(&engine, name, &specs());
    }
}

#[test]
fn batched_requests_on_a_streamed_store_are_bit_identical() {
    let (engine, out) = streamed_tiny("scheduler");
    check_model(&engine, "packed store, budget 0", &specs());
    // The streamed batch equals the in-RAM model alone, too.
    let ram = Engine::load(&fixture("qwen3_moe_tiny")).unwrap();
    let s = &specs()[1];
    assert_eq!(solo(&ram, s).ids, solo(&engine, s).ids);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn real_text_and_stop_strings_match_alone() {
    let engine = Engine::load(&fixture("qwen3_moe_tok")).unwrap();
    let mut v = specs();
    let vocab = engine.model().spec().vocab_size as u32;
    for s in &mut v {
        s.prompt.iter_mut().for_each(|t| *t %= vocab);
    }
    // A stop string taken from a greedy solo run's text, so it does occur.
    let probe = solo(&engine, &v[0]);
    let chars: Vec<char> = probe.text.chars().collect();
    assert!(chars.len() >= 4, "probe text too short: {:?}", probe.text);
    v[0].stop = vec![chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect()];
    v[3].stop = vec![chars[1..3].iter().collect(), "\u{1}never".into()];
    assert!(solo(&engine, &v[0]).stop_string.is_some(), "the stop string occurs");
    check_model(&engine, "qwen3_moe_tok", &v);
}

#[test]
fn kv_budget_refuses_before_generating_and_queues_the_rest() {
    let engine = Engine::load(&fixture("qwen3_moe_tiny")).unwrap();
    let probe = Scheduler::new(&engine, SchedulerConfig::default()).unwrap();
    let per = probe.bytes_per_token();
    assert!(per > 0);
    let specs = specs();
    let largest = specs.iter().map(|s| s.prompt.len() + s.max_new).max().unwrap();
    // Room for the largest request and a little more: requests must wait their turn.
    let config = SchedulerConfig {
        max_batch: 8,
        prefill_chunk: 4,
        kv_budget: Some((largest + 10) * per),
        ..SchedulerConfig::default()
    };
    let alone: Vec<Outcome> = specs.iter().map(|s| solo(&engine, s)).collect();
    let got = batched(&engine, &specs, config).results;
    check_against_alone("kv budget", &specs, &got, &alone);

    let mut sched = Scheduler::new(&engine, config).unwrap();
    let results: Results = Arc::new(Mutex::new(vec![None]));
    let mut big = specs[0].clone();
    big.max_new = largest + 11 - big.prompt.len();
    let e = submit(&mut sched, &big, 0, &results, Arc::new(AtomicBool::new(false))).unwrap_err();
    let EngineError::KvBudget {
        needed,
        budget,
        prompt_tokens,
        max_new,
    } = e
    else {
        panic!("not a KV budget error: {e}");
    };
    assert_eq!((prompt_tokens, max_new), (big.prompt.len(), big.max_new));
    assert_eq!((needed, budget), ((largest + 11) * per, (largest + 10) * per));
    let msg = e.to_string();
    assert!(
        msg.contains("KV budget") && msg.contains("max_tokens") && msg.contains("--kv-budget"),
        "{msg}"
    );
    assert!(sched.is_idle() && results.lock().unwrap()[0].is_none(), "nothing ran");
    // Context overflow is refused the same way.
    big.max_new = 10_000;
    assert!(submit(&mut sched, &big, 0, &results, Arc::new(AtomicBool::new(false))).is_err());
}

#[test]
fn max_batch_queues_in_order_and_queued_requests_can_be_cancelled() {
    let engine = Engine::load(&fixture("qwen3_moe_tiny")).unwrap();
    let specs = specs();
    let config = SchedulerConfig {
        max_batch: 2,
        prefill_chunk: 8,
        ..SchedulerConfig::default()
    };
    let results: Results = Arc::new(Mutex::new(vec![None; specs.len()]));
    let flags: Vec<Arc<AtomicBool>> = specs.iter().map(|_| Arc::new(AtomicBool::new(false))).collect();
    let mut sched = Scheduler::new(&engine, config).unwrap();
    for (i, s) in specs.iter().enumerate() {
        submit(&mut sched, s, i, &results, flags[i].clone()).unwrap();
    }
    assert_eq!((sched.running(), sched.queued()), (0, specs.len()));
    flags[5].store(true, Ordering::Relaxed);
    let report = sched.step();
    assert_eq!(report.batch, 2);
    assert_eq!((sched.running(), sched.queued()), (2, specs.len() - 3));
    let cancelled = results.lock().unwrap()[5].clone().expect("queued request cancelled at once");
    assert_eq!(cancelled.0.finish_reason, FinishReason::Cancelled);
    assert!(cancelled.0.ids.is_empty());
    while !sched.is_idle() {
        assert!(sched.step().batch <= 2);
    }
    assert_eq!(sched.state_bytes(), 0);
    assert!(Scheduler::new(&engine, SchedulerConfig { max_batch: 0, ..config }).is_err());
}

#[test]
fn a_request_extending_a_finished_one_reuses_its_state_exactly() {
    let engine = Engine::load(&fixture("qwen3_moe_tiny")).unwrap();
    let first = specs()[1].clone();
    let alone = solo(&engine, &first);
    let mut second = specs()[0].clone();
    second.prompt = first.prompt.iter().chain(&alone.ids).chain(&[9, 8, 7]).copied().collect();
    let config = SchedulerConfig {
        max_batch: 4,
        prefill_chunk: 6,
        ..SchedulerConfig::default()
    };
    let results: Results = Arc::new(Mutex::new(vec![None, None]));
    let mut sched = Scheduler::new(&engine, config).unwrap();
    for (i, s) in [&first, &second].into_iter().enumerate() {
        submit(&mut sched, s, i, &results, Arc::new(AtomicBool::new(false))).unwrap();
        while !sched.is_idle() {
            sched.step();
        }
        assert_eq!(sched.state_bytes(), 0);
        assert!(sched.kept_bytes() > 0, "the finished conversation is kept");
    }
    let got = results.lock().unwrap().clone();
    let (a, b) = (got[0].clone().unwrap().0, got[1].clone().unwrap().0);
    assert_eq!(a.ids, alone.ids);
    assert_eq!(a.cached_tokens, 0);
    assert!(b.cached_tokens >= first.prompt.len(), "reused {} tokens", b.cached_tokens);
    assert_eq!(b.ids, solo(&engine, &second).ids, "prefix reuse changed the output");
    sched.clear_kept();
    assert_eq!(sched.kept_bytes(), 0);
}
