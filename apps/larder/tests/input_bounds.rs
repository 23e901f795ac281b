//! Input sizes that used to abort the process (issue 37, finding 6) are
//! clean errors naming the field, with exit status 1 (not a signal): a huge
//! `linear_attn_config.short_conv_kernel_size` for `doctor` and `plan`
//! (config.json alone, and a checkpoint folder, whose recorded load aborted
//! allocating the convolution taps), and a trace header claiming 2^40
//! experts for `trace stats`, `bench cache` and `plan --trace` (`trace
//! stats` aborted allocating a counter per claimed expert).

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

mod common;

use common::{fixture, larder};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs larder expecting a plain failure: exit status 1 (an error, not a
/// signal such as SIGABRT), no panic; returns stderr.
fn refused(args: &[&str]) -> String {
    let out = larder(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "larder {args:?}: {:?}: {err}", out.status);
    assert!(!err.contains("panicked"), "larder {args:?} panicked: {err}");
    err
}

/// `dir` holding kimi_linear_tiny's config.json with a 2^31-tap convolution,
/// and with the fixture's weights when `weights`.
fn huge_kernel_model(dir: &Path, weights: bool) -> PathBuf {
    let src = fixture("kimi_linear_tiny");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["linear_attn_config"]["short_conv_kernel_size"] = json!(1u64 << 31);
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    if weights {
        std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    }
    dir.to_path_buf()
}

#[test]
fn doctor_and_plan_refuse_a_huge_convolution_kernel_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let config = huge_kernel_model(&tmp.path().join("config-only"), false).join("config.json");
    let checkpoint = huge_kernel_model(&tmp.path().join("checkpoint"), true);
    for model in [&config, &checkpoint] {
        let runs: [&[&str]; 2] = [
            &["doctor", "--model", s(model), "--drive", s(tmp.path()), "--probe-mib", "8"],
            &["plan", "--model", s(model), "--drive", "1", "--ram", "64GiB"],
        ];
        for args in runs {
            let err = refused(args);
            assert!(
                err.contains("linear_attn_config.short_conv_kernel_size") && err.contains("2147483648"),
                "{args:?}: {err}"
            );
        }
    }
}

#[test]
fn trace_readers_refuse_a_header_claiming_too_many_experts() {
    let tmp = tempfile::tempdir().unwrap();
    let trace = tmp.path().join("huge.jsonl");
    let header = json!({"larder_trace": 1, "model": "m", "experts": 1u64 << 40, "top_k": 2,
                        "moe_layers": [0, 1], "expert_bytes": [100, 100], "lookahead": 0});
    let token = json!({"seq": 0, "pos": 0, "phase": "decode", "pass": 0, "routes": [[0, 1], [2, 3]]});
    std::fs::write(&trace, format!("{header}\n{token}\n")).unwrap();
    let model = fixture("qwen3_moe_tiny");
    let runs: [&[&str]; 3] = [
        &["trace", "stats", s(&trace)],
        &["bench", "cache", "--trace", s(&trace)],
        &["plan", "--model", s(&model), "--drive", "1", "--trace", s(&trace)],
    ];
    for args in runs {
        let err = refused(args);
        assert!(err.contains("line 1") && err.contains("experts = 1099511627776"), "{args:?}: {err}");
    }
}
