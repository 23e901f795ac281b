//! `larder serve` as a process: it prints its address, answers HTTP, and a
//! bad model folder is a clean error.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};

mod common;

#[test]
fn serve_binary_answers_and_uses_the_folder_name_as_model_id() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen3_moe_tok");
    let mut child = Command::new(env!("CARGO_BIN_EXE_larder"))
        .args(["serve", "--model", model.to_str().unwrap(), "--port", "0"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| {
            l.split("http://")
                .nth(1)
                .map(|rest| rest.split_whitespace().next().unwrap_or("").to_string())
        })
        .expect("serve prints its address");
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"id\":\"qwen3_moe_tok\""), "{reply}");
}

#[test]
fn serve_refuses_a_missing_model_and_a_busy_port() {
    let err = common::fails(&["serve", "--model", "/nonexistent/model", "--port", "0"]);
    assert!(err.contains("/nonexistent/model"), "{err}");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen3_moe_tiny");
    let err = common::fails(&["serve", "--model", model.to_str().unwrap(), "--port", &port]);
    assert!(err.contains("cannot listen"), "{err}");
}
