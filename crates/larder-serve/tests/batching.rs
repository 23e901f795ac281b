//! Batching over real HTTP: 4 concurrent streaming chat requests (greedy and
//! seeded sampling, different lengths and stop strings) each get exactly the
//! text their request gets alone from the engine; a request whose worst case
//! exceeds `--kv-budget` gets a 400 before generation; afterwards no sequence
//! runs or waits and no KV bytes are in use. With a drafter (`--draft`)
//! concurrent greedy requests batch too, each with the text it gets alone
//! without one.

use std::time::{Duration, Instant};

use larder_engine::{ChatMessage, DrafterChoice, Engine, GenerateOptions, SamplingParams};
use larder_serve::{bind, start, Loaded, ServerConfig};
use serde_json::{json, Value};

mod common;
use common::*;

struct Case {
    content: &'static str,
    max_tokens: usize,
    /// `(temperature, seed)`; `None`: greedy.
    sampled: Option<(f32, u64)>,
    stop: Vec<String>,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            content: "Hello there",
            max_tokens: 12,
            sampled: None,
            stop: Vec::new(),
        },
        Case {
            content: "Tell me a long story about a cat and a dog",
            max_tokens: 20,
            sampled: Some((0.9, 5)),
            stop: Vec::new(),
        },
        Case {
            content: "Hi",
            max_tokens: 7,
            sampled: Some((1.3, 77)),
            stop: vec!["e".into()],
        },
        Case {
            content: "What is two plus two?",
            max_tokens: 16,
            sampled: None,
            stop: vec!["zz".into()],
        },
    ]
}

fn body(c: &Case) -> Value {
    let (temperature, seed) = c.sampled.unwrap_or((0.0, 0));
    json!({"model": "tiny", "messages": [{"role": "user", "content": c.content}], "max_tokens": c.max_tokens,
           "temperature": temperature, "top_p": 1.0, "top_k": 0, "seed": seed, "stop": c.stop, "stream": true})
}

/// The text `c` gets alone, through the engine's request loop.
fn alone(engine: &Engine, c: &Case) -> String {
    let prompt = engine.encode_chat(&[ChatMessage::new("user", c.content)]).unwrap();
    let (temperature, seed) = c.sampled.unwrap_or((0.0, 0));
    let options = GenerateOptions {
        max_new: c.max_tokens,
        sampling: SamplingParams {
            temperature,
            top_p: 1.0,
            top_k: 0,
            seed,
        },
        ..GenerateOptions::default()
    };
    solo_text(engine, &prompt, &options, &c.stop)
}

#[test]
fn concurrent_streams_each_equal_their_solo_run() {
    let model = fixture("qwen3_moe_tok");
    let engine = Engine::load(&model).unwrap();
    let expected: Vec<String> = cases().iter().map(|c| alone(&engine, c)).collect();
    let srv = start(
        Engine::load(&model).unwrap(),
        ServerConfig {
            port: 0,
            served_name: "tiny".into(),
            max_batch: 3,
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let a = srv.addr;
    for round in 0..2 {
        let bodies = cases().iter().map(body).collect();
        assert_concurrent_streams(a, "/v1/chat/completions", bodies, &expected, &format!("round {round}"));
    }
    let t = Instant::now();
    while metric(a, "larder_queue_depth") != 0 || metric(a, "larder_running_sequences") != 0 {
        assert!(t.elapsed() < Duration::from_secs(10), "requests still counted after they ended");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(metric(a, "larder_queued_sequences"), 0);
    assert_eq!(metric(a, "larder_kv_bytes_in_use"), 0, "sequence state left when idle");
}

#[test]
fn concurrent_drafting_streams_batch_and_keep_their_greedy_text() {
    let model = fixture("qwen3_moe_tok");
    let engine = Engine::load(&model).unwrap();
    let greedy: Vec<Case> = cases()
        .into_iter()
        .map(|c| Case {
            sampled: None,
            max_tokens: c.max_tokens + 8,
            ..c
        })
        .collect();
    let expected: Vec<String> = greedy.iter().map(|c| alone(&engine, c)).collect();
    for choice in [DrafterChoice::Ngram, DrafterChoice::SelfDraft] {
        let engine = Engine::load(&model).unwrap();
        let drafting = engine.drafting(&choice).unwrap();
        let srv = bind(ServerConfig {
            port: 0,
            served_name: "tiny".into(),
            max_batch: 3,
            ..ServerConfig::default()
        })
        .unwrap();
        srv.attach(Loaded { engine, drafting });
        let a = srv.addr;
        let bodies = greedy.iter().map(body).collect();
        assert_concurrent_streams(a, "/v1/chat/completions", bodies, &expected, &format!("{choice:?}"));
        assert_idle_with_no_state(a);
    }
}

#[test]
fn a_request_over_the_kv_budget_is_refused_before_generation() {
    let engine = Engine::load(&fixture("qwen3_moe_tok")).unwrap();
    // Room for 100 positions: the prompt and 2 new tokens fit, 200 new tokens do not.
    let per_token = larder_engine::Scheduler::new(&engine, Default::default())
        .unwrap()
        .bytes_per_token();
    let srv = start(
        engine,
        ServerConfig {
            port: 0,
            served_name: "tiny".into(),
            kv_budget: Some(100 * per_token),
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let a = srv.addr;
    let mut c = cases().remove(0);
    c.max_tokens = 200;
    let mut req = body(&c);
    req["stream"] = json!(false);
    let r = post(a, "/v1/chat/completions", &req);
    assert_eq!(r.status, 400, "{}", r.body);
    let msg = r.json()["error"]["message"].as_str().unwrap_or_default().to_string();
    assert!(msg.contains("KV budget") && msg.contains("max_tokens"), "{msg}");
    assert_eq!(metric(a, "larder_completion_tokens_total"), 0, "nothing was generated");
    // A small request fits.
    req["max_tokens"] = json!(2);
    let r = post(a, "/v1/chat/completions", &req);
    assert_eq!(r.status, 200, "{}", r.body);
}
