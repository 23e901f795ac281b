//! TTFT of a conversation's second turn after a restart, with and without
//! the prefix cache's disk tier (bench/results/2026-12-03-state-disk.md).
//!
//! `cargo run --release -p larder-engine --example state_disk_bench -- MODEL_DIR STATE_DIR [PROMPT_TOKENS]`
//!
//! Turn 1 (PROMPT_TOKENS ids, 8 new greedy tokens) runs with the disk tier;
//! then, each time with a freshly loaded engine and scheduler (a restart),
//! turn 2 (turn 1's history and 16 more ids, 1 new token) runs without the
//! disk tier and with it. Prints one JSON line per run.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use larder_engine::{DiskTierConfig, Engine, GenerateOptions, Job, Outcome, RequestEvent, SamplingParams, Scheduler, SchedulerConfig};

fn run(engine: &Engine, dir: Option<&PathBuf>, prompt: &[u32], max_new: usize) -> Result<(Outcome, String), Box<dyn std::error::Error>> {
    let mut sched = Scheduler::new(engine, SchedulerConfig::default())?;
    if let Some(dir) = dir {
        sched.attach_disk_tier(DiskTierConfig {
            dir: dir.clone(),
            quota: 8 << 30,
        })?;
    }
    let out: Arc<Mutex<Option<Outcome>>> = Arc::default();
    let slot = out.clone();
    let options = GenerateOptions {
        max_new,
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        stop_at_eos: false,
        ..GenerateOptions::default()
    };
    let job = Job {
        prompt: prompt.to_vec(),
        options,
        ..Job::default()
    };
    sched.submit(
        job,
        Box::new(move |e: RequestEvent<'_>| {
            if let RequestEvent::Finished(o) = e {
                if let Ok(mut s) = slot.lock() {
                    *s = Some(o.clone());
                }
            }
            true
        }),
    )?;
    while !sched.is_idle() {
        if let Some(f) = sched.step().failed.pop() {
            return Err(f.error.into());
        }
    }
    let disk = serde_json::to_string(&sched.disk_stats())?;
    let o = out.lock().map_err(|_| "poisoned")?.take().ok_or("no outcome")?;
    Ok((o, disk))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(model), Some(state)) = (args.get(1), args.get(2)) else {
        return Err("usage: state_disk_bench MODEL_DIR STATE_DIR [PROMPT_TOKENS]".into());
    };
    let n: usize = args.get(3).map_or(Ok(512), |s| s.parse())?;
    let (model, state) = (PathBuf::from(model), PathBuf::from(state));
    let _ = std::fs::remove_dir_all(&state);
    let t1: Vec<u32> = (0..n as u32).map(|i| (i * 37 + 11) % 1000 + 3).collect();
    let (o1, _) = run(&Engine::load(&model)?, Some(&state), &t1, 8)?;
    let t2: Vec<u32> = t1.iter().chain(&o1.ids).copied().chain((0..16).map(|i| 500 + i)).collect();
    for (label, dir) in [("without disk tier", None), ("with disk tier", Some(&state))] {
        let engine = Engine::load(&model)?;
        let (o, disk) = run(&engine, dir, &t2, 1)?;
        println!(
            "{{\"run\": \"{label}\", \"prompt_tokens\": {}, \"cached_tokens\": {}, \"ttft_s\": {:.4}, \"prefill_s\": {:.4}, \"disk\": {disk}}}",
            o.prompt_tokens, o.cached_tokens, o.stats.time_to_first_token_s, o.stats.prefill_s
        );
    }
    Ok(())
}
