//! The official `anthropic` Python package against the real server:
//! messages, streaming (`client.messages.stream`), count_tokens and error
//! cases (scripts/anthropic_client_check.py).
//!
//! Needs a Python with `anthropic` installed: `LARDER_ANTHROPIC_PYTHON`
//! names it (.ci/run installs it in its client venv and sets it), else
//! `python3` is tried. Without one the test is skipped with a printed reason.

mod common;

#[test]
fn the_official_anthropic_client_works_against_the_server() {
    let Some(python) = common::python_with("LARDER_ANTHROPIC_PYTHON", "anthropic") else {
        eprintln!("skipping: no Python with the `anthropic` package (set LARDER_ANTHROPIC_PYTHON; .ci/run installs one)");
        return;
    };
    // The client appends /v1/messages to its base URL.
    common::run_client_check(&python, "anthropic_client_check.py", "");
}
