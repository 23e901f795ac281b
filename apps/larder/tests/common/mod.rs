//! Helpers shared by the black-box CLI tests: the fixture checkpoints, run
//! the built binary, expect success with one JSON document, or expect a
//! clean failure; talk to a `larder serve` started by a test; pack a
//! checkpoint and check its streamed runs equal the in-RAM run.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The fixture checkpoint `name` (a folder under the repository's `fixtures/`).
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

pub fn larder(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_larder")).args(args).output().unwrap()
}

/// Runs larder expecting success; returns its stdout JSON document.
pub fn ok_json(args: &[&str]) -> Value {
    let out = larder(args);
    assert!(
        out.status.success(),
        "larder {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("larder {args:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// Runs larder expecting success; its stdout JSON document and its stderr.
pub fn ok_with_stderr(args: &[&str]) -> (Value, String) {
    let out = larder(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "larder {args:?} failed: {err}");
    let doc =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("larder {args:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)));
    (doc, err)
}

/// Runs larder expecting failure without a panic; returns stderr.
pub fn fails(args: &[&str]) -> String {
    let out = larder(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "larder {args:?} should fail");
    assert!(!err.contains("panicked"), "larder {args:?} panicked: {err}");
    err
}

/// The `host:port` a `larder serve` ready line names (`... http://HOST:PORT ...`);
/// empty when it names none.
pub fn served_address(ready: &str) -> String {
    ready
        .split("http://")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or("")
        .to_string()
}

/// POSTs the JSON `body` to `path` on `addr` (one connection, closed after);
/// returns the whole reply, status line and headers included.
pub fn post(addr: &str, path: &str, body: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    reply
}

/// The path as a `&str` argument.
fn arg(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Packs `model` into `store`, verifies it, and checks that `forward` from
/// the store at each of `budgets` (a small one second) and streamed from the
/// checkpoint folder, and greedy `run`s streamed (also with pread and the
/// small budget), equal the in-RAM run bit for bit (serde_json prints each
/// f32 exactly). Returns `pack`'s JSON report.
pub fn check_pack_and_stream(model: &Path, store: &Path, budgets: [&str; 3]) -> Value {
    let packed = ok_json(&["pack", "--model", arg(model), "--out", arg(store), "--json"]);
    assert_eq!(ok_json(&["verify", arg(store), "--json"])["bad"], serde_json::json!([]));
    let ids = "5,17,42,99,3,250,7";
    let in_ram = ok_json(&["forward", "--model", arg(model), "--ids", ids, "--json"]);
    let logits = in_ram["logits"].as_array().unwrap();
    assert_eq!(logits.len(), 7);
    assert!(logits.iter().flat_map(|r| r.as_array().unwrap()).all(|v| v.as_f64().is_some()));
    for budget in budgets {
        let streamed = ok_json(&["forward", "--model", arg(store), "--ids", ids, "--ram-budget", budget, "--json"]);
        assert_eq!(in_ram, streamed, "packed store, --ram-budget {budget}");
    }
    let direct = ok_json(&["forward", "--model", arg(model), "--ids", ids, "--ram-budget", "0", "--json"]);
    assert_eq!(in_ram, direct, "streamed from the checkpoint folder");
    let run = |m: &Path, extra: &[&str]| -> Value {
        let mut args = vec!["run", "--model", arg(m), "--ids", ids, "--max-new", "12", "--ignore-eos", "--json"];
        args.extend_from_slice(extra);
        ok_json(&args)["ids"].clone()
    };
    let greedy = run(model, &[]);
    assert!(greedy.as_array().unwrap().len() >= 12, "{greedy}");
    assert_eq!(greedy, run(store, &["--ram-budget", "0"]), "streamed greedy ids");
    let small = ["--ram-budget", budgets[1], "--io", "pread"];
    assert_eq!(greedy, run(store, &small), "pread, small cache");
    packed
}
