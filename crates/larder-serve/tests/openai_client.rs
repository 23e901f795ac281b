//! The official `openai` Python package against the real server: chat,
//! completion, streaming and error cases, and the Responses API (plain,
//! streamed, previous_response_id, a function tool refused until tool
//! calling is wired) (scripts/openai_client_check.py).
//!
//! Needs a Python with `openai` installed: `LARDER_OPENAI_PYTHON` names it
//! (.ci/run creates a venv and sets it), else `python3` is tried. Without
//! one the test is skipped with a printed reason.

mod common;

#[test]
fn the_official_openai_client_works_against_the_server() {
    let Some(python) = common::python_with("LARDER_OPENAI_PYTHON", "openai") else {
        eprintln!("skipping: no Python with the `openai` package (set LARDER_OPENAI_PYTHON; .ci/run installs one)");
        return;
    };
    common::run_client_check(&python, "openai_client_check.py", "/v1");
}
