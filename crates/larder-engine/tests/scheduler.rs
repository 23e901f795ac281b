//! The scheduler decodes many requests together, each bit-identical to
//! running alone: 6 requests of different prompts, lengths and sampling
//! (greedy and seeded), arriving at different steps, some cancelled midway
//! (by their sink or by their cancel flag, running or queued), with a small
//! prefill chunk and batch sizes 1, 3 and 8, give each the ids, text and
//! finish reason `Conversation::run` gives it alone. On qwen3_moe_tiny,
//! deepseek_v3_tiny (MLA), a packed store streamed through a RAM cache that
//! holds no expert, and qwen3_moe_tok (real text, stop strings). Also: the KV
//! budget refuses what cannot fit before generating and holds the rest in
//! the queue, `max_batch` is respected, and no state is left when idle.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use larder_engine::{
    Conversation, Drafting, Engine, EngineError, ExpertMode, FinishReason, GenerateOptions, Job, LoadOptions, Outcome, Request,
    RequestEvent, SamplingParams, Scheduler, SchedulerConfig,
};
use larder_store::pack::pack;
use larder_store::{IoKind, IoOptions, StoreOptions};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

/// One request of a scenario.
#[derive(Clone)]
struct Spec {
    prompt: Vec<u32>,
    max_new: usize,
    temperature: f32,
    seed: u64,
    stop: Vec<String>,
    /// The step at which it is submitted.
    arrive: usize,
    /// Its sink cancels after this many tokens.
    sink_cancel_after: Option<usize>,
    /// Its cancel flag is set at this step.
    flag_at: Option<usize>,
}

fn options(s: &Spec) -> GenerateOptions {
    GenerateOptions {
        max_new: s.max_new,
        sampling: SamplingParams {
            temperature: s.temperature,
            top_p: 0.9,
            top_k: 40,
            seed: s.seed,
        },
        stop_at_eos: true,
        ..GenerateOptions::default()
    }
}

fn specs() -> Vec<Spec> {
    let p = |n: usize, k: u32| (0..n as u32).map(|i| (i * 37 + k * 101 + 5) % 500 + 3).collect::<Vec<u32>>();
    let spec = |prompt, max_new, temperature, seed, arrive| Spec {
        prompt,
        max_new,
        temperature,
        seed,
        stop: Vec::new(),
        arrive,
        sink_cancel_after: None,
        flag_at: None,
    };
    let mut v = vec![
        spec(p(7, 1), 12, 0.0, 0, 0),
        spec(p(23, 2), 9, 0.8, 7, 0),
        spec(p(3, 3), 15, 1.0, 11, 2),
        spec(p(31, 4), 6, 0.0, 0, 3),
        spec(p(11, 5), 14, 0.7, 3, 5),
        spec(p(1, 6), 10, 1.2, 99, 1),
    ];
    v[2].sink_cancel_after = Some(4);
    v[4].flag_at = Some(8);
    v
}

/// A request alone through `Conversation::run` (sink cancels as the spec says).
fn solo(engine: &Engine, s: &Spec) -> Outcome {
    let o = options(s);
    let request = Request {
        prompt: &s.prompt,
        options: &o,
        stop: &s.stop,
        drafting: &Drafting::off(),
        cancel: None,
    };
    let mut n = 0;
    let mut conv = Conversation::new(engine);
    conv.run(engine, &request, &mut |e: RequestEvent<'_>| {
        if let RequestEvent::Token { .. } = e {
            n += 1;
        }
        s.sink_cancel_after.is_none_or(|c| n < c)
    })
    .unwrap()
}

type Results = Arc<Mutex<Vec<Option<(Outcome, String)>>>>;

fn job(s: &Spec, slot: usize, results: &Results, cancel: Arc<AtomicBool>) -> Job {
    let results = results.clone();
    let cancel_after = s.sink_cancel_after;
    let mut n = 0;
    let mut streamed = String::new();
    Job {
        prompt: s.prompt.clone(),
        options: options(s),
        stop: s.stop.clone(),
        cancel: Some(cancel),
        sink: Box::new(move |e: RequestEvent<'_>| match e {
            RequestEvent::Token { text, .. } => {
                n += 1;
                streamed.push_str(text);
                cancel_after.is_none_or(|c| n < c)
            }
            RequestEvent::Text(t) => {
                streamed.push_str(t);
                true
            }
            RequestEvent::Finished(o) => {
                results.lock().unwrap()[slot] = Some((o.clone(), std::mem::take(&mut streamed)));
                true
            }
        }),
    }
}

/// Runs `specs` through a scheduler; returns each one's outcome and streamed text.
fn batched(engine: &Engine, specs: &[Spec], config: SchedulerConfig) -> Vec<(Outcome, String)> {
    let results: Results = Arc::new(Mutex::new(vec![None; specs.len()]));
    let flags: Vec<Arc<AtomicBool>> = specs.iter().map(|_| Arc::new(AtomicBool::new(false))).collect();
    let mut sched = Scheduler::new(engine, config).unwrap();
    let mut step = 0;
    let mut widest = 0;
    while step < 1000 {
        for (i, s) in specs.iter().enumerate() {
            if s.arrive == step {
                sched.submit(job(s, i, &results, flags[i].clone())).unwrap();
            }
            if s.flag_at == Some(step) {
                flags[i].store(true, Ordering::Relaxed);
            }
        }
        let report = sched.step();
        assert!(report.failed.is_empty(), "{:?}", report.failed);
        assert!(report.batch <= config.max_batch, "batch {} over max_batch", report.batch);
        widest = widest.max(report.batch);
        assert!(sched.running() <= config.max_batch);
        if let Some(budget) = config.kv_budget {
            assert!(sched.state_bytes() <= budget, "state {} over budget {budget}", sched.state_bytes());
        }
        step += 1;
        if sched.is_idle() && specs.iter().all(|s| s.arrive < step) {
            break;
        }
    }
    assert!(sched.is_idle(), "still busy after {step} steps");
    assert_eq!(widest > 1, config.max_batch > 1, "sequences ran together (widest batch {widest})");
    assert_eq!(sched.state_bytes(), 0, "sequence state left when idle");
    let out = results
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.clone().expect("every request finished"))
        .collect();
    out
}

fn check_model(engine: &Engine, label: &str, specs: &[Spec]) {
    let alone: Vec<Outcome> = specs.iter().map(|s| solo(engine, s)).collect();
    for (max_batch, prefill_chunk) in [(8, 4), (3, 5), (1, 256)] {
        let config = SchedulerConfig {
            max_batch,
            prefill_chunk,
            kv_budget: None,
        };
        let got = batched(engine, specs, config);
        for (i, ((g, streamed), a)) in got.iter().zip(&alone).enumerate() {
            let arm = format!("{label} max_batch={max_batch} chunk={prefill_chunk} request {i}");
            if specs[i].flag_at.is_some() {
                // Cancelled by its flag at some step: a prefix of its solo run.
                assert!(a.ids.starts_with(&g.ids), "{arm}: {:?} vs alone {:?}", g.ids, a.ids);
                continue;
            }
            assert_eq!(g.ids, a.ids, "{arm}: ids");
            assert_eq!(g.text, a.text, "{arm}: text");
            assert_eq!(streamed, &a.text, "{arm}: streamed text");
            assert_eq!(g.finish_reason, a.finish_reason, "{arm}: finish reason");
            assert_eq!(g.stop_string, a.stop_string, "{arm}: stop string");
        }
        assert_eq!(got[2].0.finish_reason, FinishReason::Cancelled, "{label}: sink cancel");
        assert!(!got[0].0.ids.is_empty(), "{label}: generated");
    }
}

#[test]
fn batched_requests_are_bit_identical_to_each_alone() {
    for name in ["qwen3_moe_tiny", "deepseek_v3_tiny"] {
        let engine = Engine::load(&fixture(name)).unwrap();
        check_model(&engine, name, &specs());
    }
}

#[test]
fn batched_requests_on_a_streamed_store_are_bit_identical() {
    let out = std::env::temp_dir().join(format!("larder-scheduler-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let store = out.join("store");
    let src = larder_engine::pack::pack_source(&fixture("qwen3_moe_tiny")).unwrap();
    pack(&src, &store, &[], &mut |_| {}).unwrap();
    let opts = LoadOptions {
        experts: ExpertMode::Stream(StoreOptions {
            io: IoOptions {
                kind: IoKind::Pread,
                direct: false,
                depth: 2,
            },
            ram_budget: 0,
            verify: true,
            prefetch_threads: 0,
        }),
    };
    let engine = Engine::load_with(&store, &opts).unwrap();
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
    };
    let alone: Vec<Outcome> = specs.iter().map(|s| solo(&engine, s)).collect();
    let got = batched(&engine, &specs, config);
    for (i, ((g, _), a)) in got.iter().zip(&alone).enumerate() {
        if specs[i].flag_at.is_none() {
            assert_eq!(g.ids, a.ids, "kv budget: request {i}");
        }
    }

    let mut sched = Scheduler::new(&engine, config).unwrap();
    let results: Results = Arc::new(Mutex::new(vec![None]));
    let mut big = specs[0].clone();
    big.max_new = largest + 11 - big.prompt.len();
    let e = sched.submit(job(&big, 0, &results, Arc::new(AtomicBool::new(false)))).unwrap_err();
    assert!(matches!(e, EngineError::Invalid { field: "max_tokens", .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("KV budget") && msg.contains("--kv-budget"), "{msg}");
    assert!(sched.is_idle() && results.lock().unwrap()[0].is_none(), "nothing ran");
    // Context overflow is refused the same way.
    big.max_new = 10_000;
    assert!(sched.submit(job(&big, 0, &results, Arc::new(AtomicBool::new(false)))).is_err());
}

#[test]
fn max_batch_queues_in_order_and_queued_requests_can_be_cancelled() {
    let engine = Engine::load(&fixture("qwen3_moe_tiny")).unwrap();
    let specs = specs();
    let config = SchedulerConfig {
        max_batch: 2,
        prefill_chunk: 8,
        kv_budget: None,
    };
    let results: Results = Arc::new(Mutex::new(vec![None; specs.len()]));
    let flags: Vec<Arc<AtomicBool>> = specs.iter().map(|_| Arc::new(AtomicBool::new(false))).collect();
    let mut sched = Scheduler::new(&engine, config).unwrap();
    for (i, s) in specs.iter().enumerate() {
        sched.submit(job(s, i, &results, flags[i].clone())).unwrap();
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
        kv_budget: None,
    };
    let results: Results = Arc::new(Mutex::new(vec![None, None]));
    let mut sched = Scheduler::new(&engine, config).unwrap();
    for (i, s) in [&first, &second].into_iter().enumerate() {
        sched.submit(job(s, i, &results, Arc::new(AtomicBool::new(false)))).unwrap();
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
