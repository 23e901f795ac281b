//! What the scheduler tests share: request scenarios ([`Spec`]), a request
//! run alone through `Engine::run` ([`solo`]: a scheduler of its own, one
//! sequence, no prefix cache), a scenario run through a [`Scheduler`] step
//! by step with its invariants checked after every step ([`batched`]), and
//! the comparison of the two ([`check_model`]).

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use larder_engine::{
    Drafting, Engine, EngineError, ExpertMode, FinishReason, GenerateOptions, Job, LoadOptions, Outcome, RequestEvent, RequestSink,
    SamplingParams, Scheduler, SchedulerConfig,
};
use larder_store::pack::pack;
use larder_store::{IoKind, IoOptions, StoreOptions};

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

/// qwen3_moe_tiny packed into a temp folder `tag` (removed first) and loaded
/// streaming through a RAM cache that holds no expert; returns the folder too.
pub fn streamed_tiny(tag: &str) -> (Engine, PathBuf) {
    let out = std::env::temp_dir().join(format!("larder-{tag}-{}", std::process::id()));
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
        ..Default::default()
    };
    (Engine::load_with(&store, &opts).unwrap(), out)
}

/// One request of a scenario.
#[derive(Clone)]
pub struct Spec {
    pub prompt: Vec<u32>,
    pub max_new: usize,
    pub temperature: f32,
    pub seed: u64,
    pub stop: Vec<String>,
    /// The step at which it is submitted.
    pub arrive: usize,
    /// Its sink cancels after this many tokens.
    pub sink_cancel_after: Option<usize>,
    /// Its cancel flag is set at this step.
    pub flag_at: Option<usize>,
    /// Its cancel flag is set right after a step that preempted it (it is
    /// then queued with no state).
    pub cancel_when_preempted: bool,
    /// Its drafter (speculative decoding; `None`: plain decoding).
    pub drafting: Option<Drafting>,
}

impl Spec {
    /// Whether it is cancelled by its flag at some step (its output is then
    /// a prefix of its solo run).
    pub fn flagged(&self) -> bool {
        self.flag_at.is_some() || self.cancel_when_preempted
    }
}

pub fn options(s: &Spec) -> GenerateOptions {
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

/// `n` prompt tokens, varied by `k`.
pub fn prompt(n: usize, k: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + k * 101 + 5) % 500 + 3).collect()
}

pub fn spec(prompt: Vec<u32>, max_new: usize, temperature: f32, seed: u64, arrive: usize) -> Spec {
    Spec {
        prompt,
        max_new,
        temperature,
        seed,
        stop: Vec::new(),
        arrive,
        sink_cancel_after: None,
        flag_at: None,
        cancel_when_preempted: false,
        drafting: None,
    }
}

pub fn specs() -> Vec<Spec> {
    let mut v = vec![
        spec(prompt(7, 1), 12, 0.0, 0, 0),
        spec(prompt(23, 2), 9, 0.8, 7, 0),
        spec(prompt(3, 3), 15, 1.0, 11, 2),
        spec(prompt(31, 4), 6, 0.0, 0, 3),
        spec(prompt(11, 5), 14, 0.7, 3, 5),
        spec(prompt(1, 6), 10, 1.2, 99, 1),
    ];
    v[2].sink_cancel_after = Some(4);
    v[4].flag_at = Some(8);
    v
}

/// `s` as a job (its drafter made fresh).
pub fn job_of(s: &Spec) -> Job {
    Job {
        prompt: s.prompt.clone(),
        options: options(s),
        stop: s.stop.clone(),
        drafter: s.drafting.as_ref().and_then(|d| d.drafter().unwrap()),
        ..Job::default()
    }
}

/// A request alone through `Engine::run` (its sink cancels as the spec says).
pub fn solo(engine: &Engine, s: &Spec) -> Outcome {
    let mut n = 0;
    let mut sink = |e: RequestEvent<'_>| {
        if let RequestEvent::Token { .. } = e {
            n += 1;
        }
        s.sink_cancel_after.is_none_or(|c| n < c)
    };
    engine.run(job_of(s), &mut sink).unwrap()
}

pub type Results = Arc<Mutex<Vec<Option<(Outcome, String)>>>>;

/// The sink of a scenario's request: collects its streamed text and
/// outcome into `results[slot]`, checks it saw one `Token` event per new
/// id, cancels after `cancel_after` tokens or when `flag` is set.
struct SpecSink {
    slot: usize,
    results: Results,
    cancel_after: Option<usize>,
    flag: Arc<AtomicBool>,
    tokens: usize,
    streamed: String,
}

impl RequestSink for SpecSink {
    fn event(&mut self, e: RequestEvent<'_>) -> bool {
        match e {
            RequestEvent::Token { text, .. } => {
                self.tokens += 1;
                self.streamed.push_str(text);
                self.cancel_after.is_none_or(|c| self.tokens < c)
            }
            RequestEvent::Text(t) => {
                self.streamed.push_str(t);
                true
            }
            RequestEvent::Finished(o) => {
                assert_eq!(self.tokens, o.ids.len(), "request {}: one token event per new id", self.slot);
                self.results.lock().unwrap()[self.slot] = Some((o.clone(), std::mem::take(&mut self.streamed)));
                true
            }
        }
    }

    fn cancelled(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }
}

/// Submits `s` to `sched`, its outcome and streamed text landing in
/// `results[slot]`, cancelled when `cancel` is set.
pub fn submit(sched: &mut Scheduler<'_>, s: &Spec, slot: usize, results: &Results, cancel: Arc<AtomicBool>) -> Result<u64, EngineError> {
    let sink = SpecSink {
        slot,
        results: results.clone(),
        cancel_after: s.sink_cancel_after,
        flag: cancel,
        tokens: 0,
        streamed: String::new(),
    };
    sched.submit(job_of(s), Box::new(sink))
}

/// What a scenario run through a scheduler gave.
pub struct Batched {
    /// Per spec: its outcome and streamed text.
    pub results: Vec<(Outcome, String)>,
    pub preemptions: u64,
    /// Specs cancelled while preempted and queued.
    pub cancelled_preempted: Vec<usize>,
}

/// Runs `specs` through a scheduler, checking after every step the batch
/// bound and the KV budget (sequence states plus the prefix cache); at the
/// end no sequence state is left and clearing the cache leaves 0 bytes.
pub fn batched(engine: &Engine, specs: &[Spec], config: SchedulerConfig) -> Batched {
    let results: Results = Arc::new(Mutex::new(vec![None; specs.len()]));
    let flags: Vec<Arc<AtomicBool>> = specs.iter().map(|_| Arc::new(AtomicBool::new(false))).collect();
    let mut sched = Scheduler::new(engine, config).unwrap();
    let mut slots: HashMap<u64, usize> = HashMap::new();
    let (mut step, mut widest, mut cancelled_preempted) = (0, 0, Vec::new());
    while step < 1000 {
        for (i, s) in specs.iter().enumerate() {
            if s.arrive == step {
                slots.insert(submit(&mut sched, s, i, &results, flags[i].clone()).unwrap(), i);
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
            let held = sched.state_bytes() + sched.kept_bytes();
            assert!(held <= budget, "step {step}: state and cache {held} over budget {budget}");
        }
        for id in &report.preempted {
            let i = slots[id];
            if specs[i].cancel_when_preempted && !flags[i].swap(true, Ordering::Relaxed) {
                cancelled_preempted.push(i);
            }
        }
        step += 1;
        if sched.is_idle() && specs.iter().all(|s| s.arrive < step) {
            break;
        }
    }
    assert!(sched.is_idle(), "still busy after {step} steps");
    assert_eq!(widest > 1, config.max_batch > 1, "sequences ran together (widest batch {widest})");
    assert_eq!(sched.state_bytes(), 0, "sequence state left when idle");
    let preemptions = sched.preemptions();
    sched.clear_kept();
    assert_eq!((sched.kept_bytes(), sched.kept_conversations()), (0, 0));
    let results = results
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.clone().expect("every request finished"))
        .collect();
    Batched {
        results,
        preemptions,
        cancelled_preempted,
    }
}

/// Asserts each of `got` equals its solo run in `alone` (a prefix of it for
/// one cancelled by its flag).
pub fn check_against_alone(label: &str, specs: &[Spec], got: &[(Outcome, String)], alone: &[Outcome]) {
    for (i, ((g, streamed), a)) in got.iter().zip(alone).enumerate() {
        let arm = format!("{label} request {i}");
        if specs[i].flagged() {
            assert!(a.ids.starts_with(&g.ids), "{arm}: {:?} vs alone {:?}", g.ids, a.ids);
            continue;
        }
        assert_eq!(g.ids, a.ids, "{arm}: ids");
        assert_eq!(g.text, a.text, "{arm}: text");
        assert_eq!(streamed, &a.text, "{arm}: streamed text");
        assert_eq!(g.finish_reason, a.finish_reason, "{arm}: finish reason");
        assert_eq!(g.stop_string, a.stop_string, "{arm}: stop string");
    }
}

/// Runs `specs` at batch sizes 8, 3 and 1 (small prefill chunks) and checks
/// every request against its solo run.
pub fn check_model(engine: &Engine, label: &str, specs: &[Spec]) {
    let alone: Vec<Outcome> = specs.iter().map(|s| solo(engine, s)).collect();
    for (max_batch, prefill_chunk) in [(8, 4), (3, 5), (1, 256)] {
        let config = SchedulerConfig {
            max_batch,
            prefill_chunk,
            ..SchedulerConfig::default()
        };
        let got = batched(engine, specs, config).results;
        let arm = format!("{label} max_batch={max_batch} chunk={prefill_chunk}");
        check_against_alone(&arm, specs, &got, &alone);
        assert_eq!(got[2].0.finish_reason, FinishReason::Cancelled, "{label}: sink cancel");
        assert!(!got[0].0.ids.is_empty(), "{label}: generated");
    }
}

/// Runs `s` alone through `sched` to the end, checking the KV budget after
/// every step and that no state is left when idle; returns its outcome.
pub fn run_one(sched: &mut Scheduler<'_>, s: &Spec, budget: Option<usize>) -> Outcome {
    let results: Results = Arc::new(Mutex::new(vec![None]));
    submit(sched, s, 0, &results, Arc::new(AtomicBool::new(false))).unwrap();
    while !sched.is_idle() {
        let report = sched.step();
        assert!(report.failed.is_empty(), "{:?}", report.failed);
        if let Some(b) = budget {
            assert!(sched.state_bytes() + sched.kept_bytes() <= b, "over the KV budget");
        }
    }
    assert_eq!(sched.state_bytes(), 0, "state left when idle");
    let out = results.lock().unwrap()[0].clone().expect("finished").0;
    out
}
