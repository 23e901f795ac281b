//! `larder bench serve`: the JSON document's keys and positive rates on a
//! tiny fixture (two interleaved rounds), and clear errors for bad
//! `--clients` values.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

fn bench(clients: &str) -> std::process::Output {
    bench_on("qwen3_moe_tok", clients)
}

fn bench_on(model: &str, clients: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_larder"))
        .args(["bench", "serve", "--model"])
        .arg(fixture(model))
        .args(["--clients", clients, "--max-new", "4", "--repeats", "2", "--json"])
        .output()
        .unwrap()
}

#[test]
fn json_has_the_documented_keys_and_positive_rates() {
    let out = bench("1,2");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["max_new"], 4);
    assert_eq!(doc["repeats"], 2);
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for (run, c) in runs.iter().zip([1u64, 2]) {
        assert_eq!(run["clients"], c);
        assert_eq!(run["tokens"], 2 * 4 * c, "two rounds of 4 tokens per client: {run}");
        assert_eq!(run["rounds"].as_array().unwrap().len(), 2, "{run}");
        let (lo, mid, hi) = (
            run["aggregate_tok_s_min"].as_f64().unwrap(),
            run["aggregate_tok_s"].as_f64().unwrap(),
            run["aggregate_tok_s_max"].as_f64().unwrap(),
        );
        assert!(lo <= mid && mid <= hi, "{run}");
        // Uniform routing of one client reads one expert per route; more clients share.
        let union = run["uniform_reads_per_route"].as_f64().unwrap();
        assert!(union > 0.0 && union <= 1.0 && (c > 1 || union == 1.0), "{run}");
        for key in [
            "aggregate_tok_s",
            "per_client_tok_s_median",
            "ttft_ms_median",
            "ttft_ms_max",
            "wall_s",
        ] {
            assert!(run[key].as_f64().unwrap() > 0.0, "{key}: {run}");
        }
        assert!(run["expert_bytes_per_token"].is_null(), "experts are in RAM: {run}");
    }
    for key in ["ttft_alone_ms", "ttft_beside_ms"] {
        assert!(doc["second_client"][key].as_f64().unwrap() > 0.0, "{key}: {doc}");
    }
}

/// A checkpoint without a tokenizer (as synthetic ones are) is driven with
/// token-id prompts; every token is counted.
#[test]
fn a_model_without_a_tokenizer_gets_token_id_prompts() {
    let out = bench_on("qwen3_moe_tiny", "1,3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    for (run, c) in doc["runs"].as_array().unwrap().iter().zip([1u64, 3]) {
        assert_eq!(run["tokens"], 2 * 4 * c, "{run}");
        assert!(
            run["ttft_ms_max"].as_f64().unwrap() <= run["wall_s"].as_f64().unwrap() * 1e3,
            "{run}"
        );
    }
}

#[test]
fn bad_clients_are_refused_clearly() {
    for (bad, says) in [
        ("0", "0 is not in 1..=256"),
        ("", "empty count"),
        ("1,x", "`x` is not a number"),
        ("2,", "empty"),
    ] {
        let out = bench(bad);
        assert!(!out.status.success(), "--clients {bad:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--clients") && err.contains(says), "--clients {bad:?}: {err}");
    }
}
