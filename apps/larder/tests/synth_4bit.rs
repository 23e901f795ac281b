//! `larder synth --experts-format int4|mxfp4` through the CLI: tiny
//! deepseek_v3 and kimi_linear checkpoints with compressed-tensors 4-bit
//! experts pack, verify, and stream (packed store at several budgets, and
//! the checkpoint folder itself) bit-identically to running them in RAM;
//! `larder synth --arch gpt_oss` writes a checkpoint that runs in RAM (bf16
//! experts) or ships gpt-oss's MXFP4 layout.

use std::path::Path;

use serde_json::Value;

mod common;

use common::{check_pack_and_stream, fails, ok_json};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn deepseek_v3_int4_synth_packs_and_streams_bit_identically() {
    let report = check_synth("deepseek_v3", "int4");
    // gate, up [32, 64] and down [64, 32]: codes at 4 bits, a bf16 scale per 32, weight_shape.
    assert_eq!(report["expert_record_bytes"], 3 * (32 * 64 / 2 + 64 * 2 + 8));
}

#[test]
fn deepseek_v3_mxfp4_synth_packs_and_streams_bit_identically() {
    let report = check_synth("deepseek_v3", "mxfp4");
    assert_eq!(report["expert_record_bytes"], 3 * (32 * 64 / 2 + 64));
}

#[test]
fn kimi_linear_int4_synth_packs_and_streams_bit_identically() {
    check_synth("kimi_linear", "int4");
}

/// Synth tiny `arch` with `format` experts (seed 5), pack, verify, and
/// compare forward logits and greedy ids streamed against in RAM; returns
/// synth's report.
fn check_synth(arch: &str, format: &str) -> Value {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    let report = ok_json(&[
        "synth",
        "--arch",
        arch,
        "--experts-format",
        format,
        "--seed",
        "5",
        "--out",
        s(&model),
        "--json",
    ]);
    assert_eq!(report["spec"]["experts_format"], format);
    assert!(report["routing_overlap"]["mean"].as_f64().unwrap() < 3.0 * 2.0 / 16.0);
    let config: Value = serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["quantization_config"]["quant_method"], "compressed-tensors");

    let store = tmp.path().join("store");
    let packed = check_pack_and_stream(&model, &store, ["0", "16KiB", "1GiB"]);
    assert_eq!(packed["expert_bytes"], report["expert_bytes"], "records at their 4-bit size");
    report
}

#[test]
fn gpt_oss_synth_runs_in_ram_with_bf16_experts_and_ships_mxfp4() {
    let tmp = tempfile::tempdir().unwrap();
    let bf16 = tmp.path().join("bf16");
    let report = ok_json(&[
        "synth",
        "--arch",
        "gpt_oss",
        "--experts-format",
        "bf16",
        "--out",
        s(&bf16),
        "--json",
    ]);
    assert_eq!(report["spec"]["gpt_oss"]["sliding_window"], 4);
    assert!(report["routing_overlap"]["mean"].as_f64().unwrap() < 3.0 * 4.0 / 16.0);
    let out = ok_json(&["forward", "--model", s(&bf16), "--ids", "5,17,42", "--json"]);
    assert_eq!(out["logits"].as_array().unwrap().len(), 3);

    // MXFP4 is gpt_oss's default format; --measure-tokens 0 because the
    // loader refuses gpt-oss MXFP4 experts until that path lands (issue 21).
    let mx = tmp.path().join("mxfp4");
    let report = ok_json(&["synth", "--arch", "gpt_oss", "--measure-tokens", "0", "--out", s(&mx), "--json"]);
    assert_eq!(report["spec"]["experts_format"], "mxfp4");
    // Fused gate_up [128, 64] and down [64, 64] in MXFP4 plus bf16 biases (128 + 64).
    assert_eq!(
        report["expert_record_bytes"],
        128 * 64 / 2 + 128 * 2 + 64 * 64 / 2 + 64 * 2 + 192 * 2
    );
    let config: Value = serde_json::from_str(&std::fs::read_to_string(mx.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["quantization_config"]["quant_method"], "mxfp4");
}

#[test]
fn experts_format_is_refused_where_it_is_not_written() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("x");
    let err = fails(&["synth", "--arch", "qwen3_moe", "--experts-format", "int4", "--out", s(&out)]);
    assert!(err.contains("--experts-format int4") && err.contains("qwen3_moe"), "{err}");
    let err = fails(&["synth", "--arch", "gpt_oss", "--experts-format", "int4", "--out", s(&out)]);
    assert!(err.contains("gpt_oss") && err.contains("mxfp4"), "{err}");
    let err = fails(&["synth", "--arch", "gpt_oss", "--preset", "k3-mini", "--out", s(&out)]);
    assert!(err.contains("20b") && err.contains("120b"), "{err}");
    let err = fails(&["synth", "--arch", "deepseek_v3", "--experts-format", "fp8", "--out", s(&out)]);
    assert!(err.contains("fp8"), "{err}");
    assert!(!out.exists(), "nothing written");
}
