//! The scheduler's preemption and prefix cache over real HTTP: 4 concurrent
//! streaming chats under a `kv_budget` too small for all of them at once
//! each get exactly the text their request gets alone, `/metrics` counts the
//! preemptions, and afterwards nothing runs or waits and no KV bytes are in
//! use; two interleaved multi-turn conversations each reuse their own
//! history (`cached_tokens` in usage) on their second turns; clients that
//! leave while queued, just after sending and while decoding leave no KV
//! bytes in use.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use larder_engine::{ChatMessage, Engine, GenerateOptions, SamplingParams, Scheduler};
use larder_serve::{start, ServerConfig};
use serde_json::{json, Value};

mod common;
use common::*;

struct Case {
    content: &'static str,
    max_tokens: usize,
    /// `(temperature, seed)`; `None`: greedy.
    sampled: Option<(f32, u64)>,
}

fn cases() -> Vec<Case> {
    let case = |content, max_tokens, sampled| Case {
        content,
        max_tokens,
        sampled,
    };
    vec![
        case("Hello there", 40, None),
        case("Tell me a long story about a cat and a dog", 36, Some((0.9, 5))),
        case("Hi", 44, Some((1.3, 77))),
        case("What is two plus two?", 38, None),
    ]
}

fn body(c: &Case) -> Value {
    let (temperature, seed) = c.sampled.unwrap_or((0.0, 0));
    json!({"model": "tiny", "messages": [{"role": "user", "content": c.content}], "max_tokens": c.max_tokens,
           "temperature": temperature, "top_p": 1.0, "top_k": 0, "seed": seed, "ignore_eos": true, "stream": true})
}

fn prompt(engine: &Engine, c: &Case) -> Vec<u32> {
    engine.encode_chat(&[ChatMessage::new("user", c.content)]).unwrap()
}

/// The text `c` gets alone, through the engine's request loop.
fn alone(engine: &Engine, c: &Case) -> String {
    let prompt = prompt(engine, c);
    let (temperature, seed) = c.sampled.unwrap_or((0.0, 0));
    let options = GenerateOptions {
        max_new: c.max_tokens,
        sampling: SamplingParams {
            temperature,
            top_p: 1.0,
            top_k: 0,
            seed,
        },
        stop_at_eos: false,
        ..GenerateOptions::default()
    };
    solo_text(engine, &prompt, &options, &[])
}

#[test]
fn concurrent_streams_under_preemption_each_equal_their_solo_run() {
    let model = fixture("qwen3_moe_tok");
    let engine = Engine::load(&model).unwrap();
    let expected: Vec<String> = cases().iter().map(|c| alone(&engine, c)).collect();
    let per = Scheduler::new(&engine, Default::default()).unwrap().bytes_per_token();
    let largest = cases().iter().map(|c| prompt(&engine, c).len() + c.max_tokens).max().unwrap();
    let srv = start(
        engine,
        ServerConfig {
            port: 0,
            served_name: "tiny".into(),
            max_batch: 4,
            // The largest request fits alone with a few positions to spare.
            kv_budget: Some((largest + 6) * per),
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let a = srv.addr;
    // Requests race the engine thread: a round without overlap preempts
    // nothing, so rounds repeat (each checked) until one has preempted.
    for round in 0..5 {
        let bodies = cases().iter().map(body).collect();
        assert_concurrent_streams(a, "/v1/chat/completions", bodies, &expected, &format!("round {round}"));
        if metric(a, "larder_preemptions_total") > 0 {
            break;
        }
    }
    assert!(metric(a, "larder_preemptions_total") > 0, "no preemption in 5 rounds");
    assert_idle_with_no_state(a);
}

/// A non-streaming chat turn: the reply's text and its usage's cached tokens.
fn chat(a: SocketAddr, messages: &[(&str, String)]) -> (String, u64) {
    let messages: Vec<Value> = messages.iter().map(|(r, c)| json!({"role": r, "content": c})).collect();
    let r = post(
        a,
        "/v1/chat/completions",
        &json!({"model": "tiny", "messages": messages, "max_tokens": 10, "temperature": 0.0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_string();
    (text, v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0))
}

#[test]
fn interleaved_conversations_each_reuse_their_own_history() {
    let srv = start(
        Engine::load(&fixture("qwen3_moe_tok")).unwrap(),
        ServerConfig {
            port: 0,
            served_name: "tiny".into(),
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let a = srv.addr;
    let (a_user, b_user) = ("Tell me about cats", "What is the capital of France?");
    let (a_reply, _) = chat(a, &[("user", a_user.into())]);
    let (b_reply, _) = chat(a, &[("user", b_user.into())]);
    let a_turn = [("user", a_user.into()), ("assistant", a_reply), ("user", "And dogs?".into())];
    let b_turn = [("user", b_user.into()), ("assistant", b_reply), ("user", "And Spain?".into())];
    let (_, a_cached) = chat(a, &a_turn);
    let (_, b_cached) = chat(a, &b_turn);
    // Each second turn shares at least its own first prompt with its own
    // conversation, more than the chat template's opening both share.
    let opening = chat(a, &[("user", "x".into())]).1;
    assert!(
        a_cached > opening && b_cached > opening,
        "cached {a_cached}, {b_cached}; shared opening {opening}"
    );
    assert!(metric(a, "larder_kept_conversations") >= 2);
    assert_idle_with_no_state(a);
}

/// Sends a streaming completion on a raw connection (the caller drops it to leave).
fn open_stream(a: SocketAddr, prompt: &[u32], max_tokens: usize) -> TcpStream {
    let body = json!({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "stream": true, "ignore_eos": true}).to_string();
    let mut s = TcpStream::connect(a).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

#[test]
fn clients_leaving_in_any_phase_leave_no_state() {
    let model = long_model("preemption-leave");
    let srv = start(
        Engine::load(&model).unwrap(),
        ServerConfig {
            port: 0,
            served_name: "tiny".into(),
            max_batch: 1,
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let a = srv.addr;
    // Decoding: a long generation that has streamed something.
    let mut decoding = open_stream(a, &[262, 406, 39], 8000);
    let mut first = [0u8; 64];
    decoding.read_exact(&mut first).unwrap();
    // Queued behind it (max_batch 1).
    let queued = open_stream(a, &[5, 6, 7, 8], 8000);
    let t = Instant::now();
    while metric(a, "larder_queued_sequences") == 0 {
        assert!(t.elapsed() < Duration::from_secs(20), "the second request never queued");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(queued);
    // Gone right after sending: it leaves while queued or prefilling.
    drop(open_stream(a, &(1..200).collect::<Vec<u32>>(), 8000));
    drop(decoding);
    assert_idle_with_no_state(a);
    assert!(
        metric(a, "larder_completion_tokens_total") < 3 * 8000,
        "cancelled before max_tokens"
    );
    let r = post(a, "/v1/completions", &json!({"model": "tiny", "prompt": [1, 2], "max_tokens": 2}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_idle_with_no_state(a);
    let _ = std::fs::remove_dir_all(&model);
}
