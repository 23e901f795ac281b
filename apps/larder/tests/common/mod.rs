//! Helpers shared by the black-box CLI tests: run the built binary, expect
//! success with one JSON document, or expect a clean failure.

#![allow(dead_code)]

use std::process::{Command, Output};

use serde_json::Value;

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
