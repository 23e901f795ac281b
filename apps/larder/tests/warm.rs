//! Black-box tests of expert heat and warming: a streamed run of a packed
//! store leaves heat.json beside it; `larder warm` and `--warm` read the
//! hottest experts into the cache within its budget; output is unchanged.

use std::path::Path;

mod common;

use common::{fails, fixture, ok_json};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn runs_leave_heat_and_warming_reads_the_hottest_within_the_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let model = fixture("qwen3_moe_tiny");
    ok_json(&["pack", "--model", s(&model), "--out", s(&store), "--json"]);
    let e = fails(&["warm", s(&store)]);
    assert!(e.contains("no heat yet"), "{e}");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--model",
            s(&store),
            "--ids",
            "1,200,31,7",
            "--max-new",
            "8",
            "--ignore-eos",
            "--json",
        ];
        args.extend_from_slice(extra);
        ok_json(&args)
    };
    // A cache that holds every expert the prompt uses and no prefetch: hit
    // counts depend on nothing but the prompt and what was warmed.
    let first = run(&["--ram-budget", "64MiB", "--prefetch", "0", "--stats"]);
    let heat: serde_json::Value = serde_json::from_slice(&std::fs::read(store.join("heat.json")).unwrap()).unwrap();
    assert_eq!(heat["larder_heat"], 1);
    let warm = ok_json(&["warm", s(&store), "--ram-budget", "64KiB", "--json"]);
    let (n, bytes) = (warm["experts"].as_u64().unwrap(), warm["bytes"].as_u64().unwrap());
    assert!(n >= 1 && bytes <= 64 * 1024, "{warm}");
    let warmed = run(&["--ram-budget", "64MiB", "--prefetch", "0", "--warm", "--stats"]);
    assert_eq!(first["ids"], warmed["ids"], "warming changed the output");
    let (cold, hot) = (&first["stats"], &warmed["stats"]);
    // Cold, each expert's first demand misses; warmed, every expert used is already cached.
    assert!(cold["cache_misses"].as_u64() > Some(0), "{cold}");
    assert_eq!(hot["cache_misses"].as_u64(), Some(0), "{hot}");
    assert_eq!(
        hot["cache_hits"].as_u64().unwrap(),
        cold["cache_hits"].as_u64().unwrap() + cold["cache_misses"].as_u64().unwrap()
    );
    // A damaged heat file is named (not "no heat yet"); --warm warns and the output is unchanged.
    std::fs::write(store.join("heat.json"), "{").unwrap();
    let e = fails(&["warm", s(&store)]);
    assert!(e.contains("heat.json") && e.contains("damaged"), "{e}");
    let (out, err) = common::ok_with_stderr(&[
        "run",
        "--model",
        s(&store),
        "--ids",
        "1,200,31,7",
        "--max-new",
        "8",
        "--ignore-eos",
        "--json",
        "--warm",
    ]);
    assert_eq!(out["ids"], first["ids"]);
    assert!(err.contains("damaged"), "{err}");
}
