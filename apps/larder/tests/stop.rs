//! `larder run --stop STR` (repeatable) goes through the engine's request
//! loop, as the server does: the text ends before the first stop string
//! (even one spanning several tokens), the ids end at the token completing
//! it, the finish reason is `stop`; streamed text equals the JSON text; a
//! drafter changes nothing; a model without a tokenizer refuses --stop.
//! `larder serve --draft ngram` answers a request with a stop string with
//! the same text as `larder run --stop`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

mod common;

use common::{fails, fixture, larder, ok_json, post, served_address};

#[test]
fn run_stops_at_stop_strings() {
    let m = fixture("qwen3_moe_tok");
    let m = m.to_str().unwrap();
    let base = [
        "run",
        "--model",
        m,
        "--prompt",
        "The capital of France is",
        "--max-new",
        "24",
        "--ignore-eos",
    ];
    let with = |extra: &[&str]| -> Vec<String> { base.iter().chain(extra).map(|s| s.to_string()).collect() };
    let plain = ok_json(&[&base[..], &["--json"]].concat());
    let full = plain["text"].as_str().unwrap().to_string();
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 8, "{full:?}");
    // Three characters from the middle of the text: random weights give short tokens, so they span several.
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
    let at = full.find(&stop).unwrap();
    let args = with(&["--stop", "never-there", "--stop", &stop, "--json"]);
    let v = ok_json(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(v["text"].as_str().unwrap(), &full[..at], "stop {stop:?}");
    assert_eq!(v["finish_reason"], "stop");
    assert_eq!(v["stop_string"].as_str(), Some(stop.as_str()));
    let ids = v["ids"].as_array().unwrap();
    let all = plain["ids"].as_array().unwrap();
    assert!(ids.len() < all.len() && all.starts_with(ids), "{ids:?} vs {all:?}");

    // A drafter gives the same result.
    let args = with(&["--stop", &stop, "--draft", "ngram", "--json"]);
    let d = ok_json(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!((&d["ids"], &d["text"]), (&v["ids"], &v["text"]));

    // Streamed text is the same text, and the summary says why it stopped.
    let args = with(&["--stop", &stop]);
    let out = larder(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{}\n", &full[..at]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("stopped at the stop string"), "{err}");

    // Without a stop string that appears, everything is printed (held-back text released).
    let last: String = chars[chars.len() - 1..].iter().collect();
    let args = with(&["--stop", &format!("{last}\u{1}"), "--json"]);
    let v = ok_json(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!((&v["text"], &v["finish_reason"]), (&plain["text"], &plain["finish_reason"]));
    assert!(v.get("stop_string").is_none());
}

#[test]
fn stop_needs_a_tokenizer_and_a_non_empty_string() {
    let tiny = fixture("qwen3_moe_tiny");
    assert!(!Path::new(&tiny).join("tokenizer.json").exists());
    let err = fails(&["run", "--model", tiny.to_str().unwrap(), "--ids", "1,2", "--stop", "x"]);
    assert!(err.contains("--stop") && err.contains("tokenizer.json"), "{err}");
    let tok = fixture("qwen3_moe_tok");
    let err = fails(&["run", "--model", tok.to_str().unwrap(), "--prompt", "Hi", "--stop", ""]);
    assert!(err.contains("stop"), "{err}");
}

/// POSTs `body` to `path`; returns the reply's JSON body.
fn post_json(addr: &str, path: &str, body: &str) -> serde_json::Value {
    let reply = post(addr, path, body);
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    // The body may be chunked: the JSON document is from its first `{` to its last `}`.
    let body = reply.split("\r\n\r\n").nth(1).unwrap_or("");
    let json = &body[body.find('{').unwrap_or(0)..body.rfind('}').map_or(0, |i| i + 1)];
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {reply}"))
}

#[test]
fn serve_with_a_drafter_stops_like_run() {
    let m = fixture("qwen3_moe_tok");
    let m = m.to_str().unwrap();
    let err = fails(&["serve", "--model", m, "--port", "0", "--draft", "model"]);
    assert!(
        err.contains("--draft-model") && !err.contains("serving on"),
        "refused before binding: {err}"
    );
    let prompt = "The capital of France is";
    let plain = ok_json(&["run", "--model", m, "--prompt", prompt, "--max-new", "16", "--ignore-eos", "--json"]);
    let chars: Vec<char> = plain["text"].as_str().unwrap().chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let run = ok_json(&[
        "run",
        "--model",
        m,
        "--prompt",
        prompt,
        "--max-new",
        "16",
        "--ignore-eos",
        "--stop",
        &stop,
        "--json",
    ]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_larder"))
        .args(["serve", "--port", "0", "--draft", "ngram", "--model", m])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines().map_while(Result::ok);
    let ready = lines.find(|l| l.contains("ready")).unwrap_or_default();
    assert!(ready.contains("drafting with ngram"), "{ready}");
    let addr = served_address(&ready);
    let body = serde_json::json!({
        "model": "qwen3_moe_tok", "prompt": prompt, "max_tokens": 16, "temperature": 0,
        "ignore_eos": true, "stop": [stop],
    });
    let reply = std::panic::catch_unwind(|| post_json(&addr, "/v1/completions", &body.to_string()));
    let _ = child.kill();
    let _ = child.wait();
    let reply = reply.unwrap();
    assert_eq!(reply["choices"][0]["text"], run["text"], "stop {stop:?}");
    assert_eq!(reply["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        reply["usage"]["completion_tokens"].as_u64(),
        Some(run["ids"].as_array().unwrap().len() as u64)
    );
}
