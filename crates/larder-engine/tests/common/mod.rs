//! Helpers shared by larder-engine's integration tests: where the fixture
//! and SmolLM2 checkpoints are, scratch folders, packing a store, and the
//! streaming load options the store tests use.

// Each test file uses its own subset.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use larder_engine::{ExpertMode, LoadOptions};
use larder_store::pack::{pack, DriveSpec, PackReport};
use larder_store::{IoKind, IoOptions, StoreOptions};

/// The fixture checkpoint `name` (a folder under the repository's `fixtures/`).
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

/// An empty scratch folder `larder-<name>-<pid>` under the temp dir (emptied
/// first if a previous run left it).
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("larder-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `count` drive folders `root/ssd<d>` (created), drive `d` rated at
/// `gbps(d)` GB/s for placement.
pub fn drive_dirs(root: &Path, count: usize, gbps: impl Fn(usize) -> f64) -> Vec<DriveSpec> {
    (0..count)
        .map(|d| {
            let dir = root.join(format!("ssd{d}"));
            std::fs::create_dir_all(&dir).unwrap();
            DriveSpec { dir, gbps: Some(gbps(d)) }
        })
        .collect()
}

/// Packs the checkpoint `model` into a store at `store`, its layer files on
/// `drives` (none: in the store folder).
pub fn pack_store(model: &Path, store: &Path, drives: &[DriveSpec]) -> PackReport {
    let src = larder_engine::pack::pack_source(model).unwrap();
    pack(&src, store, drives, &mut |_| {}).unwrap()
}

/// Experts streamed with pread (no O_DIRECT), `depth` reads in flight, a RAM
/// cache of `ram_budget` bytes, digests checked when `verify`, no prefetch.
pub fn pread_streaming(depth: usize, ram_budget: u64, verify: bool) -> LoadOptions {
    LoadOptions {
        experts: ExpertMode::Stream(StoreOptions {
            io: IoOptions {
                kind: IoKind::Pread,
                direct: false,
                depth,
            },
            ram_budget,
            verify,
            prefetch_threads: 0,
        }),
    }
}

/// The SmolLM2-135M-Instruct checkpoint: `$LARDER_SMOLLM2`, else
/// `${LARDER_CACHE:-~/.cache/larder}/smollm2/checkpoint` when it exists
/// (made by `larder demo` or `scripts/fetch_smollm2.sh`).
pub fn smollm2_checkpoint() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("LARDER_SMOLLM2") {
        return Some(PathBuf::from(p));
    }
    let cache = std::env::var("LARDER_CACHE")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|h| Path::new(&h).join(".cache/larder")))
        .ok()?;
    let p = cache.join("smollm2/checkpoint");
    p.join("config.json").exists().then_some(p)
}
