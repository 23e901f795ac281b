//! Streaming experts changes when bytes arrive, never what is computed:
//! logits and greedy ids are bit-identical between the in-RAM path, direct
//! streaming from safetensors and packed stores on 1, 2 and 3 drives, for
//! every I/O backend, with a cache too small to hold one expert, one that
//! holds a few (eviction under pressure), and one that holds everything,
//! with and without prefetching of predicted experts.

use std::path::{Path, PathBuf};

use larder_engine::{Engine, ExpertMode, GenerateOptions, LoadOptions};
use larder_store::{IoKind, IoOptions, StoreOptions};

mod common;
use common::{drive_dirs, fixture, pack_store, scratch_dir};

fn temp(name: &str) -> PathBuf {
    scratch_dir(&format!("streaming-{name}"))
}

const PROMPT: &[u32] = &[262, 406, 39, 423, 313, 87, 465, 12, 99, 7];

struct Outcome {
    logits: Vec<f32>,
    greedy: Vec<u32>,
}

fn outcome(engine: &Engine) -> Outcome {
    let logits = engine.forward(PROMPT).unwrap().into_vec();
    let opts = GenerateOptions {
        max_new: 6,
        stop_at_eos: false,
        ..GenerateOptions::default()
    };
    let g = engine.generate(PROMPT, &opts, &mut |_| true).unwrap();
    Outcome { logits, greedy: g.ids }
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

fn check_all_arms(model: &Path, reference: &Outcome, expert_bytes: u64, label: &str) {
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
                };
                let engine = Engine::load_with(model, &opts).unwrap();
                let got = outcome(&engine);
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
fn expert_bytes(model: &Path) -> u64 {
    let src = larder_engine::pack::pack_source(model).unwrap();
    let extents = &src.layers[0].experts[0];
    extents.iter().map(|x| x.len).sum::<u64>() + 8192 * (extents.len().div_ceil(3) as u64 - 1)
}

#[test]
fn direct_and_packed_streaming_are_bit_identical_to_in_ram() {
    for name in [
        "qwen3_moe_tiny",
        "qwen2_moe_tiny",
        "mixtral_tiny",
        "deepseek_v3_tiny",
        "kimi_k2_tiny",
        "deepseek_v3_fp8",
        // compressed-tensors 4-bit experts: packed + scale (+ weight_shape) per projection.
        "deepseek_v3_int4",
        "deepseek_v3_mxfp4",
    ] {
        check_direct_and_packed(name);
    }
}

/// gpt-oss: each expert is slice `[e]` of per-layer fused tensors (MXFP4:
/// six extents, blocks, scales and bias of gate_up and down; unquantized:
/// four, input-major weights transposed when the expert is built).
#[test]
fn gpt_oss_streaming_is_bit_identical_to_in_ram() {
    check_direct_and_packed("gpt_oss_tiny");
    check_direct_and_packed("gpt_oss_bf16");
}

/// Direct streaming, and packed stores on 1 to 3 drives, in every backend
/// and budget, against experts in RAM.
fn check_direct_and_packed(name: &str) {
    let model = fixture(name);
    let reference = outcome(&Engine::load(&model).unwrap());
    let eb = expert_bytes(&model);
    check_all_arms(&model, &reference, eb, &format!("{name} direct"));

    for drives in 1..=3usize {
        let out = temp(&format!("{name}-{drives}"));
        let store = out.join("store");
        let specs = if drives == 1 {
            Vec::new()
        } else {
            drive_dirs(&out, drives, |d| 1.0 + d as f64)
        };
        let report = pack_store(&model, &store, &specs);
        assert_eq!(report.resumed_layers, 0);
        // The store loads on its own (default: everything cached) ...
        let packed = outcome(&Engine::load(&store).unwrap());
        assert_eq!(packed.greedy, reference.greedy, "{name}: packed store, default load");
        // ... and every backend and budget matches.
        check_all_arms(&store, &reference, eb, &format!("{name} packed on {drives} drive(s)"));
        let _ = std::fs::remove_dir_all(&out);
    }
}
