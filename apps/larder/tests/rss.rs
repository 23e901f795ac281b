//! Peak RSS under `--ram-budget`, for every I/O backend: a synthetic model
//! whose routed experts are many times the budget (and top-k = every expert,
//! so each token reads all of them) must stay within
//! budget + spine + one layer's reads in flight + the buffer pool + a fixed
//! process baseline (docs/store.md, "Memory under --ram-budget").

use std::path::Path;

use larder_store::io::IoKind;
use larder_store::{align_up, POOL_BUFFERS, POOL_BYTES};

mod common;

const MIB: u64 = 1 << 20;
/// The process without a model: binary, allocator, runtime, tokenizer-less
/// engine, KV cache and activations of a short run.
const BASELINE: u64 = 128 * MIB;
const EXPERTS_PER_LAYER: u64 = 8;

/// (spine bytes, largest expert record bytes, all expert bytes) of a checkpoint.
fn sizes(model: &Path) -> (u64, u64, u64) {
    let (mut spine, mut experts) = (0u64, 0u64);
    let mut per_expert = std::collections::HashMap::<String, u64>::new();
    for e in std::fs::read_dir(model).unwrap().flatten() {
        if !e.path().to_string_lossy().ends_with(".safetensors") {
            continue;
        }
        let bytes = std::fs::read(e.path()).unwrap();
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        for (name, info) in meta.tensors() {
            let len = (info.data_offsets.1 - info.data_offsets.0) as u64;
            match name.split_once(".experts.") {
                Some((layer, rest)) => {
                    experts += len;
                    let id = rest.split('.').next().unwrap_or("");
                    *per_expert.entry(format!("{layer}/{id}")).or_default() += len;
                }
                None => spine += len,
            }
        }
    }
    (spine, per_expert.values().copied().max().unwrap_or(0), experts)
}

#[test]
fn peak_rss_stays_within_budget_spine_and_pools_for_every_backend() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("k3mini");
    let m = model.to_str().unwrap();
    let out = common::larder(&[
        "synth",
        "--preset",
        "k3-mini",
        "--experts",
        "8",
        "--top-k",
        "8",
        "--layers",
        "8",
        "--vocab",
        "1000",
        "--measure-tokens",
        "0",
        "--out",
        m,
    ]);
    assert!(out.status.success(), "synth: {}", String::from_utf8_lossy(&out.stderr));
    let (spine, record, experts) = sizes(&model);
    let budget = 40 * MIB;
    let record = align_up(record);
    let in_flight = EXPERTS_PER_LAYER * record;
    let pool = (POOL_BYTES as u64).min(POOL_BUFFERS as u64 * record);
    let bound = budget + spine + in_flight + pool + BASELINE;
    // Keeping every expert would be far over the bound: the test can tell.
    assert!(
        spine + experts > bound + 256 * MIB,
        "experts {experts} too small against bound {bound}"
    );
    for io in ["pread", "uring", "mmap"] {
        if io == "uring" && IoKind::best() != IoKind::Uring {
            eprintln!("io_uring unavailable here: uring arm skipped");
            continue;
        }
        let v = common::ok_json(&[
            "run",
            "--model",
            m,
            "--ids",
            "1,2,3",
            "--max-new",
            "3",
            "--ram-budget",
            "40MiB",
            "--io",
            io,
            "--no-direct",
            "--prefetch",
            "0",
            "--json",
        ]);
        let s = &v["stats"];
        let peak = s["peak_rss_bytes"].as_u64().unwrap();
        let read = s["expert_bytes_read"].as_u64().unwrap();
        assert!(
            read >= 2 * experts,
            "{io}: every expert streams through the budget ({read} bytes read)"
        );
        eprintln!(
            "{io}: peak RSS {} MiB; bound {} MiB = budget {} + spine {} + in flight {} + pool {} + baseline {}; experts {} MiB",
            peak / MIB,
            bound / MIB,
            budget / MIB,
            spine / MIB,
            in_flight / MIB,
            pool / MIB,
            BASELINE / MIB,
            experts / MIB
        );
        assert!(peak > 0, "{io}: peak_rss_bytes is reported");
        assert!(peak <= bound, "{io}: peak RSS {peak} over the bound {bound}");
    }
}
