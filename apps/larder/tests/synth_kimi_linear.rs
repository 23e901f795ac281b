//! `larder synth --arch kimi_linear` through the CLI: the tiny checkpoint
//! packs, verifies, and streams (packed store at several budgets, and the
//! checkpoint folder itself) bit-identically to running it in RAM; also
//! with latent-space experts (`--moe-latent-size`).

use std::path::Path;

use serde_json::Value;

mod common;

use common::{check_pack_and_stream, fails, ok_json};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn kimi_linear_synth_packs_and_streams_bit_identically() {
    check_synth(&[]);
}

#[test]
fn latent_expert_synth_packs_and_streams_bit_identically() {
    let report = check_synth(&["--moe-latent-size", "24"]);
    // Experts 24 wide instead of 64: gate, up, down of 32 x 24 in bf16.
    assert_eq!(report["expert_record_bytes"], 3 * 32 * 24 * 2);
}

/// Synth (tiny, seed 5, `extra` flags), pack, verify, and compare forward
/// logits and greedy ids streamed against in RAM; returns synth's report.
fn check_synth(extra: &[&str]) -> Value {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("kimi");
    let mut args = vec![
        "synth",
        "--arch",
        "kimi_linear",
        "--preset",
        "tiny",
        "--seed",
        "5",
        "--out",
        s(&model),
        "--json",
    ];
    args.extend_from_slice(extra);
    let report = ok_json(&args);
    assert_eq!(report["spec"]["kda"]["mla_every"], 4);
    assert!(report["routing_overlap"]["mean"].as_f64().unwrap() < 3.0 * 2.0 / 16.0);
    let config: Value = serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["model_type"], "kimi_linear");
    assert_eq!(config["moe_latent_size"], report["spec"]["moe_latent_size"]);

    let store = tmp.path().join("store");
    let packed = check_pack_and_stream(&model, &store, ["0", "64KiB", "1GiB"]);
    assert_eq!(packed["layers"], 4, "the dense first layer has no routed experts");
    report
}

#[test]
fn synth_names_kimi_linear_among_the_architectures() {
    let tmp = tempfile::tempdir().unwrap();
    let err = fails(&["synth", "--arch", "kimi_k3", "--out", s(&tmp.path().join("x"))]);
    assert!(err.contains("kimi_linear") && err.contains("deepseek_v3"), "{err}");
    let err = fails(&[
        "synth",
        "--arch",
        "kimi_linear",
        "--preset",
        "k3",
        "--out",
        s(&tmp.path().join("y")),
    ]);
    assert!(err.contains("k3-mini"), "{err}");
    // Grouped routing: experts in whole groups, refused before anything is written.
    let out = tmp.path().join("z");
    let err = fails(&["synth", "--arch", "kimi_linear", "--experts", "10", "--out", s(&out)]);
    assert!(err.contains("--experts 10") && err.contains("4 expert groups"), "{err}");
    let err = fails(&["synth", "--arch", "kimi_linear", "--top-k", "9", "--out", s(&out)]);
    assert!(err.contains("--top-k 9"), "{err}");
    // Latent-space experts: kimi_linear only, a positive width.
    let err = fails(&["synth", "--arch", "deepseek_v3", "--moe-latent-size", "8", "--out", s(&out)]);
    assert!(err.contains("--moe-latent-size") && err.contains("kimi_linear"), "{err}");
    let err = fails(&["synth", "--arch", "kimi_linear", "--moe-latent-size", "0", "--out", s(&out)]);
    assert!(err.contains("--moe-latent-size"), "{err}");
    assert!(!out.exists(), "nothing written");
}
