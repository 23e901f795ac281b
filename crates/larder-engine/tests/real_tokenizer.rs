//! The Qwen3 fixture carries the real Qwen3 tokenizer.json and chat template:
//! tokenization, chat rendering and greedy text must match transformers.

use larder_engine::{ChatMessage, Engine, GenerateOptions};
use serde_json::Value;

mod common;
use common::fixture;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn qwen3_tokenizer_chat_and_greedy_text_match_transformers() {
    tokenizer_chat_and_greedy_text_match_transformers("qwen3_moe_tok");
}

#[test]
fn deepseek_v3_tokenizer_chat_and_greedy_text_match_transformers() {
    tokenizer_chat_and_greedy_text_match_transformers("deepseek_v3_tok");
}

fn tokenizer_chat_and_greedy_text_match_transformers(name: &str) {
    let dir = fixture(name);
    let r: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let engine = Engine::load(&dir).unwrap();

    assert_eq!(engine.encode_prompt(r["text"].as_str().unwrap()).unwrap(), ids(&r["text_ids"]));

    let messages: Vec<ChatMessage> = serde_json::from_value(r["chat_messages"].clone()).unwrap();
    assert_eq!(engine.render_chat(&messages).unwrap(), r["chat_rendered"].as_str().unwrap());
    assert_eq!(engine.encode_chat(&messages).unwrap(), ids(&r["chat_ids"]));

    let opts = GenerateOptions {
        max_new: 8,
        ..GenerateOptions::default()
    };
    let g = engine.generate(&ids(&r["prompt_ids"]), &opts, &mut |_| true).unwrap();
    assert_eq!(g.ids, ids(&r["greedy_ids"]));
    assert_eq!(engine.decode(&g.ids).unwrap(), r["decode_text"].as_str().unwrap());
}

#[test]
fn stream_decoder_reassembles_the_full_text() {
    let dir = fixture("qwen3_moe_tok");
    let engine = Engine::load(&dir).unwrap();
    let tok = engine.tokenizer().unwrap();
    let text = "Grüße, 世界! naïve café — 🚀 done.\n  indented";
    let ids = tok.encode(text, false).unwrap();
    let mut dec = larder_engine::StreamDecoder::new();
    let mut out = String::new();
    for id in ids {
        if let Some(piece) = dec.push(tok, id).unwrap() {
            out.push_str(&piece);
        }
    }
    assert_eq!(out, text);
}

#[test]
fn eos_stops_generation_and_is_kept() {
    // qwen2_moe_tiny's generation config makes greedy decoding hit EOS at step 5.
    let dir = fixture("qwen2_moe_tiny");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let engine = Engine::load(&dir).unwrap();
    let g = engine
        .generate(&ids(&r["prompt_ids"]), &GenerateOptions::default(), &mut |_| true)
        .unwrap();
    assert_eq!(g.ids, ids(&r["greedy_ids"]));
    assert_eq!(g.finish_reason, larder_engine::FinishReason::Stop);
    let eos = engine.generation_config().eos_token_ids.clone();
    assert!(eos.contains(g.ids.last().unwrap()));

    let no_eos = GenerateOptions {
        stop_at_eos: false,
        max_new: 9,
        ..GenerateOptions::default()
    };
    let g = engine.generate(&ids(&r["prompt_ids"]), &no_eos, &mut |_| true).unwrap();
    assert_eq!(g.ids.len(), 9);
    assert_eq!(g.finish_reason, larder_engine::FinishReason::Length);
}

#[test]
fn seeded_sampling_is_reproducible_and_cancellable() {
    let dir = fixture("qwen3_moe_tiny");
    let engine = Engine::load(&dir).unwrap();
    let mut opts = GenerateOptions {
        max_new: 12,
        ..GenerateOptions::default()
    };
    opts.sampling.temperature = 0.9;
    opts.sampling.top_p = 0.95;
    opts.sampling.top_k = 50;
    opts.sampling.seed = 11;
    let a = engine.generate(&[1, 2, 3], &opts, &mut |_| true).unwrap();
    let b = engine.generate(&[1, 2, 3], &opts, &mut |_| true).unwrap();
    assert_eq!(a.ids, b.ids);
    let mut seen = 0;
    let c = engine
        .generate(&[1, 2, 3], &opts, &mut |_| {
            seen += 1;
            seen < 3
        })
        .unwrap();
    assert_eq!(c.ids.len(), 3);
    assert_eq!(c.finish_reason, larder_engine::FinishReason::Cancelled);
}
