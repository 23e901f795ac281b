//! Black-box tests of the streaming commands: synth, pack, verify, run and
//! forward on packed stores and streamed checkpoints, bench io/decode JSON,
//! and packs interrupted by a full disk or a crash.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

mod common;

use common::{fails, fixture, ok_json};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A tiny synthetic checkpoint in a temp dir.
fn synth(dir: &Path, routing: &str) -> (PathBuf, Value) {
    let model = dir.join(format!("tiny-{routing}"));
    let report = ok_json(&[
        "synth",
        "--preset",
        "tiny",
        "--routing",
        routing,
        "--seed",
        "3",
        "--out",
        s(&model),
        "--json",
    ]);
    (model, report)
}

#[test]
fn synth_pack_verify_and_streamed_runs_agree() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, report) = synth(tmp.path(), "uniform");
    let overlap = &report["routing_overlap"];
    let expected = overlap["expected_uniform"].as_f64().unwrap();
    assert_eq!(expected, 2.0 / 16.0);
    assert!(
        overlap["mean"].as_f64().unwrap() < 3.0 * expected,
        "uniform routing overlaps little: {overlap}"
    );
    assert!(report["expert_bytes"].as_u64().unwrap() > 0);
    let (_, skewed) = synth(tmp.path(), "skewed");
    assert!(skewed["routing_overlap"]["mean"].as_f64().unwrap() > overlap["mean"].as_f64().unwrap());

    let store = tmp.path().join("store");
    let packed = ok_json(&["pack", "--model", s(&model), "--out", s(&store), "--json"]);
    assert_eq!(packed["experts"], 3 * 16);
    assert_eq!(ok_json(&["verify", s(&store), "--json"])["bad"], serde_json::json!([]));
    // Packing again into a finished store is refused, not redone.
    assert!(fails(&["pack", "--model", s(&model), "--out", s(&store)]).contains("already holds a complete store"));

    let ids = "5,17,42,99,3";
    let in_ram = ok_json(&[
        "run",
        "--model",
        s(&model),
        "--ids",
        ids,
        "--max-new",
        "6",
        "--ignore-eos",
        "--json",
    ]);
    assert!(
        in_ram["stats"].get("expert_bytes_read").is_none(),
        "in-RAM runs report no expert I/O"
    );
    let arms: Vec<Vec<&str>> = vec![
        vec!["--model", s(&store)],
        vec!["--model", s(&store), "--ram-budget", "0", "--io", "pread"],
        vec!["--model", s(&store), "--ram-budget", "64KiB", "--io", "uring", "--no-direct"],
        vec!["--model", s(&model), "--ram-budget", "0", "--io", "mmap"],
        vec!["--model", s(&model), "--ram-budget", "100KiB"],
    ];
    for arm in &arms {
        let mut args = vec!["run", "--ids", ids, "--max-new", "6", "--ignore-eos", "--json"];
        args.extend(arm);
        let got = ok_json(&args);
        assert_eq!(got["ids"], in_ram["ids"], "{arm:?}");
        for key in [
            "expert_bytes_read",
            "expert_reads",
            "cache_hits",
            "cache_misses",
            "io_wait_s",
            "hit_rate",
            "layers",
        ] {
            assert!(got["stats"].get(key).is_some(), "{arm:?}: stats.{key} missing");
        }
        let mut fwd = vec!["forward", "--ids", ids, "--json"];
        fwd.extend(arm);
        let streamed = ok_json(&fwd);
        let reference = ok_json(&["forward", "--model", s(&model), "--ids", ids, "--json"]);
        assert_eq!(streamed, reference, "{arm:?}: forward logits are bit-identical");
    }
    assert!(fails(&["run", "--model", s(&store), "--ids", "1", "--ram-budget", "lots"]).contains("invalid size"));
    assert!(fails(&["run", "--model", s(&store), "--ids", "1", "--io", "carrier-pigeon"]).contains("unknown I/O backend"));
}

#[test]
fn bench_io_and_decode_json_have_the_documented_shape() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, _) = synth(tmp.path(), "uniform");
    let store = tmp.path().join("store");
    ok_json(&["pack", "--model", s(&model), "--out", s(&store), "--json"]);
    let io = ok_json(&[
        "bench",
        "io",
        "--store",
        s(&store),
        "--io",
        "pread,mmap",
        "--records",
        "16",
        "--no-direct",
        "--json",
    ]);
    assert!(io["limit_gbps"].as_f64().unwrap() > 0.0);
    assert_eq!(io["results"].as_array().unwrap().len(), 2);
    let out = tmp.path().join("decode.json");
    let d = ok_json(&[
        "bench",
        "decode",
        "--model",
        s(&store),
        "--ram-budget",
        "64KiB",
        "--io",
        "pread",
        "--no-direct",
        "--prompt-tokens",
        "4",
        "--new",
        "6",
        "--limit-records",
        "16",
        "--json",
        "--out",
        s(&out),
    ]);
    for key in [
        "prefill_tok_per_s",
        "time_to_first_token_s",
        "decode_tok_per_s",
        "miss_bytes_per_token",
        "hit_rate",
        "io_wait_share",
        "io_bound_tok_per_s",
        "ratio_to_io_bound",
        "routing_overlap",
        "ids_hash",
        "limit",
    ] {
        assert!(d.get(key).is_some(), "bench decode: {key} missing");
    }
    assert!(d["ratio_to_io_bound"].as_f64().unwrap() > 0.0);
    let layer = &d["per_moe_layer"];
    assert_eq!(layer["moe_layers"], d["model"]["expert_layers"]);
    assert_eq!(layer["top_k"], d["model"]["top_k"]);
    let (s_layer, tok_s) = (layer["s_per_token"].as_f64().unwrap(), d["decode_tok_per_s"].as_f64().unwrap());
    let moe_layers = layer["moe_layers"].as_f64().unwrap();
    assert!((s_layer * tok_s * moe_layers - 1.0).abs() < 1e-9, "{layer}");
    assert!(layer["io_bound_s_per_token"].as_f64().unwrap() > 0.0 && layer["ratio_to_io_bound"].as_f64().unwrap() > 0.0);
    assert_eq!(
        serde_json::from_slice::<Value>(&std::fs::read(out).unwrap()).unwrap()["ids_hash"],
        d["ids_hash"]
    );
}

/// Runs `larder pack` under a shell with a file-size limit (`ulimit -f`, in
/// 512-byte blocks); with `ignore_signal` the write fails with EFBIG instead
/// of the process being killed by SIGXFSZ (a crash).
fn pack_with_size_limit(model: &Path, store: &Path, blocks: u32, ignore_signal: bool) -> Output {
    let trap = if ignore_signal { "trap '' XFSZ; " } else { "" };
    let script = format!("{trap}ulimit -f {blocks}; exec \"$0\" pack --model \"$1\" --out \"$2\"");
    Command::new("sh")
        .args(["-c", &script, env!("CARGO_BIN_EXE_larder"), s(model), s(store)])
        .output()
        .unwrap()
}

#[test]
fn interrupted_packs_are_never_mistaken_for_stores_and_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, _) = synth(tmp.path(), "uniform");
    let store = tmp.path().join("store");
    // Layer files are 192 KiB: a 100 KiB limit stops the first one.
    let out = pack_with_size_limit(&model, &store, 200, true);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("layer-000.experts.partial"), "{err}");
    assert!(!store.join("manifest.json").exists());
    assert!(fails(&["run", "--model", s(&store), "--ids", "1"]).contains("unfinished"));
    // Killed outright (SIGXFSZ) mid-write: still no store.
    let out = pack_with_size_limit(&model, &store, 200, false);
    assert!(!out.status.success());
    assert!(!store.join("manifest.json").exists());
    assert!(fails(&["run", "--model", s(&store), "--ids", "1"]).contains("unfinished"));
    // The same command without the limit finishes the pack.
    ok_json(&["pack", "--model", s(&model), "--out", s(&store), "--json"]);
    assert_eq!(ok_json(&["verify", s(&store), "--json"])["bad"], serde_json::json!([]));
    let a = ok_json(&["run", "--model", s(&store), "--ids", "1,2,3", "--max-new", "4", "--json"]);
    let b = ok_json(&["run", "--model", s(&model), "--ids", "1,2,3", "--max-new", "4", "--json"]);
    assert_eq!(a["ids"], b["ids"]);
}

#[test]
fn full_disk_during_pack_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, _) = synth(tmp.path(), "uniform");
    let drive = tmp.path().join("small-drive");
    std::fs::create_dir_all(&drive).unwrap();
    // A real full file system: a 300 KiB tmpfs (needs mount privileges).
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=300k", "tmpfs", s(&drive)])
        .output()
        .is_ok_and(|o| o.status.success());
    if !mounted {
        eprintln!("skipping the tmpfs arm: cannot mount a tmpfs here (not root); the ulimit test covers write failures");
        return;
    }
    let store = tmp.path().join("store");
    let arg = format!("{}:1.0", s(&drive));
    let err = fails(&["pack", "--model", s(&model), "--out", s(&store), "--drive", &arg]);
    let _ = Command::new("umount").arg(s(&drive)).output();
    assert!(err.contains("No space left on device"), "{err}");
    assert!(!store.join("manifest.json").exists());
}

#[test]
fn deepseek_v3_synthetic_checkpoints_load_pack_and_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("ds");
    let report = ok_json(&["synth", "--arch", "deepseek_v3", "--preset", "tiny", "--out", s(&model), "--json"]);
    assert_eq!(report["spec"]["deepseek"]["first_k_dense_replace"], 1);
    assert!(report["routing_overlap"]["mean"].as_f64().unwrap() < 0.5);
    let config: Value = serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["model_type"], "deepseek_v3");
    let store = tmp.path().join("store");
    let packed = ok_json(&["pack", "--model", s(&model), "--out", s(&store), "--json"]);
    assert_eq!(packed["layers"], 2, "the dense first layer has no routed experts");
    let ids = "5,17,42";
    let in_ram = ok_json(&["forward", "--model", s(&model), "--ids", ids, "--json"]);
    let streamed = ok_json(&["forward", "--model", s(&store), "--ids", ids, "--ram-budget", "0", "--json"]);
    assert_eq!(in_ram, streamed);
    assert!(fails(&["synth", "--arch", "llama", "--out", s(&tmp.path().join("x"))]).contains("deepseek_v3"));
}

/// gpt-oss experts are slices of fused per-layer tensors (MXFP4: six
/// extents per expert; unquantized: four): `larder pack` makes each one
/// record, `larder verify` finds every record sound, and streamed forwards
/// (direct and packed) equal the in-RAM one bit for bit.
#[test]
fn gpt_oss_fixtures_pack_verify_and_stream() {
    for name in ["gpt_oss_tiny", "gpt_oss_bf16"] {
        let tmp = tempfile::tempdir().unwrap();
        let model = fixture(name);
        let store = tmp.path().join("store");
        let packed = ok_json(&["pack", "--model", s(&model), "--out", s(&store), "--json"]);
        assert_eq!(packed["experts"], 4 * 12, "{name}");
        assert_eq!(ok_json(&["verify", s(&store), "--json"])["bad"], serde_json::json!([]), "{name}");
        let ids = "5,17,42,99,3";
        let in_ram = ok_json(&["forward", "--model", s(&model), "--ids", ids, "--json"]);
        for m in [&store, &model] {
            let streamed = ok_json(&["forward", "--model", s(m), "--ids", ids, "--ram-budget", "0", "--json"]);
            assert_eq!(in_ram, streamed, "{name}: {}", m.display());
        }
    }
}

#[test]
fn lazy_mode_from_the_command_line_matches_the_local_run_and_names_bad_flags() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixture("qwen3_moe_tiny");
    let cache = tmp.path().join("cache");
    let ids = "5,17,42,99,3";
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--model", s(&model), "--ids", ids, "--max-new", "4", "--json"];
        args.extend_from_slice(extra);
        ok_json(&args)
    };
    let local = run(&[]);
    let lazy = run(&["--cache-dir", s(&cache)]);
    assert_eq!(lazy["ids"], local["ids"]);
    assert_eq!(lazy["stats"]["io_backend"], "lazy");
    // Again from the cache (nothing fetched), then under a quota too small.
    assert_eq!(run(&["--cache-dir", s(&cache)])["ids"], local["ids"]);
    let err = fails(&[
        "run",
        "--model",
        s(&model),
        "--ids",
        ids,
        "--cache-dir",
        s(&cache),
        "--disk-quota",
        "1KiB",
    ]);
    assert!(err.contains("--disk-quota") && err.contains("spine"), "{err}");
    // --disk-quota needs --cache-dir; the cache is not a plain --model.
    assert!(fails(&["run", "--model", s(&model), "--ids", ids, "--disk-quota", "1GiB"]).contains("--cache-dir"));
    assert!(fails(&["run", "--model", s(&cache), "--ids", ids]).contains("lazy cache"));
    // The cache streamed every file; a folder publishes no sha256, and verify says so, offline.
    let v = ok_json(&["verify", s(&cache), "--json"]);
    assert_eq!(
        (v["ok"].as_bool(), v["lazy"].as_bool(), v["source_check"].as_str()),
        (Some(true), Some(true), Some("stream")),
        "{v}"
    );
    assert_eq!(v["present"], v["records"], "{v}");
    assert!(v["unverified_files"][0].as_str().unwrap().contains("no sha256"), "{v}");
    // The check is fixed when the cache is made.
    let err = fails(&[
        "run",
        "--model",
        s(&model),
        "--ids",
        ids,
        "--cache-dir",
        s(&cache),
        "--source-check",
        "first-fetch",
    ]);
    assert!(err.contains("--source-check stream"), "{err}");
}
