//! Helpers shared by larder-engine's integration tests: where the fixture
//! and SmolLM2 checkpoints are, scratch folders, packing a store, the
//! streaming load options the store tests use, and the check that streamed
//! experts (direct and packed, every backend and budget) equal experts in RAM.

// Each test file uses its own subset.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use larder_engine::{Engine, ExpertMode, GenerateOptions, LoadOptions};
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
        ..Default::default()
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

/// What a streaming arm must reproduce bit for bit.
pub struct StreamOutcome {
    pub logits: Vec<f32>,
    pub greedy: Vec<u32>,
}

/// The logits of every position of `prompt` (its ids modulo the model's
/// vocabulary) and 6 greedy ids.
pub fn stream_outcome(engine: &Engine, prompt: &[u32]) -> StreamOutcome {
    let vocab = engine.model().spec().vocab_size as u32;
    let prompt: Vec<u32> = prompt.iter().map(|&t| t % vocab).collect();
    let logits = engine.forward(&prompt).unwrap().into_vec();
    let opts = GenerateOptions {
        max_new: 6,
        stop_at_eos: false,
        ..GenerateOptions::default()
    };
    let g = engine.generate(&prompt, &opts, &mut |_| true).unwrap();
    StreamOutcome { logits, greedy: g.ids }
}

fn kinds() -> Vec<IoKind> {
    let mut k = vec![IoKind::Pread, IoKind::Mmap];
    if IoKind::best() == IoKind::Uring {
        k.push(IoKind::Uring);
    } else {
        eprintln!("io_uring unavailable here: uring arm skipped");
    }
    k
}

/// Budgets: nothing fits, a few experts fit, everything fits.
fn budgets(expert_bytes: u64) -> [u64; 3] {
    [0, 3 * (expert_bytes + 8192), u64::MAX]
}

/// Every backend (direct and buffered), budget and prefetch setting loading
/// `model` streamed gives `reference`, within its cache budget.
pub fn check_all_arms(model: &Path, prompt: &[u32], reference: &StreamOutcome, expert_bytes: u64, label: &str) {
    for kind in kinds() {
        for direct in [true, false] {
            if kind == IoKind::Mmap && direct {
                continue;
            }
            for (budget, prefetch_threads) in budgets(expert_bytes).into_iter().flat_map(|b| [(b, 0), (b, 2)]) {
                let opts = LoadOptions {
                    experts: ExpertMode::Stream(StoreOptions {
                        io: IoOptions { kind, direct, depth: 3 },
                        ram_budget: budget,
                        verify: true,
                        prefetch_threads,
                    }),
                    ..Default::default()
                };
                let engine = Engine::load_with(model, &opts).unwrap();
                let got = stream_outcome(&engine, prompt);
                let arm = format!(
                    "{label} {} direct={direct} budget={budget} prefetch={prefetch_threads}",
                    kind.name()
                );
                assert!(
                    got.logits.iter().zip(&reference.logits).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{arm}: logits differ from the in-RAM path"
                );
                assert_eq!(got.greedy, reference.greedy, "{arm}: greedy ids");
                let store = engine.store().unwrap();
                let used = store.cache().counts();
                assert!(used.peak_bytes <= budget, "{arm}: cache peak {} over budget", used.peak_bytes);
                let s = store.stats();
                assert!(s.reads > 0, "{arm}: experts were read");
                if budget == 0 && kind != IoKind::Mmap && prefetch_threads == 0 {
                    assert_eq!(s.hits, 0, "{arm}: nothing can be cached");
                }
            }
        }
    }
}

/// An expert's bytes, plus two pages of read alignment per three extents
/// beyond the first three (compressed-tensors experts ship in up to 9
/// small tensors, each read into its own aligned buffer when direct).
pub fn expert_bytes(model: &Path) -> u64 {
    let src = larder_engine::pack::pack_source(model).unwrap();
    let extents = &src.layers[0].experts[0];
    extents.iter().map(|x| x.len).sum::<u64>() + 8192 * (extents.len().div_ceil(3) as u64 - 1)
}

/// Direct streaming, and packed stores on 1 to `max_drives` drives, in
/// every backend and budget, against experts in RAM, for fixture `name`.
pub fn check_direct_and_packed(name: &str, prompt: &[u32], max_drives: usize) {
    let model = fixture(name);
    let reference = stream_outcome(&Engine::load(&model).unwrap(), prompt);
    let eb = expert_bytes(&model);
    check_all_arms(&model, prompt, &reference, eb, &format!("{name} direct"));

    for drives in 1..=max_drives {
        let out = scratch_dir(&format!("streaming-{name}-{drives}"));
        let store = out.join("store");
        let specs = if drives == 1 {
            Vec::new()
        } else {
            drive_dirs(&out, drives, |d| 1.0 + d as f64)
        };
        let report = pack_store(&model, &store, &specs);
        assert_eq!(report.resumed_layers, 0);
        // The store loads on its own (default: everything cached) ...
        let packed = stream_outcome(&Engine::load(&store).unwrap(), prompt);
        assert_eq!(packed.greedy, reference.greedy, "{name}: packed store, default load");
        // ... and every backend and budget matches.
        check_all_arms(&store, prompt, &reference, eb, &format!("{name} packed on {drives} drive(s)"));
        let _ = std::fs::remove_dir_all(&out);
    }
}
