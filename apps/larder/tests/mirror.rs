//! Black-box tests of mirrored hot experts: a store packed over two drives,
//! run once for heat, then `larder mirror` copies the hottest experts onto
//! the faster drive. Reads of mirrored records go to the copy that finishes
//! first (bytes per drive in the stats move), the output is unchanged,
//! `verify` checks the copies, a damaged copy is read from its primary
//! instead (and named), a damaged mirrors.json is refused, and `--size 0`
//! removes them.

use std::path::Path;

mod common;

use common::{fails, fixture, ok_json};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A short greedy run streaming through a tiny cache, one read at a time.
fn run_args(store: &Path) -> Vec<&str> {
    let mut args = vec!["run", "--model", s(store), "--ids", "1,200,31,7", "--max-new", "8", "--ignore-eos"];
    args.extend(["--ram-budget", "64KiB", "--io", "pread", "--prefetch", "0"]);
    args
}

fn run(store: &Path) -> serde_json::Value {
    let mut args = run_args(store);
    args.extend(["--stats", "--json"]);
    ok_json(&args)
}

fn drive_bytes(out: &serde_json::Value) -> Vec<u64> {
    out["stats"]["drive_bytes"]
        .as_array()
        .unwrap_or_else(|| panic!("no drive_bytes: {out}"))
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

#[test]
fn hot_experts_mirrored_onto_the_fast_drive_are_read_there_with_the_same_output() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, slow, fast) = (tmp.path().join("store"), tmp.path().join("slow"), tmp.path().join("fast"));
    std::fs::create_dir_all(&slow).unwrap();
    std::fs::create_dir_all(&fast).unwrap();
    let model = fixture("qwen3_moe_tiny");
    let (slow_arg, fast_arg) = (format!("{}:1", s(&slow)), format!("{}:3", s(&fast)));
    let e = fails(&["pack", "--model", s(&model), "--out", s(&store), "--mirror-hot", "1MiB"]);
    assert!(e.contains("no heat"), "{e}");
    assert!(!store.join("manifest.json").exists(), "refused before packing");
    ok_json(&[
        "pack",
        "--model",
        s(&model),
        "--out",
        s(&store),
        "--drive",
        &slow_arg,
        "--drive",
        &fast_arg,
        "--json",
    ]);
    let e = fails(&["mirror", s(&store), "--size", "1MiB"]);
    assert!(e.contains("no heat"), "{e}");

    // The cache policy reads the store's heat, so both compared runs start from the same heat.json.
    run(&store);
    let heat = std::fs::read(store.join("heat.json")).unwrap();
    let plain = run(&store);
    std::fs::write(store.join("heat.json"), &heat).unwrap();
    let before = drive_bytes(&plain);
    assert_eq!(before.len(), 2, "{before:?}");
    assert!(before[0] > 0, "the slow drive holds a quarter of the experts: {before:?}");

    let e = fails(&["mirror", s(&store), "--size", "1MiB", "--drive", "/no/such/drive"]);
    assert!(e.contains("--drive /no/such/drive"), "{e}");
    // Room for every expert the prompt used: all of them have a copy on the fast drive.
    let m = ok_json(&["mirror", s(&store), "--size", "64MiB", "--json"]);
    let experts = m["experts"].as_u64().unwrap();
    assert!(experts > 0, "{m}");
    assert_eq!(m["chosen_by"], "reads", "runs record reads from the drives: {m}");
    let by_demand = ok_json(&["mirror", s(&store), "--size", "64MiB", "--by", "demands", "--json"]);
    assert_eq!(by_demand["chosen_by"], "demands");
    assert!(
        by_demand["experts"].as_u64().unwrap() >= experts,
        "every demanded expert is mirrored: {by_demand}"
    );
    assert!(
        m["already_on_drive"].as_u64().unwrap() > 0,
        "the fast drive's own hot records are not copied: {m}"
    );
    assert_eq!(Path::new(m["drive"].as_str().unwrap()), fast, "{m}");

    let mirrored = run(&store);
    assert_eq!(plain["ids"], mirrored["ids"], "mirrors changed the output");
    // Most reads now go to the fast copy; a layer's misses read together
    // still send some to the slow drive once the fast one has 3x its bytes in flight.
    let after = drive_bytes(&mirrored);
    assert!(
        after[0] * 2 < before[0],
        "mirrored records are read from the fast drive: {before:?} -> {after:?}"
    );
    assert!(after[1] > 0, "{after:?}");

    let v = ok_json(&["verify", s(&store), "--json"]);
    assert_eq!(v["mirrored_records"].as_u64(), by_demand["experts"].as_u64(), "{v}");
    assert_eq!(v["bad"].as_array().unwrap().len(), 0, "{v}");

    // A damaged copy: verify names it, and a run that reads it fails on its digest.
    let folder = std::fs::read_dir(&fast)
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("larder-"))
        .unwrap()
        .path();
    let copy = std::fs::read_dir(&folder)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("mirror-g"))
        .unwrap();
    let pristine = std::fs::read(&copy).unwrap();
    let mut bad = pristine.clone();
    bad[4096 + 100] ^= 0xff;
    std::fs::write(&copy, &bad).unwrap();
    let e = fails(&["verify", s(&store)]);
    assert!(e.contains("mirrored copy") && e.contains("larder mirror"), "{e}");
    // A run reads the intact primary instead, with the same output, and says so.
    let (out, err) = common::ok_with_stderr(&[&run_args(&store)[..], &["--json"]].concat());
    assert_eq!(out["ids"], plain["ids"], "{err}");
    assert!(err.contains("mirror copy is damaged") && err.contains("larder mirror"), "{err}");
    std::fs::write(&copy, &pristine).unwrap();

    // An edited mirrors.json is refused, naming the file and the fix.
    let list = store.join("mirrors.json");
    let text = std::fs::read_to_string(&list).unwrap();
    std::fs::write(&list, text.replacen("\"offset\": 4096", "\"offset\": 8192", 1)).unwrap();
    let e = fails(&["run", "--model", s(&store), "--ids", "1,2", "--max-new", "1"]);
    assert!(e.contains("mirrors.json") && e.contains("larder mirror"), "{e}");
    std::fs::write(&list, &text).unwrap();

    // Mirroring again replaces the generation; --size 0 removes everything.
    let again = ok_json(&["mirror", s(&store), "--size", "64KiB", "--json"]);
    assert!(
        again["removed_files"].as_u64().unwrap() > 0 && again["bytes"].as_u64().unwrap() <= 64 << 10,
        "{again}"
    );
    assert_eq!(run(&store)["ids"], plain["ids"]);
    let gone = ok_json(&["mirror", s(&store), "--size", "0", "--json"]);
    assert_eq!(gone["experts"], 0, "{gone}");
    assert!(!list.exists());
    assert!(!std::fs::read_dir(&folder)
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("mirror-")));
    assert_eq!(run(&store)["ids"], plain["ids"]);
}
