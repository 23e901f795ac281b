//! Kimi Linear (KDA + MLA, a recurrent state) over real HTTP: concurrent
//! streaming completions on kimi_linear_tiny (greedy and seeded, different
//! lengths) each get exactly the text their request gets alone from the
//! engine, twice over (the second round reuses the first's conversations
//! through the prefix cache's snapshots), also under a KV budget that
//! forces preemption; afterwards nothing runs or waits and no sequence
//! state is in use. The fixture ships no tokenizer: a copy gets a
//! word-level one (`t<id>` per id) so that text names every id.

use std::path::{Path, PathBuf};

use larder_engine::{Engine, GenerateOptions, SamplingParams, Scheduler, SchedulerConfig};
use larder_serve::{start, ServerConfig};
use serde_json::{json, Value};

mod common;
use common::*;

/// kimi_linear_tiny's model files with a word-level tokenizer over its 512 ids.
fn model_with_tokenizer(tag: &str) -> PathBuf {
    let dir = fixture_copy("kimi_linear_tiny", tag);
    let vocab: serde_json::Map<String, Value> = (0..512).map(|i| (format!("t{i}"), json!(i))).collect();
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    dir
}

struct Case {
    prompt: Vec<u32>,
    max_tokens: usize,
    /// `(temperature, seed)`; `None`: greedy.
    sampled: Option<(f32, u64)>,
}

fn cases() -> Vec<Case> {
    let ids = |n: u32, k: u32| (0..n).map(|i| (i * 37 + k * 101 + 5) % 500 + 3).collect::<Vec<u32>>();
    vec![
        Case {
            prompt: ids(9, 1),
            max_tokens: 12,
            sampled: None,
        },
        Case {
            prompt: ids(21, 2),
            max_tokens: 16,
            sampled: Some((0.9, 5)),
        },
        Case {
            prompt: ids(3, 3),
            max_tokens: 7,
            sampled: Some((1.3, 77)),
        },
        Case {
            prompt: ids(14, 4),
            max_tokens: 10,
            sampled: None,
        },
    ]
}

fn sampling(c: &Case) -> SamplingParams {
    let (temperature, seed) = c.sampled.unwrap_or((0.0, 0));
    SamplingParams {
        temperature,
        top_p: 1.0,
        top_k: 0,
        seed,
    }
}

fn body(c: &Case) -> Value {
    let s = sampling(c);
    json!({"model": "tiny", "prompt": c.prompt, "max_tokens": c.max_tokens, "temperature": s.temperature,
           "top_p": 1.0, "top_k": 0, "seed": s.seed, "stream": true})
}

/// The text `c` gets alone, through the engine's request loop.
fn alone(engine: &Engine, c: &Case) -> String {
    let options = GenerateOptions {
        max_new: c.max_tokens,
        sampling: sampling(c),
        ..GenerateOptions::default()
    };
    solo_text(engine, &c.prompt, &options, &[])
}

fn check_concurrent_streams(model: &Path, kv_budget: Option<usize>) {
    let engine = Engine::load(model).unwrap();
    let expected: Vec<String> = cases().iter().map(|c| alone(&engine, c)).collect();
    assert!(expected.iter().all(|t| t.starts_with('t')), "the tokenizer names ids: {expected:?}");
    let config = ServerConfig {
        port: 0,
        served_name: "tiny".into(),
        max_batch: 3,
        kv_budget,
        ..ServerConfig::default()
    };
    let srv = start(engine, config).unwrap();
    let a = srv.addr;
    // Whether requests overlap enough to preempt depends on when each
    // arrives (they are prepared off the engine thread): under a budget,
    // rounds go on (every one checked) until one preempted, or give up.
    for round in 0..20 {
        let bodies = cases().iter().map(body).collect();
        let label = format!("budget {kv_budget:?} round {round}");
        assert_concurrent_streams(a, "/v1/completions", bodies, &expected, &label);
        if round >= 1 && (kv_budget.is_none() || metric(a, "larder_preemptions_total") > 0) {
            break;
        }
    }
    assert_idle_with_no_state(a);
    if kv_budget.is_some() {
        assert!(
            metric(a, "larder_preemptions_total") > 0,
            "the budget forced no preemption in 20 rounds"
        );
    }
}

#[test]
fn concurrent_kimi_linear_streams_each_equal_their_solo_text() {
    let model = model_with_tokenizer("kimi-linear-batching");
    check_concurrent_streams(&model, None);
    let _ = std::fs::remove_dir_all(&model);
}

#[test]
fn kimi_linear_streams_under_a_preempting_kv_budget_equal_their_solo_text() {
    let model = model_with_tokenizer("kimi-linear-preemption");
    let engine = Engine::load(&model).unwrap();
    let sched = Scheduler::new(&engine, SchedulerConfig::default()).unwrap();
    let largest = cases().iter().map(|c| c.prompt.len() + c.max_tokens).max().unwrap();
    // Room for two sequences' fixed states and the largest one's positions:
    // two run together until they outgrow it.
    let budget = 2 * sched.bytes_per_sequence() + (largest + 4) * sched.bytes_per_token();
    drop(sched);
    check_concurrent_streams(&model, Some(budget));
    let _ = std::fs::remove_dir_all(&model);
}
