//! The scheduler records routes (`serve --trace`): requests batched together
//! give, row for row, the routes and router lookahead each gives alone
//! (`Engine::generate_traced`), tagged with their own request id, position
//! and phase, and the log is a valid trace that reads back as written.

use larder_engine::{
    Engine, GenerateOptions, Job, OutputFile, OutputKind, Phase, RequestEvent, RouteLog, RowTag, RunInputs, Scheduler, SchedulerConfig,
};
use larder_router::{Trace, TraceToken};

mod scheduler_support;
use scheduler_support::{fixture, prompt};

/// Greedy (the default sampling), past EOS.
fn options(max_new: usize) -> GenerateOptions {
    GenerateOptions {
        max_new,
        stop_at_eos: false,
        ..GenerateOptions::default()
    }
}

/// The trace tokens of `prompt` generated alone, tagged as sequence `seq`.
fn alone(engine: &Engine, log: &RouteLog, prompt: &[u32], max_new: usize, seq: usize) -> Vec<TraceToken> {
    let mut rt = log.recorder();
    engine
        .generate_traced(prompt, &options(max_new), &mut |_| true, Some(&mut rt))
        .expect("generates alone");
    let mut solo = log.clone();
    let before = solo.tokens();
    solo.append(&rt, |row| RowTag {
        seq,
        pos: row,
        phase: if row < prompt.len() { Phase::Prompt } else { Phase::Decode },
    });
    solo.trace().tokens[before..].to_vec()
}

#[test]
fn batched_routes_equal_each_request_alone() {
    for name in ["qwen3_moe_tiny", "deepseek_v3_tiny"] {
        let engine = Engine::load(&fixture(name)).unwrap();
        let log = RouteLog::new(engine.model().spec(), name, 1000, 3).expect("a MoE model");
        let config = SchedulerConfig {
            max_batch: 4,
            prefill_chunk: 5,
            ..SchedulerConfig::default()
        };
        let mut sched = Scheduler::new(&engine, config).unwrap();
        sched.record_routes(log.clone());
        let requests = [(prompt(9, 1), 6), (prompt(13, 2), 4), (prompt(2, 3), 7)];
        let mut ids = Vec::new();
        for (p, max_new) in &requests {
            let job = Job {
                prompt: p.clone(),
                options: options(*max_new),
                ..Job::default()
            };
            ids.push(sched.submit(job, Box::new(|_: RequestEvent<'_>| true)).unwrap() as usize);
        }
        while !sched.is_idle() {
            let report = sched.step();
            assert!(report.failed.is_empty(), "{name}: {:?}", report.failed);
        }
        let recorded = sched.routes().expect("recording").trace().clone();
        recorded.check().expect("a valid trace");
        let passes: Vec<usize> = recorded.tokens.iter().map(|t| t.pass).collect();
        assert!(passes.windows(2).all(|w| w[0] <= w[1]), "{name}: passes in order");
        assert!(
            recorded.tokens.windows(2).any(|w| w[0].pass == w[1].pass && w[0].seq != w[1].seq),
            "{name}: some pass batched rows of two requests"
        );
        for ((p, max_new), &id) in requests.iter().zip(&ids) {
            let mut mine: Vec<TraceToken> = recorded.tokens.iter().filter(|t| t.seq == id).cloned().collect();
            mine.iter_mut().for_each(|t| t.pass = 0);
            let mut solo = alone(&engine, &log, p, *max_new, id);
            solo.iter_mut().for_each(|t| t.pass = 0);
            assert_eq!(mine.len(), p.len() + max_new - 1, "{name}: every fed position");
            assert_eq!(mine, solo, "{name}: request {id}'s routes equal its solo run's");
        }

        // It reads back as written.
        let path = std::env::temp_dir().join(format!("larder-sched-routes-{name}-{}.jsonl", std::process::id()));
        let mut out = OutputFile::check("--trace", &path, OutputKind::RouteTrace, true, &RunInputs::new()).unwrap();
        sched.routes().unwrap().write(&mut out).unwrap();
        assert_eq!(Trace::read(&path).unwrap(), recorded);
        let _ = std::fs::remove_file(&path);
    }
}
