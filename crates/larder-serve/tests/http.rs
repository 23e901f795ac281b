//! Black-box tests: the real server on a random loopback port, spoken to
//! over raw HTTP/1.1: every endpoint, streaming and not, refusals, the API
//! key, 429 under a full queue, and cancellation when a client disconnects.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use larder_engine::{ChatMessage, Engine, GenerateOptions};
use larder_serve::{start, RunningServer, ServerConfig};
use serde_json::{json, Value};

mod common;
use common::*;

fn server(config: ServerConfig) -> RunningServer {
    server_for(&fixture("qwen3_moe_tok"), config)
}

fn server_for(model: &Path, config: ServerConfig) -> RunningServer {
    let engine = Engine::load(model).unwrap();
    start(
        engine,
        ServerConfig {
            port: 0,
            served_name: "tiny".into(),
            ..config
        },
    )
    .unwrap()
}

#[test]
fn endpoints_answer_in_openai_shapes() {
    let srv = server(ServerConfig::default());
    let a = srv.addr;
    assert_eq!(send(a, "GET", "/health", &[], "").json()["status"], "ok");
    let models = send(a, "GET", "/v1/models", &[], "").json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "tiny");

    // Chat, greedy: the text equals what the engine generates for the same chat.
    let engine = Engine::load(&fixture("qwen3_moe_tok")).unwrap();
    let ids = engine.encode_chat(&[ChatMessage::new("user", "Hello there")]).unwrap();
    let opts = GenerateOptions {
        max_new: 12,
        ..GenerateOptions::default()
    };
    let g = engine.generate(&ids, &opts, &mut |_| true).unwrap();
    let expected = engine.decode(&g.ids).unwrap();
    let req = json!({"model": "tiny", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 12, "temperature": 0});
    let r = post(a, "/v1/chat/completions", &req);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["model"], "tiny");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], expected.as_str());
    assert_eq!(v["usage"]["prompt_tokens"], ids.len());
    assert_eq!(v["usage"]["completion_tokens"], g.ids.len());
    assert_eq!(v["usage"]["total_tokens"], ids.len() + g.ids.len());
    let finish = v["choices"][0]["finish_reason"].as_str().unwrap();
    assert!(finish == "stop" || finish == "length");

    // Streaming gives the same text: role chunk first, finish chunk, usage, [DONE].
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    sreq["stream_options"] = json!({"include_usage": true});
    let r = post(a, "/v1/chat/completions", &sreq);
    assert!(r.headers.contains("text/event-stream"), "{}", r.headers);
    let ev = events(&r.body);
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = ev[..ev.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, expected);
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], g.ids.len());
    assert_eq!(chunks[chunks.len() - 2]["choices"][0]["finish_reason"], finish);

    // Completions from token ids, cut by max_tokens.
    let r = post(
        a,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": [262, 406, 39], "max_tokens": 3}),
    );
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let r = post(
        a,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": "Once upon", "max_tokens": 2, "stream": true}),
    );
    let ev = events(&r.body);
    assert_eq!(ev.last().unwrap(), "[DONE]");

    // A stop string is cut and ends generation with finish_reason stop.
    let full = expected.clone();
    let chars: Vec<(usize, char)> = full.char_indices().collect();
    if chars.len() > 5 {
        let (from, to) = (chars[3].0, chars[5].0);
        let stop = &full[from..to];
        let mut sreq = req.clone();
        sreq["stop"] = json!(stop);
        let v = post(a, "/v1/chat/completions", &sreq).json();
        let got = v["choices"][0]["message"]["content"].as_str().unwrap();
        assert_eq!(got, &full[..full.find(stop).unwrap()]);
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }

    let metrics = send(a, "GET", "/metrics", &[], "").body;
    assert!(metrics.contains("larder_requests_total"), "{metrics}");
    assert!(metrics.contains("larder_queue_depth"), "{metrics}");
}

#[test]
fn refusals_are_openai_shaped_and_before_generation() {
    let srv = server(ServerConfig {
        max_request_bytes: 4096,
        ..ServerConfig::default()
    });
    let a = srv.addr;
    let ok = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let check = |r: Reply, status: u16, param: Option<&str>| {
        assert_eq!(r.status, status, "{}", r.body);
        let e = &r.json()["error"];
        assert!(e["message"].is_string() && e["type"].is_string(), "{e}");
        if let Some(p) = param {
            assert_eq!(e["param"], p, "{e}");
        }
    };
    let with = |k: &str, v: Value| {
        let mut b = ok.clone();
        b[k] = v;
        post(a, "/v1/chat/completions", &b)
    };
    check(send(a, "POST", "/v1/chat/completions", &[], "{oops"), 400, Some("body"));
    check(with("n", json!(17)), 400, Some("n"));
    check(with("logit_bias", json!({"5": 101})), 400, Some("logit_bias"));
    check(
        with("tools", json!([{"type": "function", "function": {"name": "f g"}}])),
        400,
        Some("tools[0].function.name"),
    );
    check(with("tool_choice", json!("required")), 400, Some("tool_choice"));
    check(with("max_tokens", json!(-3)), 400, Some("max_tokens"));
    check(with("max_tokens", json!(10_000_000)), 400, Some("max_tokens"));
    check(with("wat", json!(1)), 400, Some("wat"));
    check(with("model", json!("gpt-4")), 404, Some("model"));
    let big = "x".repeat(5000);
    check(with("user", json!(big)), 413, Some("body"));
    check(send(a, "GET", "/nope", &[], ""), 404, None);
    check(send(a, "DELETE", "/v1/models", &[], ""), 405, None);
    // Harmless defaults are accepted.
    let r = post(
        a,
        "/v1/chat/completions",
        &json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                "frequency_penalty": 0, "presence_penalty": 0, "response_format": {"type": "text"}, "tools": [], "user": "me", "metadata": {"a": "b"}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn api_key_is_required_when_set() {
    let srv = server(ServerConfig {
        api_key: Some("sekrit".into()),
        ..ServerConfig::default()
    });
    let a = srv.addr;
    assert_eq!(send(a, "GET", "/v1/models", &[], "").status, 401);
    assert_eq!(send(a, "GET", "/v1/models", &[("authorization", "Bearer nope")], "").status, 401);
    assert_eq!(send(a, "GET", "/v1/models", &[("authorization", "Bearer sekrit")], "").status, 200);
    assert_eq!(send(a, "GET", "/health", &[], "").status, 200, "health needs no key");
    // The scheme in any case, any whitespace after it (RFC 7235).
    for header in ["bearer sekrit", "BEARER sekrit", "Bearer \t sekrit"] {
        assert_eq!(
            send(a, "GET", "/v1/models", &[("authorization", header)], "").status,
            200,
            "{header:?}"
        );
    }
    for header in ["Basic sekrit", "Bearersekrit", "Bearer sekri", "Bearer "] {
        assert_eq!(
            send(a, "GET", "/v1/models", &[("authorization", header)], "").status,
            401,
            "{header:?}"
        );
    }
}

#[test]
fn an_empty_api_key_is_refused_at_start() {
    for key in ["", "  ", "key\n"] {
        let config = ServerConfig {
            port: 0,
            api_key: Some(key.into()),
            ..ServerConfig::default()
        };
        let Err(e) = larder_serve::bind(config) else {
            panic!("the API key {key:?} was accepted")
        };
        assert!(e.to_string().contains("API key"), "{e}");
    }
}

#[test]
fn full_queue_gets_429_and_a_gone_client_cancels_its_generation() {
    let srv = long_server(
        "queue",
        ServerConfig {
            queue_depth: 1,
            ..ServerConfig::default()
        },
    );
    let a = srv.addr;
    // A long streaming generation whose client reads nothing and then leaves.
    let body = json!({"model": "tiny", "prompt": [262, 406, 39], "max_tokens": 8000, "stream": true, "ignore_eos": true}).to_string();
    let mut s = TcpStream::connect(a).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 64];
    s.read_exact(&mut first).unwrap(); // generation has started
    let busy = post(a, "/v1/completions", &json!({"model": "tiny", "prompt": [1], "max_tokens": 1}));
    assert_eq!(busy.status, 429, "{}", busy.body);
    assert!(busy.headers.to_ascii_lowercase().contains("retry-after"));
    assert_eq!(busy.json()["error"]["type"], "rate_limit_error");
    drop(s);
    // The engine notices within a token and frees the queue.
    let t = Instant::now();
    loop {
        let m = send(a, "GET", "/metrics", &[], "").body;
        if m.contains("larder_queue_depth 0") {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "generation was not cancelled: {m}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let done = send(a, "GET", "/metrics", &[], "").body;
    let tokens: u64 = done
        .lines()
        .find_map(|l| l.strip_prefix("larder_completion_tokens_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(tokens < 8000, "cancelled before max_tokens ({tokens})");
    assert_eq!(
        post(a, "/v1/completions", &json!({"model": "tiny", "prompt": [1], "max_tokens": 1})).status,
        200
    );
}

#[test]
fn a_continued_chat_reuses_the_kept_prefix_exactly() {
    let turn1 = json!({"model": "tiny", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 6, "temperature": 0});
    let srv = server(ServerConfig::default());
    let r1 = post(srv.addr, "/v1/chat/completions", &turn1).json();
    assert_eq!(r1["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let reply = r1["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let turn2 = json!({"model": "tiny", "max_tokens": 8, "temperature": 0, "messages": [
        {"role": "user", "content": "Hello there"}, {"role": "assistant", "content": reply}, {"role": "user", "content": "Go on"}]});
    let continued = post(srv.addr, "/v1/chat/completions", &turn2).json();
    let cached = continued["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached > 0, "the shared prefix was reused: {continued}");
    // A fresh server prefills everything and must answer identically.
    let fresh_srv = server(ServerConfig::default());
    let fresh = post(fresh_srv.addr, "/v1/chat/completions", &turn2).json();
    assert_eq!(fresh["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(continued["choices"], fresh["choices"], "prefix reuse changed the output");
    assert_eq!(continued["usage"]["completion_tokens"], fresh["usage"]["completion_tokens"]);
    // An unrelated request after it is also exact (the cache is cut back to the common prefix).
    let other = json!({"model": "tiny", "messages": [{"role": "user", "content": "Something else"}], "max_tokens": 5, "temperature": 0});
    let a = post(srv.addr, "/v1/chat/completions", &other).json();
    let b = post(server(ServerConfig::default()).addr, "/v1/chat/completions", &other).json();
    assert_eq!(a["choices"], b["choices"]);
}

/// A server on a synthetic model with a long context (room for long generations).
fn long_server(name: &str, config: ServerConfig) -> RunningServer {
    server_for(&long_model(name), config)
}

fn queue_depth(a: SocketAddr) -> u64 {
    send(a, "GET", "/metrics", &[], "")
        .body
        .lines()
        .find_map(|l| l.strip_prefix("larder_queue_depth "))
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn other_endpoints_stay_responsive_and_a_gone_non_streaming_client_cancels() {
    let srv = long_server(
        "responsive",
        ServerConfig {
            header_timeout: Duration::from_millis(500),
            ..ServerConfig::default()
        },
    );
    let a = srv.addr;
    let body = json!({"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 8000, "ignore_eos": true}).to_string();
    let mut s = TcpStream::connect(a).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let t = Instant::now();
    while queue_depth(a) == 0 {
        assert!(t.elapsed() < Duration::from_secs(10));
    }
    // Generation is running: other endpoints answer at once.
    let t = Instant::now();
    for _ in 0..20 {
        assert_eq!(send(a, "GET", "/health", &[], "").status, 200);
        assert_eq!(send(a, "GET", "/v1/models", &[], "").status, 200);
    }
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "health/models blocked by generation: {:?}",
        t.elapsed()
    );
    // Thousands of idle connections at once do not block anyone either
    // (as many as this process's file-descriptor limit allows).
    let idle: Vec<TcpStream> = (0..2000).map_while(|_| TcpStream::connect(a).ok()).collect();
    eprintln!("{} idle connections open", idle.len());
    assert!(idle.len() >= 100, "could open only {} connections", idle.len());
    assert_eq!(send(a, "GET", "/health", &[], "").status, 200);
    // The non-streaming client leaves: its generation stops.
    drop(s);
    let t = Instant::now();
    while queue_depth(a) != 0 {
        assert!(t.elapsed() < Duration::from_secs(20), "non-streaming generation was not cancelled");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Slow clients (headers never finished) are closed after the header timeout.
    let mut slow = TcpStream::connect(a).unwrap();
    slow.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n").unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = Vec::new();
    let _ = slow.read_to_end(&mut buf);
    assert!(t.elapsed() < Duration::from_secs(25), "a slowloris client was not closed");
    drop(idle);
}
