//! Real text from a streamed MoE: SmolLM2-135M-Instruct (a dense Llama)
//! upcycled into a Mixtral of 8 experts, top-2 (every expert a copy of the
//! dense MLP, random router, renormalised top-k weights) continues "The
//! capital of France is" greedily exactly as the dense model does (16 new
//! tokens, " Paris" among them) with experts in RAM, streamed directly from
//! the upcycled checkpoint, and streamed from a packed store, the last two
//! with a RAM budget below the expert bank.
//!
//! The checkpoint is looked up by tests/common (`$LARDER_SMOLLM2`
//! or `${LARDER_CACHE:-~/.cache/larder}/smollm2/checkpoint`); when absent the
//! test prints why it is skipped.

use std::path::PathBuf;

use larder_engine::{Engine, GenerateOptions, LoadOptions};
use larder_model::{upcycle, UpcycleLayout, UpcycleSpec};

mod common;
use common::{pack_store, pread_streaming, smollm2_checkpoint as checkpoint};

/// A scratch folder removed when dropped (also when the test fails).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const PROMPT: &str = "The capital of France is";

/// Greedy ids of 16 new tokens, and the last prompt position's logits.
fn continuation(engine: &Engine) -> (Vec<u32>, Vec<f32>) {
    let prompt = engine.encode_prompt(PROMPT).unwrap();
    let logits = engine.forward(&prompt).unwrap();
    let last = logits.row(prompt.len() - 1).to_vec();
    let opts = GenerateOptions {
        max_new: 16,
        stop_at_eos: false,
        ..GenerateOptions::default()
    };
    (engine.generate(&prompt, &opts, &mut |_| true).unwrap().ids, last)
}

fn streaming(budget: u64) -> LoadOptions {
    pread_streaming(4, budget, true)
}

#[test]
fn upcycled_smollm2_says_what_the_dense_model_says() {
    let Some(dense_dir) = checkpoint() else {
        eprintln!(
            "SKIPPED upcycled_smollm2_says_what_the_dense_model_says: no SmolLM2 checkpoint \
             (run scripts/fetch_smollm2.sh or set LARDER_SMOLLM2)"
        );
        return;
    };
    let scratch = Scratch(std::env::temp_dir().join(format!("larder-upcycled-smollm2-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&scratch.0);
    let moe = scratch.0.join("moe");
    let (want, dense_logits) = continuation(&Engine::load(&dense_dir).unwrap());
    let report = upcycle(
        &UpcycleSpec {
            source: dense_dir.clone(),
            out: moe.clone(),
            experts: 8,
            top_k: 2,
            layout: UpcycleLayout::Mixtral,
            seed: 0,
        },
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!((report.layers, report.experts), (30, 8));

    // (a) experts in RAM.
    let engine = Engine::load(&moe).unwrap();
    let (got, logits) = continuation(&engine);
    let text = engine.decode(&got).unwrap();
    drop(engine);
    assert_eq!(got, want, "in RAM: {text:?}");
    assert!(text.contains(" Paris"), "{text:?}");
    let scale = dense_logits.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = dense_logits.iter().zip(&logits).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(diff <= 1e-4 * scale, "last-position logits: max |diff| {diff}, scale {scale}");
    eprintln!("upcycled smollm2: {text:?}; last logits max |diff| {diff:e} (scale {scale})");

    // (b) streamed from the upcycled checkpoint, a quarter of the bank in RAM.
    let budget = report.bank_bytes / 4;
    let engine = Engine::load_with(&moe, &streaming(budget)).unwrap();
    assert_eq!(continuation(&engine).0, want, "streamed directly, budget {budget}");
    let stats = engine.store().unwrap().stats();
    assert!(stats.reads > 0 && stats.misses > 0, "experts were streamed");
    drop(engine);

    // (c) streamed from a packed store.
    let store = scratch.0.join("store");
    pack_store(&moe, &store, &[]);
    std::fs::remove_dir_all(&moe).unwrap();
    let engine = Engine::load_with(&store, &streaming(budget)).unwrap();
    assert_eq!(continuation(&engine).0, want, "packed store, budget {budget}");
    assert!(engine.store().unwrap().stats().reads > 0);
}
