//! The engine handle: jobs submitted from several threads at once (drafting
//! and not) each get, event by event, what the request gets alone through
//! `Engine::run`; a refused job is an error before anything runs; cancelling
//! (the flag, or dropping the events) ends a job at the next step; metrics
//! count what ran and return to idle; `stop` lets every job finish and
//! writes the route trace a last time.

use std::time::{Duration, Instant};

use larder_engine::{
    DrafterChoice, Engine, EngineError, EngineHandle, Event, Events, FinishReason, GenerateOptions, HandleConfig, Job, Outcome, OutputFile,
    OutputKind, RequestEvent, RunInputs, SamplingParams, SchedulerConfig, TraceConfig,
};

mod common;
use common::{fixture, scratch_dir};

const PROMPTS: [&[u32]; 3] = [
    &[262, 406, 39, 423, 313, 87, 465],
    &[5, 6, 7, 8, 5, 6, 7, 8, 5, 6],
    &[360, 386, 74, 15],
];

fn options(max_new: usize, temperature: f32) -> GenerateOptions {
    GenerateOptions {
        max_new,
        sampling: SamplingParams {
            temperature,
            top_p: 0.9,
            top_k: 40,
            seed: 3,
        },
        stop_at_eos: false,
        ..GenerateOptions::default()
    }
}

/// Every event of a job: the streamed text, the token ids, and its outcome.
fn drain(mut events: Events) -> (String, Vec<u32>, Outcome) {
    let (mut text, mut ids) = (String::new(), Vec::new());
    while let Some(event) = events.blocking_recv() {
        match event {
            Event::Token { id, text: t, .. } => {
                ids.push(id);
                text.push_str(&t);
            }
            Event::Text(t) => text.push_str(&t),
            Event::Done(outcome) => return (text, ids, *outcome),
            Event::Failed(e) => panic!("the job failed: {e}"),
        }
    }
    panic!("the events ended without Done or Failed");
}

fn wait_idle(handle: &EngineHandle) {
    let t = Instant::now();
    loop {
        let m = handle.metrics();
        if m.running == 0 && m.waiting == 0 {
            assert_eq!(m.kv_bytes_in_use, 0, "state left when idle");
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "still busy: {m:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn concurrent_jobs_drafting_or_not_equal_their_solo_runs() {
    let model = fixture("qwen3_moe_tok");
    let reference = Engine::load(&model).unwrap();
    let engine = Engine::load(&model).unwrap();
    let choices = [DrafterChoice::Ngram, DrafterChoice::SelfDraft, DrafterChoice::Off];
    let draftings: Vec<_> = choices.iter().map(|c| engine.drafting(c).unwrap()).collect();
    let trace_path = scratch_dir("handle-trace").join("routes.jsonl");
    let output = OutputFile::check("--trace", &trace_path, OutputKind::RouteTrace, false, &RunInputs::new()).unwrap();
    let config = HandleConfig {
        scheduler: SchedulerConfig {
            max_batch: 4,
            ..SchedulerConfig::default()
        },
        trace: Some(TraceConfig {
            output,
            model: "qwen3_moe_tok".into(),
            expert_bytes: 1000,
            lookahead: 1,
        }),
        ..HandleConfig::default()
    };
    let handle = EngineHandle::start(engine, config).unwrap();
    let jobs = |i: usize| Job {
        prompt: PROMPTS[i].to_vec(),
        options: options(20, if i == 1 { 0.0 } else { 0.8 }),
        stop: if i == 2 { vec!["\u{1}never".into()] } else { Vec::new() },
        drafter: draftings[i].drafter().unwrap(),
        ..Job::default()
    };
    let events: Vec<Events> = (0..3).map(|i| handle.submit(jobs(i)).unwrap()).collect();
    let readers: Vec<_> = events.into_iter().map(|e| std::thread::spawn(move || drain(e))).collect();
    for (i, reader) in readers.into_iter().enumerate() {
        let (text, ids, outcome) = reader.join().unwrap();
        let alone = reference.run(jobs(i), &mut |_: RequestEvent<'_>| true).unwrap();
        let drafted =
            alone.stats.speculative.as_ref().is_some_and(|s| s.disabled) || outcome.stats.speculative.as_ref().is_some_and(|s| s.disabled);
        if i == 1 || !drafted {
            assert_eq!(outcome.ids, alone.ids, "job {i}");
            assert_eq!(outcome.text, alone.text, "job {i}");
        }
        assert_eq!(ids, outcome.ids, "job {i}: one Token event per id");
        assert_eq!(text, outcome.text, "job {i}: the streamed text");
        assert_eq!(outcome.stats.speculative.is_some(), i < 2, "job {i}");
    }
    wait_idle(&handle);
    let m = handle.metrics();
    assert_eq!((m.jobs, m.completion_tokens), (3, 60), "{m:?}");
    assert_eq!(m.prompt_tokens, PROMPTS.iter().map(|p| p.len() as u64).sum::<u64>());
    handle.stop().unwrap();
    let trace = larder_router::Trace::read(&trace_path).unwrap();
    assert!(!trace.tokens.is_empty(), "the routes were written at the stop");
    let _ = std::fs::remove_dir_all(trace_path.parent().unwrap());
}

#[test]
fn refused_jobs_are_errors_and_cancelled_jobs_end_at_once() {
    let engine = Engine::load(&fixture("qwen3_moe_tiny")).unwrap();
    let context = engine.model().spec().max_position_embeddings;
    let per_token = larder_engine::KvCosts::of(&engine).bytes_per_token;
    let config = HandleConfig {
        scheduler: SchedulerConfig {
            kv_budget: Some(200 * per_token),
            ..SchedulerConfig::default()
        },
        ..HandleConfig::default()
    };
    let handle = EngineHandle::start(engine, config).unwrap();
    let job = |max_new: usize| Job {
        prompt: PROMPTS[0].to_vec(),
        options: options(max_new, 0.0),
        ..Job::default()
    };
    let too_long = handle.submit(job(context)).err();
    assert!(
        matches!(too_long, Some(EngineError::Invalid { field: "max_tokens", .. })),
        "{too_long:?}"
    );
    let over_budget = handle.submit(job(200)).err();
    assert!(matches!(over_budget, Some(EngineError::KvBudget { .. })), "{over_budget:?}");
    assert_eq!(handle.metrics().jobs, 0, "nothing was accepted");

    // The cancel flag: the job ends with the tokens it made.
    let mut events = handle.submit(job(150)).unwrap();
    let mut tokens = 0;
    let outcome = loop {
        match events.blocking_recv().expect("an event") {
            Event::Token { .. } => {
                tokens += 1;
                if tokens == 2 {
                    events.cancel();
                }
            }
            Event::Done(o) => break o,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(outcome.finish_reason, FinishReason::Cancelled);
    assert!(outcome.ids.len() < 150 && outcome.ids.len() == tokens, "{}", outcome.ids.len());
    // Waiting for a job's outcome.
    let done = handle.submit(job(4)).unwrap().wait().unwrap();
    assert_eq!((done.ids.len(), done.finish_reason), (4, FinishReason::Length));
    // Dropping the events cancels too.
    let events = handle.submit(job(150)).unwrap();
    drop(events);
    wait_idle(&handle);
    assert!(handle.metrics().completion_tokens < 300 + 4);
    handle.stop().unwrap();
}
