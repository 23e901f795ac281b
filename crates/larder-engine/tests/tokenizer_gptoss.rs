//! gpt-oss's real tokenizer (o200k-harmony `tokenizer.json`) and harmony chat
//! template (`fixtures/tokenizer_gptoss`, written by
//! `scripts/fixtures_gptoss_tokenizer.py`): ids, decoded text, rendered
//! conversations and their ids must equal transformers 5.24.0's.

use std::sync::OnceLock;

use larder_engine::{ChatMessage, ChatTemplate, StreamDecoder, TextTokenizer};
use serde_json::Value;

mod common;
use common::fixture;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn expected() -> Value {
    let path = fixture("tokenizer_gptoss").join("expected.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The 28 MB tokenizer, loaded once for every test of this file.
fn tokenizer() -> &'static TextTokenizer {
    static TOKENIZER: OnceLock<TextTokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| TextTokenizer::from_dir(&fixture("tokenizer_gptoss")).unwrap().unwrap())
}

/// The harmony template with its clock fixed where the references' was.
fn template(expected: &Value) -> ChatTemplate {
    let fixed_now = expected["fixed_now_unix"].as_i64().unwrap();
    ChatTemplate::from_dir(&fixture("tokenizer_gptoss"))
        .unwrap()
        .unwrap()
        .with_fixed_time(fixed_now)
}

#[test]
fn corpus_ids_and_decoded_text_match_transformers() {
    let r = expected();
    let tok = tokenizer();
    let corpus = r["corpus"].as_array().unwrap();
    assert!(corpus.len() >= 30);
    for case in corpus {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        // gpt-oss's post-processor adds no BOS: both forms give the same ids.
        assert_eq!(tok.encode(text, true).unwrap(), want, "ids of {text:?}");
        assert_eq!(tok.encode(text, false).unwrap(), want, "ids of {text:?}");
        let decoded = tok.decode(&want, false).unwrap();
        assert_eq!(decoded, case["decoded"].as_str().unwrap(), "decoded {text:?}");
        assert_eq!(decoded, text, "round trip of {text:?}");
    }
}

#[test]
fn harmony_special_tokens_and_vocab_size_match_transformers() {
    let r = expected();
    let tok = tokenizer();
    assert_eq!(tok.vocab_size() as u64, r["vocab_size"].as_u64().unwrap());
    let added = r["added_tokens"].as_object().unwrap();
    for name in [
        "<|start|>",
        "<|channel|>",
        "<|message|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<|constrain|>",
    ] {
        assert!(added.contains_key(name), "{name} in the reference");
    }
    for (content, id) in added {
        let id = id.as_u64().unwrap() as u32;
        assert_eq!(tok.token_to_id(content), Some(id), "{content}");
        assert_eq!(tok.encode(content, false).unwrap(), vec![id], "{content} alone");
        assert_eq!(tok.decode(&[id], false).unwrap(), *content);
        assert_eq!(tok.decode(&[id], true).unwrap(), "", "{content} skipped");
    }
}

#[test]
fn stream_decoder_reassembles_multibyte_text() {
    let r = expected();
    let tok = tokenizer();
    for case in r["corpus"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        if text.contains("<|") {
            continue; // the stream skips special tokens
        }
        let mut dec = StreamDecoder::new();
        let mut out = String::new();
        for id in ids(&case["ids"]) {
            if let Some(piece) = dec.push(tok, id).unwrap() {
                out.push_str(&piece);
            }
        }
        assert_eq!(out, text);
    }
}

#[test]
fn harmony_chats_render_and_tokenize_as_transformers() {
    let r = expected();
    let tok = tokenizer();
    let chat = template(&r);
    let conversations = r["conversations"].as_array().unwrap();
    assert!(conversations.len() >= 5);
    for conv in conversations {
        let name = conv["name"].as_str().unwrap();
        let messages: Vec<ChatMessage> = serde_json::from_value(conv["messages"].clone()).unwrap();
        let add_generation_prompt = conv["add_generation_prompt"].as_bool().unwrap();
        let rendered = chat.render(&messages, add_generation_prompt).unwrap();
        assert_eq!(rendered, conv["rendered"].as_str().unwrap(), "rendered {name}");
        assert_eq!(tok.encode(&rendered, false).unwrap(), ids(&conv["ids"]), "ids of {name}");
    }
}

#[test]
fn harmony_template_refusals_are_errors_with_its_message() {
    let r = expected();
    let chat = template(&r);
    let refused = r["refused"].as_array().unwrap();
    assert!(!refused.is_empty());
    for conv in refused {
        let messages: Vec<ChatMessage> = serde_json::from_value(conv["messages"].clone()).unwrap();
        let e = chat.render(&messages, true).unwrap_err().to_string();
        assert!(e.contains(conv["error"].as_str().unwrap()), "{}: {e}", conv["name"]);
    }
}

#[test]
fn harmony_template_writes_todays_date_without_a_fixed_clock() {
    let r = expected();
    let chat = ChatTemplate::from_dir(&fixture("tokenizer_gptoss")).unwrap().unwrap();
    let rendered = chat.render(&[ChatMessage::new("user", "hi")], true).unwrap();
    let date = rendered
        .split("Current date: ")
        .nth(1)
        .and_then(|rest| rest.split('\n').next())
        .unwrap();
    assert!(is_iso_date(date), "{date}");
    let fixed = template(&r).render(&[ChatMessage::new("user", "hi")], true).unwrap();
    assert_eq!(rendered.replace(date, "2025-08-05"), fixed);
}

/// `YYYY-MM-DD`.
fn is_iso_date(s: &str) -> bool {
    s.len() == 10
        && s.bytes()
            .enumerate()
            .all(|(i, b)| if i == 4 || i == 7 { b == b'-' } else { b.is_ascii_digit() })
}
