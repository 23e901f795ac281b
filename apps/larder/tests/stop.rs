//! `larder run --stop STR` (repeatable) goes through the engine's request
//! loop, as the server does: the text ends before the first stop string
//! (even one spanning several tokens), the ids end at the token completing
//! it, the finish reason is `stop`; streamed text equals the JSON text; a
//! drafter changes nothing; a model without a tokenizer refuses --stop.

use std::path::{Path, PathBuf};

mod common;

use common::{fails, larder, ok_json};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

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
