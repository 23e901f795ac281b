//! `larder synth --arch kimi_linear` through the CLI: the tiny checkpoint
//! packs, verifies, and streams (packed store at several budgets, and the
//! checkpoint folder itself) bit-identically to running it in RAM; also
//! with K3's latent experts (`--routed-expert-hidden-size`); and `--arch
//! kimi_k3` (Kimi K3 as published) the same way.

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
    let report = check_synth(&["--routed-expert-hidden-size", "24"]);
    // Experts 24 wide instead of 64: gate, up, down of 32 x 24 in bf16.
    assert_eq!(report["expert_record_bytes"], 3 * 32 * 24 * 2);
    assert_eq!(report["spec"]["latent_moe_use_norm"], true, "the norm by default, as K3 ships");
}

#[test]
fn kimi_k3_synth_packs_and_streams_bit_identically() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("k3");
    let report = ok_json(&["synth", "--arch", "kimi_k3", "--seed", "5", "--out", s(&model), "--json"]);
    // Latent 32 wide, MXFP4: 3 x (32 x 32 / 2 codes + 32 scales).
    assert_eq!(report["expert_record_bytes"], 3 * (32 * 16 + 32));
    let config: Value = serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["model_type"], "kimi_k3");
    assert_eq!(config["text_config"]["routed_expert_hidden_size"], 32);
    let store = tmp.path().join("store");
    let packed = check_pack_and_stream(&model, &store, ["0", "16KiB", "1GiB"]);
    assert_eq!(packed["layers"], 5, "the dense first layer has no routed experts");
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
    let latent = &report["spec"]["routed_expert_hidden_size"];
    assert_eq!(config.get("routed_expert_hidden_size").unwrap_or(&Value::Null), latent);

    let store = tmp.path().join("store");
    let packed = check_pack_and_stream(&model, &store, ["0", "64KiB", "1GiB"]);
    assert_eq!(packed["layers"], 4, "the dense first layer has no routed experts");
    report
}

#[test]
fn synth_names_kimi_linear_among_the_architectures() {
    let tmp = tempfile::tempdir().unwrap();
    let err = fails(&["synth", "--arch", "kimi_k4", "--out", s(&tmp.path().join("x"))]);
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
    // Latent experts: the Kimi layouts only, a positive width, the norm only with them.
    let latent = "--routed-expert-hidden-size";
    let err = fails(&["synth", "--arch", "deepseek_v3", latent, "8", "--out", s(&out)]);
    assert!(err.contains(latent) && err.contains("kimi_linear"), "{err}");
    let err = fails(&["synth", "--arch", "kimi_linear", latent, "0", "--out", s(&out)]);
    assert!(err.contains(latent), "{err}");
    let err = fails(&["synth", "--arch", "kimi_linear", "--latent-moe-use-norm", "true", "--out", s(&out)]);
    assert!(err.contains("--latent-moe-use-norm") && err.contains(latent), "{err}");
    assert!(!out.exists(), "nothing written");
}
