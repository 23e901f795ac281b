//! Secrets never reach a log: with `LARDER_LOG=trace`, a `larder pull` that
//! sends `HF_TOKEN` to a hub (a loopback stand-in answering 404) prints
//! neither the token nor any part of it, while the HTTP client's own debug
//! lines and larder's trace output still appear.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::Command;
use std::sync::{Arc, Mutex};

/// The stand-in token: long enough that any 8 of its bytes in a row are
/// its own (a hex dump prints 16 bytes a row, so a leaked token shows as
/// runs of it, not whole).
const TOKEN: &str = "hf_larderTestSecretQ7ZpX2vKm9WcN4";

/// A hub stand-in on 127.0.0.1: answers every request 404 `RepoNotFound`
/// and keeps the `Authorization` headers it was sent.
fn fake_hub() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let auth = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                if line.to_ascii_lowercase().starts_with("authorization:") {
                    auth.lock().unwrap().push(line.trim().to_string());
                }
                line.clear();
            }
            let body = "Repository not found";
            let _ = write!(
                stream,
                "HTTP/1.1 404 Not Found\r\nx-error-code: RepoNotFound\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (url, seen)
}

/// The pieces of `secret` that must not appear: every 8-byte run, as text
/// and as the hex a wire dump prints.
fn pieces(secret: &str) -> Vec<String> {
    let runs: Vec<&str> = (0..=secret.len() - 8).map(|i| &secret[i..i + 8]).collect();
    let hex = runs.iter().map(|r| r.bytes().map(|b| format!("{b:02x}")).collect::<String>());
    runs.iter().map(|r| r.to_string()).chain(hex).collect()
}

#[test]
fn hf_token_never_reaches_the_log_even_at_trace_level() {
    let (hub, seen) = fake_hub();
    let out = std::env::temp_dir().join(format!("larder-log-secrets-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = Command::new(env!("CARGO_BIN_EXE_larder"))
        .args(["pull", "larder-test/secret-model", "--out", out.to_str().unwrap(), "--timeout", "5"])
        .env("HF_ENDPOINT", &hub)
        .env("HF_TOKEN", TOKEN)
        .env("LARDER_LOG", "trace")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&out);
    let log = format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(!run.status.success(), "the stand-in hub has no such repo: {log}");
    assert!(
        seen.lock().unwrap().iter().any(|h| h.ends_with(TOKEN)),
        "the token was not sent, so the test shows nothing: {:?}",
        seen.lock().unwrap()
    );
    assert!(log.contains("ureq"), "the HTTP client's debug lines are gone: {log}");
    // The wire dump's plain-text column strips spaces between hex groups.
    let squeezed: String = log.chars().filter(|c| !c.is_whitespace()).collect();
    for piece in pieces(TOKEN) {
        assert!(
            !log.contains(&piece) && !squeezed.contains(&piece),
            "{piece:?} (part of HF_TOKEN) is in the log:\n{log}"
        );
    }
}
