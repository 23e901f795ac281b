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
    let first = run(&["--ram-budget", "64KiB"]);
    let heat: serde_json::Value = serde_json::from_slice(&std::fs::read(store.join("heat.json")).unwrap()).unwrap();
    assert_eq!(heat["larder_heat"], 1);
    let warm = ok_json(&["warm", s(&store), "--ram-budget", "64KiB", "--json"]);
    let (n, bytes) = (warm["experts"].as_u64().unwrap(), warm["bytes"].as_u64().unwrap());
    assert!(n >= 1 && bytes <= 64 * 1024, "{warm}");
    let warmed = run(&["--ram-budget", "64KiB", "--warm", "--stats"]);
    assert_eq!(first["ids"], warmed["ids"], "warming changed the output");
    let (cold, hot) = (&first["stats"], &warmed["stats"]);
    assert!(hot["cache_hits"].as_u64() > cold["cache_hits"].as_u64(), "{cold} vs {hot}");
    // A damaged heat file is ignored: nothing to warm, nothing fails.
    std::fs::write(store.join("heat.json"), "{").unwrap();
    assert!(fails(&["warm", s(&store)]).contains("no heat yet"));
    assert_eq!(run(&["--ram-budget", "64KiB", "--warm"])["ids"], first["ids"]);
}
