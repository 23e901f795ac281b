//! `larder plan` and `larder doctor` on a remote checkpoint (`--model
//! org/name`, over real HTTP to larder-testkit's loopback hub): only
//! config.json, the index and each shard's safetensors header are read (by
//! range), never a byte of weights; the sizes equal those of the same
//! checkpoint read locally. The checkpoint is Kimi K3's published layout
//! (fixtures/kimi_k3_tiny): its vision tower is reported as skipped and its
//! KDA state and MLA cache per token are given.

use std::path::{Path, PathBuf};
use std::process::Command;

use larder_testkit::hub::{HubServer, REPO};
use serde_json::Value;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/kimi_k3_tiny")
}

fn larder_json(args: &[&str], endpoint: &str) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_larder"))
        .args(args)
        .env("HF_ENDPOINT", endpoint)
        .env_remove("HF_TOKEN")
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Bytes of `file`'s length prefix and JSON header.
fn head_len(file: &Path) -> usize {
    let bytes = std::fs::read(file).unwrap();
    8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize
}

#[test]
fn plan_and_doctor_read_only_headers_of_a_remote_k3() {
    let server = HubServer::start(&fixture());
    let plan = [
        "plan",
        "--ram",
        "4GB",
        "--drive",
        "2x4",
        "--tokens",
        "50",
        "--json",
        "--ram-gbps",
        "10",
        "--digest-gbps",
        "5",
    ];
    let remote = larder_json(&[&plan[..], &["--model", REPO]].concat(), &server.url);
    for f in std::fs::read_dir(fixture()).unwrap() {
        let name = f.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".safetensors") && name.starts_with("model-") {
            assert_eq!(
                server.sent(&name),
                head_len(&fixture().join(&name)),
                "{name}: only its header is read"
            );
        }
    }
    let local = larder_json(&[&plan[..], &["--model", fixture().to_str().unwrap()]].concat(), &server.url);
    let (r, l) = (&remote["model_report"], &local["model_report"]);
    assert_eq!(r["kind"], "remote");
    assert_eq!(r["model_type"], "kimi_k3");
    for key in [
        "spine_bytes",
        "expert_bytes",
        "expert_bank_bytes",
        "expert_bytes_per_token",
        "kv_bytes_per_token",
        "skipped_bytes",
    ] {
        assert_eq!(r[key], l[key], "{key}");
    }
    // 4 KDA layers of 2 heads x 16: state 2x16x16 f32 and 3 conv taps x 3 x 32 f32.
    assert_eq!(r["recurrent_state_bytes"], 4 * 4 * (32 * 16 + 3 * 3 * 32));
    // 3 MLA layers caching the latent (16) and the rope key (8) in f32.
    assert_eq!(r["kv_bytes_per_token"], 3 * 4 * (16 + 8));
    assert!(r["skipped_bytes"].as_u64().unwrap() > 0, "the vision tower is reported");
    assert!(remote["decode_tok_per_s"].as_f64().unwrap() > 0.0);

    let doctor = larder_json(
        &[
            "doctor",
            "--json",
            "--probe-mib",
            "8",
            "--drive",
            env!("CARGO_TARGET_TMPDIR"),
            "--model",
            REPO,
        ],
        &server.url,
    );
    assert_eq!(doctor["model"]["kind"], "remote");
    assert_eq!(doctor["model"]["spine_bytes"], l["spine_bytes"]);
    assert!(doctor["recommendation"].is_object());
}
