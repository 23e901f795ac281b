//! Helpers shared by the black-box CLI tests: the fixture checkpoints, run
//! the built binary, expect success with one JSON document, or expect a
//! clean failure; talk to a `larder serve` started by a test.

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
