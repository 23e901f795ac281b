//! Helpers shared by the black-box server tests: fixtures, a server on the
//! tokenizer fixture, a raw HTTP/1.1 client (whole replies, chunked bodies
//! decoded), SSE parsing, the batching check (concurrent streams against
//! each request's solo text), and the official Python clients' checks.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use larder_engine::{Engine, GenerateOptions, Job, RequestEvent};
use larder_serve::{start, RunningServer, ServerConfig};
use serde_json::Value;

/// A server on `qwen3_moe_tok` (a Qwen3 tokenizer and chat template, random
/// weights), served as `tiny` on a free port.
pub fn tiny_server() -> RunningServer {
    let engine = Engine::load(&fixture("qwen3_moe_tok")).unwrap();
    let config = ServerConfig {
        port: 0,
        served_name: "tiny".into(),
        ..ServerConfig::default()
    };
    start(engine, config).unwrap()
}

/// A Python that imports `module`: the one `var` names, else `python3`;
/// `None` (the test is then skipped, saying why) when neither does.
pub fn python_with(var: &str, module: &str) -> Option<String> {
    let candidates = std::env::var(var).ok().into_iter().chain(["python3".to_string()]);
    candidates.into_iter().find(|py| {
        std::process::Command::new(py)
            .args(["-c", &format!("import {module}")])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// `qwen3_moe_tok` with a 2048-token context, in a temp folder: room for
/// Qwen3's tools preamble (RoPE positions past the fixture's 256 compute as
/// any other).
pub fn long_tok(tag: &str) -> PathBuf {
    let dir = fixture_copy("qwen3_moe_tok", tag);
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["max_position_embeddings"] = serde_json::json!(2048);
    std::fs::write(&path, config.to_string()).unwrap();
    dir
}

/// A server on [`long_tok`] served as `tiny`, drafting as `drafter` says.
pub fn long_tok_server(tag: &str, drafter: larder_engine::DrafterChoice) -> RunningServer {
    let engine = Engine::load(&long_tok(tag)).unwrap();
    let drafting = engine.drafting(&drafter).unwrap();
    let config = ServerConfig {
        port: 0,
        served_name: "tiny".into(),
        ..ServerConfig::default()
    };
    let srv = larder_serve::bind(config).unwrap();
    srv.attach(larder_serve::Loaded { engine, drafting });
    srv
}

/// Runs `scripts/{script} BASE_URL tiny` with `python` against a
/// [`long_tok_server`] (tools fit its context); the script must exit 0 and
/// print `"ok": true`.
pub fn run_client_check(python: &str, script: &str, base_path: &str) {
    let srv = long_tok_server(&format!("client-{}", script.len()), larder_engine::DrafterChoice::Off);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::process::Command::new(python)
        .arg(root.join("scripts").join(script))
        .arg(format!("http://{}{base_path}", srv.addr))
        .arg("tiny")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{script} failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("\"ok\": true"), "{stdout}");
}

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

/// A fresh copy of a fixture's model files (not its reference outputs) in a temp folder.
pub fn fixture_copy(name: &str, tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("larder-serve-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        if !file.starts_with("reference") {
            std::fs::copy(&path, dir.join(&file)).unwrap();
        }
    }
    dir
}

pub struct Reply {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// A header's value (names compared case-insensitively).
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
}

/// Decodes a chunked transfer-encoded body.
pub fn dechunk(mut raw: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = raw.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        raw = rest.get(n + 2..).unwrap_or("");
    }
    out
}

/// Parses a whole raw HTTP/1.1 reply.
pub fn parse_reply(raw: &str) -> Reply {
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((raw, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_string()
    };
    Reply {
        status,
        headers: head.to_string(),
        body,
    }
}

pub fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    parse_reply(&raw)
}

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    send(addr, "POST", path, &[("content-type", "application/json")], &body.to_string())
}

/// The `data:` payloads of an SSE body.
pub fn events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// The text of a streamed chat completion (its deltas' content) or text
/// completion (its `text`s), which must end with `[DONE]`.
pub fn streamed_text(body: &str) -> String {
    let ev = events(body);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"), "{body}");
    ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| {
            let choice = &c["choices"][0];
            choice["delta"]["content"].as_str().or(choice["text"].as_str()).map(str::to_string)
        })
        .collect()
}

/// The value of the `/metrics` line `name`.
pub fn metric(a: SocketAddr, name: &str) -> u64 {
    let m = send(a, "GET", "/metrics", &[], "").body;
    m.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("{name} missing from /metrics: {m}"))
        .parse()
        .unwrap()
}

/// Waits until no request is queued or running, then checks no KV bytes are in use.
pub fn assert_idle_with_no_state(a: SocketAddr) {
    let t = std::time::Instant::now();
    while metric(a, "larder_queue_depth") != 0 || metric(a, "larder_running_sequences") != 0 {
        assert!(t.elapsed() < Duration::from_secs(30), "requests still counted after they ended");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(metric(a, "larder_queued_sequences"), 0);
    assert_eq!(metric(a, "larder_kv_bytes_in_use"), 0, "sequence state left when idle");
}

/// A synthetic model with a long context (room for long generations).
pub fn long_model(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("larder-serve-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let spec = larder_model::synth::SynthSpec::preset("qwen3_moe", "tiny", None).unwrap();
    larder_model::synth::write(&spec, &dir, &mut |_| {}).unwrap();
    dir
}

/// The text `engine` generates for `prompt` alone (`Engine::run`, no
/// drafting): what the same request must stream when batched with others.
pub fn solo_text(engine: &Engine, prompt: &[u32], options: &GenerateOptions, stop: &[String]) -> String {
    let job = Job {
        prompt: prompt.to_vec(),
        options: options.clone(),
        stop: stop.to_vec(),
        ..Job::default()
    };
    engine.run(job, &mut |_: RequestEvent<'_>| true).unwrap().text
}

/// Posts every body to `path` at once (one thread each) and checks each
/// reply is a 200 whose streamed text is `expected[i]`.
pub fn assert_concurrent_streams(a: SocketAddr, path: &'static str, bodies: Vec<Value>, expected: &[String], label: &str) {
    let handles: Vec<_> = bodies.into_iter().map(|b| std::thread::spawn(move || post(a, path, &b))).collect();
    for (i, h) in handles.into_iter().enumerate() {
        let r = h.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(streamed_text(&r.body), expected[i], "{label} request {i}");
    }
}
