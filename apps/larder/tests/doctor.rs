//! Black-box tests of `larder doctor`: the machine and drive figures, the
//! model figures of a checkpoint, the store packed from it and its config.json
//! alone, the plan, and clean errors for bad inputs.

use std::path::{Path, PathBuf};

use serde_json::Value;

mod common;

use common::{fails, larder, ok_json};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen3_moe_tiny")
}

/// Probe files left in `dir`.
fn probe_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".larder-doctor-probe"))
        .collect()
}

/// A copy of the tiny checkpoint (the doctor probes the model's folder, so
/// the tests do not write into the repository's fixtures).
fn checkpoint(dir: &Path) -> PathBuf {
    let ckpt = dir.join("ckpt");
    std::fs::create_dir_all(&ckpt).unwrap();
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(fixture().join(f), ckpt.join(f)).unwrap();
    }
    ckpt
}

fn doctor(extra: &[&str], drive: &Path) -> Value {
    let mut args = vec!["doctor", "--json", "--probe-mib", "8", "--drive", s(drive)];
    args.extend_from_slice(extra);
    ok_json(&args)
}

#[test]
fn json_describes_machine_and_drive_and_cleans_up() {
    let tmp = tempfile::tempdir().unwrap();
    let doc = doctor(&[], tmp.path());
    let m = &doc["machine"];
    for key in [
        "cpu_model",
        "cores",
        "threads",
        "features",
        "kernel_path",
        "ram_available_bytes",
        "ram_read_gbps",
    ] {
        assert!(!m[key].is_null(), "machine.{key} missing: {m}");
    }
    assert!(m["ram_total_bytes"].as_u64().unwrap() > 0, "{m}");
    assert!(!m["kernel_path"].as_str().unwrap().is_empty());
    assert!(m["ram_read_gbps"].as_f64().unwrap() > 0.0);
    if cfg!(target_arch = "x86_64") {
        assert!(m["features"]["avx2"].is_boolean(), "{m}");
    }
    let drives = doc["drives"].as_array().unwrap();
    assert_eq!(drives.len(), 1, "only the --drive folder: {doc}");
    let d = &drives[0];
    assert!(d["read_gbps"].as_f64().unwrap() > 0.0, "{d}");
    assert_eq!(d["probe_bytes"], 8 << 20);
    for key in ["filesystem", "free_bytes", "o_direct", "io_uring", "backend", "page_cache_only"] {
        assert!(!d[key].is_null(), "drives[0].{key} missing: {d}");
    }
    assert!(doc["model"].is_null() && doc["recommendation"].is_null());
    assert!(probe_files(tmp.path()).is_empty(), "probe file left behind");
}

#[test]
fn checkpoint_store_and_config_agree() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(tmp.path());
    let store = tmp.path().join("store");
    ok_json(&["pack", "--model", s(&ckpt), "--out", s(&store), "--json"]);
    let drive = tmp.path();
    let of_ckpt = doctor(&["--model", s(&ckpt)], drive);
    let of_store = doctor(&["--model", s(&store)], drive);
    let of_config = doctor(&["--model", s(&ckpt.join("config.json"))], drive);
    let (a, b, c) = (&of_ckpt["model"], &of_store["model"], &of_config["model"]);
    assert_eq!(
        (a["kind"].as_str(), b["kind"].as_str(), c["kind"].as_str()),
        (Some("checkpoint"), Some("store"), Some("config"))
    );
    for key in ["model_type", "layers", "moe_layers", "experts_per_layer", "top_k"] {
        assert_eq!(a[key], b[key], "{key}");
        assert_eq!(a[key], c[key], "{key}");
    }
    assert_eq!((a["layers"].as_u64(), a["moe_layers"].as_u64()), (Some(4), Some(3)));
    assert_eq!((a["experts_per_layer"].as_u64(), a["top_k"].as_u64()), (Some(8), Some(2)));
    for key in ["spine_bytes", "expert_bytes", "expert_bank_bytes", "expert_bytes_per_token"] {
        assert_eq!(a[key], b[key], "exact {key}: checkpoint vs store");
    }
    assert_eq!(
        (a["sizes"].as_str(), b["sizes"].as_str(), c["sizes"].as_str()),
        (Some("exact"), Some("exact"), Some("estimated"))
    );
    // The fixture is all bf16 with no extra tensors: the estimate is exact too.
    assert_eq!(a["expert_bank_bytes"], 294912);
    assert_eq!(c["expert_bank_bytes"], a["expert_bank_bytes"]);
    assert_eq!(c["spine_bytes"], a["spine_bytes"]);
    assert_eq!(a["expert_bytes_per_token"], 2 * 3 * 12288);
    // The model's folder is probed besides the --drive one.
    assert_eq!(of_ckpt["drives"].as_array().unwrap().len(), 2, "{}", of_ckpt["drives"]);
    let r = &of_ckpt["recommendation"];
    assert_eq!(r["fit"], "in_ram", "{r}");
    assert_eq!(r["ram_budget_bytes"], 294912);
    assert_eq!(r["bound"], "compute");
    assert!(r["expected_tok_per_s"].as_f64().unwrap() > 0.0);
    assert!(["uring", "pread"].contains(&r["io"].as_str().unwrap()));
    for dir in [tmp.path(), &ckpt, &store] {
        assert!(probe_files(dir).is_empty(), "probe file left in {}", dir.display());
    }
}

#[test]
fn ram_budget_sets_the_estimate() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(tmp.path());
    let doc = doctor(&["--model", s(&ckpt), "--ram-budget", "0"], tmp.path());
    let r = &doc["recommendation"];
    assert_eq!(r["planned_ram_budget_bytes"], 0, "{r}");
    assert_eq!(r["miss_rate"], 1.0);
    assert!(r["disk_bound_tok_per_s"].as_f64().unwrap() > 0.0, "{r}");
    let expected = r["expected_tok_per_s"].as_f64().unwrap();
    let lower = r["disk_bound_tok_per_s"]
        .as_f64()
        .unwrap()
        .min(r["compute_bound_tok_per_s"].as_f64().unwrap());
    assert_eq!(expected, lower);
}

#[test]
fn a_spine_bigger_than_ram_does_not_fit() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(fixture().join("config.json")).unwrap()).unwrap();
    // 2^24 tokens x 65536 x bf16: a 2 TiB embedding table (sized from the
    // recorded load, whose placeholders map it: a larger one than the
    // address space holds, 2^30 tokens, cannot be sized from a config).
    cfg["vocab_size"] = (1u64 << 24).into();
    cfg["hidden_size"] = 65536.into();
    let dir = tmp.path().join("huge");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let doc = doctor(&["--model", s(&dir)], tmp.path());
    assert_eq!(doc["model"]["sizes"], "estimated");
    let r = &doc["recommendation"];
    assert_eq!(r["fit"], "does_not_fit", "{r}");
    assert!(r["fit_text"].as_str().unwrap().contains("the spine alone needs"), "{r}");
    assert!(r["ram_budget"].is_null() && r["bound"].is_null());
    assert_eq!(r["expected_tok_per_s"], 0.0);
}

#[test]
fn text_report_has_its_sections() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(tmp.path());
    let out = larder(&["doctor", "--probe-mib", "8", "--drive", s(tmp.path()), "--model", s(&ckpt)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    for section in [
        "Machine\n",
        "Drives\n",
        "\nModel ",
        "Recommendation\n",
        "runs in RAM",
        "GB/s",
        "tok/s",
    ] {
        assert!(text.contains(section), "no {section:?} in:\n{text}");
    }
}

#[test]
fn bad_inputs_fail_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-such-folder");
    let err = fails(&["doctor", "--drive", s(&missing)]);
    assert!(err.contains(s(&missing)) && err.contains("existing folder"), "{err}");

    let file = tmp.path().join("file.txt");
    std::fs::write(&file, "x").unwrap();
    let err = fails(&["doctor", "--drive", s(&file), "--probe-mib", "8"]);
    assert!(err.contains("not a folder"), "{err}");
    let err = fails(&["doctor", "--model", s(&file), "--drive", s(tmp.path()), "--probe-mib", "8"]);
    assert!(err.contains("not a model") && err.contains(s(&file)), "{err}");

    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let err = fails(&["doctor", "--model", s(&empty), "--drive", s(tmp.path()), "--probe-mib", "8"]);
    assert!(err.contains("not a model") && err.contains("config.json"), "{err}");

    let bogus = tmp.path().join("bogus");
    std::fs::create_dir(&bogus).unwrap();
    std::fs::write(bogus.join("config.json"), r#"{"model_type": "nope"}"#).unwrap();
    let err = fails(&["doctor", "--model", s(&bogus), "--drive", s(tmp.path()), "--probe-mib", "8"]);
    assert!(err.contains("nope"), "{err}");

    let err = fails(&["doctor", "--probe-mib", "0"]);
    assert!(err.contains("--probe-mib") && err.contains("out of range"), "{err}");
    let err = fails(&["doctor", "--ram-budget", "1GiB", "--drive", s(tmp.path())]);
    assert!(err.contains("--ram-budget needs --model"), "{err}");
    let ckpt = checkpoint(tmp.path());
    let err = fails(&["doctor", "--model", s(&ckpt), "--ram-budget", "100", "--drive", s(tmp.path())]);
    assert!(err.contains("below one expert record"), "{err}");
    assert!(probe_files(tmp.path()).is_empty());
}

#[test]
fn a_killed_run_s_probe_file_is_removed_next_time() {
    let tmp = tempfile::tempdir().unwrap();
    // A pid far above any live one (pid_max is at most 2^22).
    let stale = tmp.path().join(".larder-doctor-probe-99999999");
    std::fs::write(&stale, "left by a killed run").unwrap();
    doctor(&[], tmp.path());
    assert!(!stale.exists());
}
