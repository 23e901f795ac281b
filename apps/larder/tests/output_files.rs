//! Black-box tests of output files (`--trace FILE`, `--out FILE`): they never
//! replace an input of the run (a file of the model, also through a hard
//! link or a symlink), a FIFO or device node, or an existing file of another
//! kind, and replace one of their own kind only with `--overwrite`
//! (`larder_engine::OutputFile`). Every model here is a copy of a fixture in a
//! temporary folder: a regression overwrites the copy, never the fixture.
//! Nothing points at /dev/null itself (as root, a regression would replace
//! it): device nodes are made in the temporary folder.

mod common;

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::fixture;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs larder, killed after two minutes (a regression may block opening a
/// FIFO, or serve forever).
fn larder(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_larder"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// Expects larder to refuse `args` cleanly, saying each of `wants`.
fn refused(args: &[&str], wants: &[&str]) {
    let out = larder(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "larder {args:?} should be refused");
    assert!(!err.contains("panicked"), "larder {args:?} panicked: {err}");
    for want in wants {
        assert!(err.contains(want), "larder {args:?}: the error lacks {want:?}: {err}");
    }
}

/// Expects larder to succeed.
fn succeeds(args: &[&str]) {
    let out = larder(args);
    assert!(
        out.status.success(),
        "larder {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A copy of the fixture `name` in `dir`.
fn copy_fixture(name: &str, dir: &Path) -> PathBuf {
    let model = dir.join(name);
    std::fs::create_dir(&model).unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), model.join(entry.file_name())).unwrap();
    }
    model
}

/// `larder run` on `model` recording `new` tokens' routes to `trace`.
fn run_args<'a>(model: &'a Path, trace: &'a Path, new: &'a str) -> Vec<&'a str> {
    vec![
        "run",
        "--model",
        s(model),
        "--ids",
        "1,200,31",
        "--max-new",
        new,
        "--ignore-eos",
        "--json",
        "--trace",
        s(trace),
    ]
}

/// Tokens in the trace at `path` (`trace stats`).
fn trace_tokens(path: &Path) -> u64 {
    let out = larder(&["trace", "stats", s(path), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["all"]["tokens"].as_u64().unwrap()
}

/// A FIFO at `path`.
fn mkfifo(path: &Path) {
    assert!(Command::new("mkfifo").arg(path).status().unwrap().success());
}

/// A character device like /dev/null at `path`, where this user may make one.
fn mknod_null(path: &Path) -> bool {
    Command::new("mknod")
        .args([s(path), "c", "1", "3"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|st| st.success())
}

fn is_fifo(path: &Path) -> bool {
    std::fs::symlink_metadata(path).unwrap().file_type().is_fifo()
}

#[test]
fn trace_never_replaces_a_file_of_the_model() {
    let tmp = tempfile::tempdir().unwrap();
    let model = copy_fixture("qwen3_moe_tiny", tmp.path());
    let weights = model.join("model.safetensors");
    let before = std::fs::read(&weights).unwrap();
    let hard = tmp.path().join("hard-link.jsonl");
    std::fs::hard_link(&weights, &hard).unwrap();
    let soft = tmp.path().join("symlink.jsonl");
    std::os::unix::fs::symlink(&weights, &soft).unwrap();
    for (target, overwrite) in [
        (weights.clone(), false),
        (weights.clone(), true),
        (model.join("config.json"), true),
        (hard.clone(), true),
        (soft.clone(), true),
    ] {
        let mut args = run_args(&model, &target, "2");
        if overwrite {
            args.push("--overwrite");
        }
        refused(&args, &["--trace", s(&target), "an input of this run"]);
        assert_eq!(
            std::fs::read(&weights).unwrap(),
            before,
            "--trace {}: the weights changed",
            target.display()
        );
    }
    assert!(std::fs::symlink_metadata(&soft).unwrap().file_type().is_symlink());
    // Not even a new file inside the model's folder.
    let inside = model.join("run.jsonl");
    refused(&run_args(&model, &inside, "2"), &["is inside --model"]);
    assert!(!inside.exists());
    // `trace synth --out` and `serve --trace` refuse it too, before loading anything.
    refused(
        &[
            "trace",
            "synth",
            "--model",
            s(&model),
            "--routing",
            "uniform",
            "--tokens",
            "4",
            "--out",
            s(&weights),
        ],
        &["--out", "an input of this run"],
    );
    refused(
        &["serve", "--model", s(&model), "--port", "0", "--trace", s(&hard)],
        &["--trace", "an input of this run"],
    );
    assert_eq!(std::fs::read(&weights).unwrap(), before);
}

#[test]
fn trace_never_replaces_a_fifo_or_a_device() {
    let tmp = tempfile::tempdir().unwrap();
    let model = copy_fixture("qwen3_moe_tiny", tmp.path());
    let fifo = tmp.path().join("fifo");
    mkfifo(&fifo);
    let to_fifo = tmp.path().join("to-fifo");
    std::os::unix::fs::symlink(&fifo, &to_fifo).unwrap();
    for target in [&fifo, &to_fifo] {
        let mut args = run_args(&model, target, "2");
        args.push("--overwrite");
        refused(&args, &["--trace", "a FIFO", "regular files"]);
        assert!(is_fifo(&fifo), "the FIFO was replaced");
    }
    let device = tmp.path().join("null");
    if mknod_null(&device) {
        refused(&run_args(&model, &device, "2"), &["--trace", "a character device"]);
        assert!(std::fs::symlink_metadata(&device).unwrap().file_type().is_char_device());
    }
    let folder = tmp.path().join("folder");
    std::fs::create_dir(&folder).unwrap();
    refused(&run_args(&model, &folder, "2"), &["a folder"]);
    let dangling = tmp.path().join("dangling");
    std::os::unix::fs::symlink(tmp.path().join("nothing"), &dangling).unwrap();
    refused(&run_args(&model, &dangling, "2"), &["a symlink to nothing"]);
    assert!(!tmp.path().join("nothing").exists());
}

#[test]
fn trace_replaces_an_existing_trace_only_with_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixture("qwen3_moe_tiny");
    // A new path works as before.
    let trace = tmp.path().join("t.jsonl");
    succeeds(&run_args(&model, &trace, "2"));
    assert_eq!(trace_tokens(&trace), 3 + 1);
    // An existing trace: refused without --overwrite (unchanged), replaced with it.
    let before = std::fs::read(&trace).unwrap();
    refused(
        &run_args(&model, &trace, "4"),
        &["--trace", s(&trace), "already holds a route trace", "--overwrite"],
    );
    assert_eq!(std::fs::read(&trace).unwrap(), before);
    let mut args = run_args(&model, &trace, "4");
    args.push("--overwrite");
    succeeds(&args);
    assert_eq!(trace_tokens(&trace), 3 + 3);
    assert!(!tmp.path().join("t.jsonl.partial").exists());
    // A file of another kind is never replaced, --overwrite or not.
    let notes = tmp.path().join("notes.txt");
    std::fs::write(&notes, "my notes\n").unwrap();
    let mut args = run_args(&model, &notes, "2");
    args.push("--overwrite");
    refused(&args, &["--trace", "is not a route trace"]);
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "my notes\n");
    // An empty file holds nothing to lose: written without --overwrite.
    let empty = tmp.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    succeeds(&run_args(&model, &empty, "2"));
    assert_eq!(trace_tokens(&empty), 4);
}

/// `bench kernels --quick` writing its report to `out`, plus `extra`.
fn kernels_args<'a>(out: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "bench",
        "kernels",
        "--quick",
        "--no-candle",
        "--formats",
        "f32",
        "--rows",
        "1",
        "--out",
        s(out),
    ];
    args.extend_from_slice(extra);
    args
}

#[test]
fn bench_out_follows_the_same_rules() {
    let tmp = tempfile::tempdir().unwrap();
    // A new path works; the report names its kind.
    let report = tmp.path().join("kernels.json");
    succeeds(&kernels_args(&report, &[]));
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(doc["larder_report"], "bench kernels", "{doc}");
    assert!(doc["ram_gbps"].as_f64().unwrap() > 0.0);
    // The same report again: only with --overwrite.
    let before = std::fs::read(&report).unwrap();
    refused(
        &kernels_args(&report, &[]),
        &["--out", "already holds a `larder bench kernels` report", "--overwrite"],
    );
    assert_eq!(std::fs::read(&report).unwrap(), before);
    succeeds(&kernels_args(&report, &["--overwrite"]));
    // A report written before reports named their kind is recognized by its keys.
    std::fs::write(&report, r#"{"ram_gbps": 1.0, "path": "scalar", "threads": 1, "results": []}"#).unwrap();
    succeeds(&kernels_args(&report, &["--overwrite"]));
    // Other JSON, another command's report, a trace, text: never replaced.
    let trace = tmp.path().join("t.jsonl");
    succeeds(&run_args(&fixture("qwen3_moe_tiny"), &trace, "2"));
    let io_report = tmp.path().join("io.json");
    std::fs::write(
        &io_report,
        r#"{"larder_report": "bench io", "store": "s", "limit_gbps": 1, "results": []}"#,
    )
    .unwrap();
    let other = tmp.path().join("other.json");
    std::fs::write(&other, r#"{"name": "mine"}"#).unwrap();
    for file in [&trace, &io_report, &other] {
        let before = std::fs::read(file).unwrap();
        refused(
            &kernels_args(file, &["--overwrite"]),
            &["--out", s(file), "is not a `larder bench kernels` report"],
        );
        assert_eq!(std::fs::read(file).unwrap(), before);
    }
    // A FIFO is never opened.
    let fifo = tmp.path().join("fifo");
    mkfifo(&fifo);
    refused(&kernels_args(&fifo, &["--overwrite"]), &["--out", "a FIFO"]);
    assert!(is_fifo(&fifo));
    let device = tmp.path().join("null");
    if mknod_null(&device) {
        refused(&kernels_args(&device, &["--overwrite"]), &["--out", "a character device"]);
    }

    // A file of the model, directly or through a hard link: refused before any measurement.
    let model = copy_fixture("qwen3_moe_tiny", tmp.path());
    let weights = model.join("model.safetensors");
    let before = std::fs::read(&weights).unwrap();
    let hard = tmp.path().join("weights-link.json");
    std::fs::hard_link(&weights, &hard).unwrap();
    for target in [&weights, &hard] {
        let io = [
            "bench",
            "io",
            "--store",
            s(&model),
            "--io",
            "pread",
            "--no-direct",
            "--records",
            "2",
        ];
        refused(
            &[&io[..], &["--out", s(target), "--overwrite"]].concat(),
            &["--out", "an input of this run"],
        );
        let decode = ["bench", "decode", "--model", s(&model), "--ram-budget", "100KiB", "--new", "2"];
        refused(
            &[&decode[..], &["--out", s(target), "--overwrite"]].concat(),
            &["--out", "an input of this run"],
        );
        refused(
            &[&decode[..], &["--trace", s(target), "--overwrite"]].concat(),
            &["--trace", "an input of this run"],
        );
        assert_eq!(std::fs::read(&weights).unwrap(), before);
    }
    // Two outputs of one run are never the same file.
    let both = tmp.path().join("both.json");
    let decode = ["bench", "decode", "--model", s(&model), "--ram-budget", "100KiB", "--new", "2"];
    refused(
        &[&decode[..], &["--trace", s(&both), "--out", s(&both)]].concat(),
        &["--out", "is --trace", "another output of this run"],
    );
}

#[test]
fn trace_never_replaces_a_layer_file_of_a_store_on_another_drive() {
    let tmp = tempfile::tempdir().unwrap();
    let (drive, store) = (tmp.path().join("drive"), tmp.path().join("store"));
    std::fs::create_dir(&drive).unwrap();
    let fixture = fixture("qwen3_moe_tiny");
    succeeds(&["pack", "--model", s(&fixture), "--out", s(&store), "--drive", s(&drive), "--json"]);
    let layers = std::fs::read_dir(&drive).unwrap().next().unwrap().unwrap().path();
    let layer_file = std::fs::read_dir(&layers).unwrap().next().unwrap().unwrap().path();
    let before = std::fs::read(&layer_file).unwrap();
    let hard = tmp.path().join("layer-link.jsonl");
    std::fs::hard_link(&layer_file, &hard).unwrap();
    for target in [&layer_file, &hard, &layers.join("new.jsonl"), &store.join("manifest.json")] {
        let mut args = run_args(&store, target, "2");
        args.push("--overwrite");
        refused(&args, &["--trace", "an input of this run"]);
        assert_eq!(std::fs::read(&layer_file).unwrap(), before);
    }
    assert!(!layers.join("new.jsonl").exists());
    succeeds(&["verify", s(&store)]);
    // Beside the layer folder, on the same drive, is fine.
    succeeds(&run_args(&store, &drive.join("run.jsonl"), "2"));
}
