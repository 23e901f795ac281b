//! The official `openai` Python package against the real server: chat,
//! completion, streaming and error cases, and the Responses API (plain,
//! streamed, previous_response_id, a function tool refused until tool
//! calling is wired) (scripts/openai_client_check.py).
//!
//! Needs a Python with `openai` installed: `LARDER_OPENAI_PYTHON` names it
//! (.ci/run creates a venv and sets it), else `python3` is tried. Without
//! one the test is skipped with a printed reason.

use std::path::Path;
use std::process::Command;

use larder_engine::Engine;
use larder_serve::{start, ServerConfig};

fn python_with_openai() -> Option<String> {
    let candidates = std::env::var("LARDER_OPENAI_PYTHON")
        .ok()
        .into_iter()
        .chain(["python3".to_string()]);
    candidates.into_iter().find(|py| {
        Command::new(py)
            .args(["-c", "import openai"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

#[test]
fn the_official_openai_client_works_against_the_server() {
    let Some(python) = python_with_openai() else {
        eprintln!("skipping: no Python with the `openai` package (set LARDER_OPENAI_PYTHON; .ci/run installs one)");
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
    let out = Command::new(&python)
        .arg(root.join("scripts/openai_client_check.py"))
        .arg(format!("http://{}/v1", srv.addr))
        .arg("tiny")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "openai client check failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("\"ok\": true"), "{stdout}");
}
