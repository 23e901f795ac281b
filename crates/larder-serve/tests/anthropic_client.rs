//! The official `anthropic` Python package against the real server:
//! messages, streaming (`client.messages.stream`), count_tokens and error
//! cases (scripts/anthropic_client_check.py).
//!
//! Needs a Python with `anthropic` installed: `LARDER_ANTHROPIC_PYTHON`
//! names it (.ci/run installs it in its client venv and sets it), else
//! `python3` is tried. Without one the test is skipped with a printed reason.

use std::path::Path;
use std::process::Command;

use larder_engine::Engine;
use larder_serve::{start, ServerConfig};

fn python_with_anthropic() -> Option<String> {
    let candidates = std::env::var("LARDER_ANTHROPIC_PYTHON")
        .ok()
        .into_iter()
        .chain(["python3".to_string()]);
    candidates.into_iter().find(|py| {
        Command::new(py)
            .args(["-c", "import anthropic"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

#[test]
fn the_official_anthropic_client_works_against_the_server() {
    let Some(python) = python_with_anthropic() else {
        eprintln!("skipping: no Python with the `anthropic` package (set LARDER_ANTHROPIC_PYTHON; .ci/run installs one)");
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let engine = Engine::load(&root.join("fixtures/qwen3_moe_tok")).unwrap();
    let srv = start(
        engine,
        ServerConfig {
            port: 0,
            served_name: "tiny".into(),
            ..ServerConfig::default()
        },
    )
    .unwrap();
    // The client appends /v1/messages to its base URL.
    let out = Command::new(&python)
        .arg(root.join("scripts/anthropic_client_check.py"))
        .arg(format!("http://{}", srv.addr))
        .arg("tiny")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "anthropic client check failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("\"ok\": true"), "{stdout}");
}
