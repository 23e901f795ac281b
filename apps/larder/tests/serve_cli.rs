//! `larder serve` as a process: it prints its address (before the model has
//! loaded), answers HTTP, a bad model folder is a clean error, every flag
//! is range-checked, an empty API key is refused and a server others can
//! reach without one is warned about, and SIGTERM drains running requests
//! and exits 0.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;

/// Starts `larder serve` on a free port; returns the child, its address,
/// and its stderr lines as they come.
fn spawn_serve(extra: &[&str]) -> (Child, String, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_larder"))
        .args(["serve", "--port", "0"])
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, lines) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let addr = wait_line(&lines, "http://")
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or("")
        .to_string();
    (child, addr, lines)
}

/// The first stderr line containing `what` (panics after 60 s).
fn wait_line(lines: &mpsc::Receiver<String>, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(l) if l.contains(what) => return l,
            Ok(_) => {}
            Err(e) => panic!("no stderr line with {what:?}: {e}"),
        }
    }
}

fn get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    reply
}

#[test]
fn serve_binary_answers_and_uses_the_folder_name_as_model_id() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen3_moe_tok");
    let (mut child, addr, lines) = spawn_serve(&["--model", model.to_str().unwrap()]);
    wait_line(&lines, "ready");
    let reply = get(&addr, "/v1/models");
    let _ = child.kill();
    let _ = child.wait();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"id\":\"qwen3_moe_tok\""), "{reply}");
}

#[test]
fn serve_refuses_a_missing_model_and_a_busy_port() {
    let err = common::fails(&["serve", "--model", "/nonexistent/model", "--port", "0"]);
    assert!(err.contains("/nonexistent/model"), "{err}");
    assert!(err.contains("serving on"), "the port is bound before the model loads: {err}");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen3_moe_tiny");
    let err = common::fails(&["serve", "--model", model.to_str().unwrap(), "--port", &port]);
    assert!(err.contains("cannot listen"), "{err}");
}

#[test]
fn serve_refuses_an_empty_api_key_from_the_flag_or_the_environment() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen3_moe_tiny");
    let m = model.to_str().unwrap();
    let err = common::fails(&["serve", "--model", m, "--port", "0", "--api-key", ""]);
    assert!(err.contains("--api-key") && err.contains("empty"), "{err}");
    assert!(!err.contains("serving on"), "refused before binding: {err}");
    let out = Command::new(env!("CARGO_BIN_EXE_larder"))
        .args(["serve", "--model", m, "--port", "0"])
        .env("LARDER_API_KEY", "")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an empty LARDER_API_KEY was accepted: {err}");
    assert!(err.contains("LARDER_API_KEY") && err.contains("empty"), "{err}");
}

/// The stderr lines of a `larder serve` with `extra` flags up to its ready
/// line (the server is then stopped).
fn lines_until_ready(extra: &[&str]) -> Vec<String> {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen3_moe_tiny");
    let mut args = vec!["--model", model.to_str().unwrap()];
    args.extend_from_slice(extra);
    let (mut child, _addr, lines) = spawn_serve(&args);
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !seen.last().is_some_and(|l: &String| l.contains("ready")) {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) => seen.push(l),
            Err(e) => panic!("no ready line: {e}; got {seen:?}"),
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    seen
}

#[test]
fn serve_warns_when_others_can_reach_it_without_an_api_key() {
    let warned = |lines: &[String]| lines.iter().any(|l| l.contains("warning") && l.contains("without an API key"));
    let open = lines_until_ready(&["--host", "0.0.0.0"]);
    assert!(warned(&open), "no warning for 0.0.0.0 without a key: {open:?}");
    let line = open.iter().find(|l| l.contains("without an API key")).unwrap();
    assert!(line.contains("--api-key") && line.contains("every network interface"), "{line}");
    let keyed = lines_until_ready(&["--host", "0.0.0.0", "--api-key", "k3y"]);
    assert!(!warned(&keyed), "a key was given: {keyed:?}");
    let local = lines_until_ready(&[]);
    assert!(!warned(&local), "loopback only: {local:?}");
}

#[test]
fn serve_flags_are_range_checked() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen3_moe_tiny");
    let m = model.to_str().unwrap();
    for (flag, value) in [
        ("--queue-depth", "0"),
        ("--queue-depth", "5000"),
        ("--shutdown-grace", "3601"),
        ("--shutdown-grace", "-1"),
        ("--max-request-bytes", "10"),
        ("--max-request-bytes", "2GiB"),
        ("--port", "70000"),
        ("--cors-origin", "localhost:3000/"),
    ] {
        // `--flag=VALUE` so that a negative value is not taken for a flag.
        let arg = format!("{}={value}", flag.trim_end_matches('='));
        let err = common::fails(&["serve", "--model", m, &arg]);
        assert!(err.contains(flag.trim_end_matches('=')), "{arg}: {err}");
    }
    let help = common::larder(&["serve", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    for range in ["1..=4096", "0..=3600", "1KiB..=1GiB", "0..=65535"] {
        assert!(help.contains(range), "--help does not document {range}: {help}");
    }
}

#[test]
fn sigterm_drains_running_streams_and_exits_zero() {
    let dir = std::env::temp_dir().join(format!("larder-serve-cli-sigterm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let spec = larder_model::synth::SynthSpec::preset("qwen3_moe", "tiny", None).unwrap();
    larder_model::synth::write(&spec, &dir, &mut |_| {}).unwrap();
    let (mut child, addr, lines) = spawn_serve(&["--model", dir.to_str().unwrap(), "--served-name", "m", "--shutdown-grace", "1"]);
    wait_line(&lines, "ready");
    let body = r#"{"model": "m", "prompt": [5, 6, 7], "max_tokens": 8000, "ignore_eos": true, "stream": true}"#;
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 64];
    s.read_exact(&mut first).unwrap(); // generation is running
    let kill = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    let text = String::from_utf8_lossy(&rest).into_owned();
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("larder serve did not exit after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "exit status after SIGTERM: {status:?}");
    assert!(
        text.contains("data: [DONE]") && (text.contains("server_shutdown") || text.contains("finish_reason\":\"length")),
        "the stream neither finished nor got the shutdown error event: {}",
        &text[text.len().saturating_sub(600)..]
    );
    // Idle: SIGTERM exits 0 at once.
    let (mut child, _addr, lines) = spawn_serve(&[
        "--model",
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/qwen3_moe_tiny")
            .to_str()
            .unwrap(),
    ]);
    wait_line(&lines, "ready");
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(child.wait().unwrap().success());
}

#[test]
fn serve_trace_records_every_request_and_trace_stats_reads_it() {
    let dir = std::env::temp_dir().join(format!("larder-serve-cli-trace-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("serve.jsonl");
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen3_moe_tiny");
    let m = model.to_str().unwrap();
    let (mut child, addr, lines) = spawn_serve(&["--model", m, "--served-name", "m", "--trace", trace.to_str().unwrap()]);
    wait_line(&lines, "ready");
    // Two requests at once (they may share passes), distinct prompts (no prefix reuse).
    let requests = [(vec![5, 6, 7, 8], 6), (vec![40, 41], 4)];
    let replies: Vec<String> = std::thread::scope(|sc| {
        let handles: Vec<_> = requests
            .iter()
            .map(|(p, n)| {
                let body = format!(r#"{{"model": "m", "prompt": {p:?}, "max_tokens": {n}, "ignore_eos": true}}"#);
                let addr = &addr;
                sc.spawn(move || common::post(addr, "/v1/completions", &body))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &replies {
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    }
    // Every fed position: the prompt and all but the last generated token.
    let rows: usize = requests.iter().map(|(p, n)| p.len() + n - 1).sum();
    let decode: usize = requests.iter().map(|(_, n)| n - 1).sum();
    let deadline = Instant::now() + Duration::from_secs(30);
    let stats = loop {
        let out = common::larder(&["trace", "stats", trace.to_str().unwrap(), "--json"]);
        if out.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            if v["all"]["tokens"].as_u64() == Some(rows as u64) {
                break v;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the trace never held {rows} tokens: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(stats["decode"]["tokens"].as_u64(), Some(decode as u64), "{stats}");
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(child.wait().unwrap().success());
    // After the stop the file is still a whole trace.
    assert!(common::larder(&["trace", "stats", trace.to_str().unwrap()]).status.success());

    // With a drafter each request runs alone; its rows (drafted ones too) are recorded as it runs.
    let (mut child, addr, lines) = spawn_serve(&[
        "--model",
        m,
        "--served-name",
        "m",
        "--draft",
        "ngram",
        "--trace",
        trace.to_str().unwrap(),
        "--overwrite",
    ]);
    wait_line(&lines, "ready");
    let body = r#"{"model": "m", "prompt": [5, 6, 7, 5, 6, 7, 5, 6], "max_tokens": 6, "ignore_eos": true}"#;
    assert!(common::post(&addr, "/v1/completions", body).starts_with("HTTP/1.1 200"));
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(child.wait().unwrap().success());
    let out = common::larder(&["trace", "stats", trace.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tokens = v["all"]["tokens"].as_u64().unwrap_or(0);
    assert!(tokens >= 8 + 6 - 1, "every fed position at least: {v}");

    // A model without routed experts, and a folder that does not exist, are refused before loading.
    let dense = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/llama_tiny");
    let e = common::fails(&[
        "serve",
        "--model",
        dense.to_str().unwrap(),
        "--port",
        "0",
        "--trace",
        trace.to_str().unwrap(),
        "--overwrite",
    ]);
    assert!(e.contains("--trace") && e.contains("no MoE layers"), "{e}");
    let e = common::fails(&["serve", "--model", m, "--port", "0", "--trace", "/nonexistent-dir/t.jsonl"]);
    assert!(e.contains("--trace") && e.contains("does not exist"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
