//! Black-box tests of route traces and what reads them: `run --trace`,
//! `bench decode --trace`, `trace stats`, `bench cache` (every policy against
//! Belady's optimum) and `plan`, with clean errors for damaged traces and
//! impossible plans.

use std::path::Path;

use serde_json::Value;

mod common;

use common::{fails, fixture, larder, ok_json};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `larder run --json` on the fixture `model`, recording a trace when given one.
fn generate(model: &str, trace: Option<&Path>, max_new: &str) -> Value {
    let m = fixture(model);
    let mut args = vec![
        "run",
        "--model",
        s(&m),
        "--ids",
        "1,200,31,7,9,4",
        "--max-new",
        max_new,
        "--ignore-eos",
        "--json",
    ];
    if let Some(t) = trace {
        args.extend_from_slice(&["--trace", s(t)]);
    }
    ok_json(&args)
}

fn record(model: &str, trace: &Path, max_new: &str) -> Value {
    generate(model, Some(trace), max_new)
}

#[test]
fn tracing_records_every_token_and_changes_no_output() {
    let tmp = tempfile::tempdir().unwrap();
    for model in ["qwen3_moe_tiny", "deepseek_v3_tiny", "kimi_linear_tiny", "gpt_oss_tiny"] {
        // One file per model: an existing trace is replaced only with --overwrite.
        let trace = tmp.path().join(format!("{model}.jsonl"));
        let plain = generate(model, None, "10");
        let traced = record(model, &trace, "10");
        assert_eq!(plain["ids"], traced["ids"], "{model}: tracing changed the output");
        let stats = ok_json(&["trace", "stats", s(&trace), "--json"]);
        // 6 prompt tokens and 9 decode steps (the 10th token is sampled from the 9th's logits).
        assert_eq!(stats["all"]["tokens"], 15, "{model}: {stats}");
        assert_eq!(stats["decode"]["tokens"], 9, "{model}");
        assert_eq!(stats["passes"], 10, "{model}: one prefill pass and 9 decode passes");
        let recall = stats["all"]["lookahead_recall"].as_array().unwrap();
        let layers = stats["header"]["moe_layers"].as_array().unwrap().len();
        assert_eq!(recall.len(), (layers - 1).min(3), "{model}: {stats}");
    }
}

#[test]
fn bench_cache_replays_every_policy_and_belady_bounds_them() {
    let tmp = tempfile::tempdir().unwrap();
    let trace = tmp.path().join("t.jsonl");
    record("qwen3_moe_tiny", &trace, "40");
    let doc = ok_json(&["bench", "cache", "--trace", s(&trace), "--budgets", "10%,30%,60%,100KiB", "--json"]);
    let budgets = doc["budgets"].as_array().unwrap();
    assert_eq!(budgets.len(), 4);
    assert_eq!(budgets[3]["budget_bytes"], 100 * 1024);
    for b in budgets {
        let policies = b["policies"].as_object().unwrap();
        assert_eq!(b["default_policy"], doc["default_policy"]);
        for name in ["fair_adaptive", "fair_lru", "lru", "lfu", "s3fifo", "heat_pinned_lru", "belady"] {
            assert!(policies[name]["hit_rate"].is_f64(), "{name} missing: {b}");
        }
        let best = policies["belady"]["hit_rate"].as_f64().unwrap();
        for (name, p) in policies.iter().filter(|(name, _)| *name != "online_bound") {
            assert!(p["hit_rate"].as_f64().unwrap() <= best + 1e-12, "{name} beat Belady: {b}");
        }
        assert!(
            policies["online_bound"]["hit_rate"]
                .as_f64()
                .is_some_and(|h| (0.0..=1.0).contains(&h)),
            "{b}"
        );
    }
}

#[test]
fn plan_forecasts_from_a_trace_or_a_preset() {
    let tmp = tempfile::tempdir().unwrap();
    let trace = tmp.path().join("t.jsonl");
    let m = fixture("qwen3_moe_tiny");
    let bench = ok_json(&[
        "bench",
        "decode",
        "--model",
        s(&m),
        "--ram-budget",
        "100KiB",
        "--new",
        "16",
        "--json",
        "--trace",
        s(&trace),
    ]);
    assert!(bench["decode_tok_per_s"].as_f64().unwrap() > 0.0);
    let traced = ok_json(&[
        "plan",
        "--model",
        s(&m),
        "--drive",
        "1.5",
        "--trace",
        s(&trace),
        "--ram-budget",
        "100KiB",
        "--json",
    ]);
    for key in ["decode_tok_per_s", "hit_rate", "bytes_per_token"] {
        assert!(traced[key].as_f64().is_some_and(|v| v.is_finite() && v >= 0.0), "{key}: {traced}");
    }
    assert!(["disk", "ram", "compute"].contains(&traced["binding"].as_str().unwrap()));
    assert_eq!(traced["ttft_s"].as_object().unwrap().len(), 3);
    // The replay reads in the background on the recorded predictions; without prefetch it does
    // not, and pread's demand reads, sharing the drive with them, are never faster.
    let with = |extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--model",
            s(&m),
            "--drive",
            "0.5",
            "--trace",
            s(&trace),
            "--ram-budget",
            "100KiB",
            // Fixed machine figures: measured ones vary between the runs compared.
            "--ram-gbps",
            "10",
            "--digest-gbps",
            "5",
        ];
        args.extend_from_slice(extra);
        args.push("--json");
        ok_json(&args)
    };
    let (uring, pread, off) = (with(&[]), with(&["--io", "pread"]), with(&["--no-prefetch"]));
    assert!(uring["prefetch_bytes_per_token"].as_f64().unwrap() > 0.0, "{uring}");
    assert_eq!(off["prefetch_bytes_per_token"].as_f64(), Some(0.0));
    assert!(pread["decode_tok_per_s"].as_f64() <= uring["decode_tok_per_s"].as_f64());
    let slow = with(&["--cpu-overhead", "1"]);
    assert!(slow["seconds_per_token"]["compute"].as_f64() > uring["seconds_per_token"]["compute"].as_f64());
    // A bigger cache hits more; more drives never slow decoding.
    let plan = |routing: &str, budget: &str, drive: &str| {
        ok_json(&[
            "plan",
            "--model",
            s(&m),
            "--drive",
            drive,
            "--routing",
            routing,
            "--ram-budget",
            budget,
            "--json",
        ])
    };
    for routing in ["uniform", "local", "skewed", "mixed"] {
        let small = plan(routing, "40KiB", "1");
        let big = plan(routing, "200KiB", "1");
        assert!(big["hit_rate"].as_f64() > small["hit_rate"].as_f64(), "{routing}: {small} vs {big}");
        let four = plan(routing, "40KiB", "1x4");
        assert!(four["decode_tok_per_s"].as_f64() >= small["decode_tok_per_s"].as_f64());
    }
    for routing in ["local", "skewed", "mixed"] {
        assert!(plan(routing, "80KiB", "1")["hit_rate"].as_f64() > plan("uniform", "80KiB", "1")["hit_rate"].as_f64());
    }
}

#[test]
fn damaged_traces_and_impossible_plans_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let trace = tmp.path().join("t.jsonl");
    record("qwen3_moe_tiny", &trace, "10");
    let text = std::fs::read_to_string(&trace).unwrap();
    let bad = tmp.path().join("bad.jsonl");
    std::fs::write(&bad, &text[..text.len() - 30]).unwrap();
    for cmd in [&["trace", "stats"][..], &["bench", "cache", "--trace"][..]] {
        let mut args = cmd.to_vec();
        args.push(s(&bad));
        let e = fails(&args);
        assert!(e.contains("bad.jsonl") && e.contains("line"), "{e}");
    }
    std::fs::write(&bad, text.replace("\"larder_trace\":1", "\"larder_trace\":1,\"color\":2")).unwrap();
    assert!(fails(&["trace", "stats", s(&bad)]).contains("color"));
    let m = fixture("qwen3_moe_tiny");
    let e = fails(&["run", "--model", s(&m), "--ids", "1", "--trace", "/nonexistent-dir/t.jsonl"]);
    assert!(e.contains("--trace") && e.contains("does not exist"), "{e}");
    let e = fails(&["plan", "--model", s(&m), "--drive", "1", "--ram", "10MB"]);
    assert!(e.contains("--ram") && e.contains("spine"), "{e}");
    let e = fails(&["plan", "--model", s(&m), "--drive", "fast"]);
    assert!(e.contains("--drive"), "{e}");
    let e = fails(&["plan", "--model", s(&m), "--drive", "1", "--ram-budget", "20GB", "--ram", "4GB"]);
    assert!(e.contains("--ram-budget"), "{e}");
    let e = fails(&["plan", "--model", s(&m), "--drive", "1", "--cpu-overhead", "-1"]);
    assert!(e.contains("--cpu-overhead"), "{e}");
    let e = fails(&["plan", "--model", s(&m), "--drive", "1", "--io", "mmap"]);
    assert!(e.contains("--io"), "{e}");
    let e = fails(&["plan", "--model", s(&m), "--drive", "1", "--routing", "zipf"]);
    assert!(e.contains("--routing") && e.contains("skewed"), "{e}");
    let other = fixture("deepseek_v3_tiny");
    let e = fails(&["plan", "--model", s(&other), "--drive", "1", "--trace", s(&trace)]);
    assert!(e.contains("--trace") && e.contains("recorded on"), "{e}");
    assert!(larder(&["bench", "cache", "--trace", s(&trace), "--budgets", "0%"]).status.code() == Some(1));
}
