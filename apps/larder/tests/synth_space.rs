//! `larder synth` never leaves a half-written checkpoint: a checkpoint
//! larger than the free space is refused before a byte is written, files an
//! interrupted synth left (stale shards of another shape, `.partial` files)
//! are removed by the next synth into the same folder, and a synth that
//! fails part way removes what it wrote.

use std::path::Path;

mod common;

use common::{fails, ok_json};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(dir)
        .map(|r| r.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    n.sort();
    n
}

/// Free bytes on the file system holding `dir`.
fn free_bytes(dir: &Path) -> u64 {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path and `st` a writable statvfs.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st.f_bavail as u64 * st.f_frsize as u64
}

#[test]
fn a_checkpoint_larger_than_the_free_space_is_refused_before_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("huge");
    // Twice the free space, in k3-mini layers of about 1 GiB (at most 4096 of them).
    let gib = (2 * free_bytes(tmp.path())).div_ceil(1 << 30);
    if gib > 4000 {
        eprintln!("skipped: {gib} GiB would not fit in k3-mini's 4096 layers");
        return;
    }
    let gib = gib.to_string();
    let e = fails(&[
        "synth",
        "--arch",
        "qwen3_moe",
        "--preset",
        "k3-mini",
        "--experts-gib",
        &gib,
        "--out",
        s(&out),
    ]);
    assert!(e.contains("--out") && e.contains("free"), "{e}");
    assert!(names(&out).is_empty(), "nothing written: {:?}", names(&out));
}

#[test]
fn leftovers_of_an_interrupted_synth_are_removed_and_a_failed_synth_removes_its_files() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("model");
    std::fs::create_dir_all(&out).unwrap();
    // What a killed synth of another shape leaves: shards, a .partial.
    for f in [
        "model-00001-of-00009.safetensors",
        "model-00007-of-00009.safetensors",
        "config.json.partial",
    ] {
        std::fs::write(out.join(f), b"stale").unwrap();
    }
    std::fs::write(out.join("notes.txt"), b"mine").unwrap();
    let report = ok_json(&["synth", "--arch", "qwen3_moe", "--seed", "3", "--out", s(&out), "--json"]);
    let shards = report["files"].as_u64().unwrap() as usize;
    let left = names(&out);
    assert!(!left.iter().any(|n| n.contains("-of-00009") || n.ends_with(".partial")), "{left:?}");
    assert!(left.contains(&"notes.txt".to_string()), "a file synth did not make stays: {left:?}");
    assert_eq!(left.iter().filter(|n| n.ends_with(".safetensors")).count(), shards);

    // A synth that cannot write its second shard removes the first.
    let again = tmp.path().join("blocked");
    let first = ok_json(&[
        "synth",
        "--arch",
        "qwen3_moe",
        "--seed",
        "3",
        "--out",
        s(&tmp.path().join("probe")),
        "--json",
    ]);
    let n = first["files"].as_u64().unwrap();
    std::fs::create_dir_all(again.join(format!("model-00002-of-{n:05}.safetensors.partial"))).unwrap();
    let e = fails(&["synth", "--arch", "qwen3_moe", "--seed", "3", "--out", s(&again)]);
    assert!(e.contains("cannot write"), "{e}");
    let left = names(&again);
    assert_eq!(
        left,
        vec![format!("model-00002-of-{n:05}.safetensors.partial")],
        "only the blocker is left"
    );
}
