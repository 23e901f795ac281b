//! Kimi's tokenizer form (`tiktoken.model` + `tokenizer_config.json`) against
//! PyPI tiktoken: `fixtures/tiktoken_kimi` (scripts/gen_tiktoken_fixture.py)
//! holds a trained rank file, Kimi-style special tokens and tiktoken's ids for
//! a varied corpus. larder's ids must equal them on every string, decoding
//! must round-trip, a checkpoint with this form must work through the engine,
//! and every malformed file must be refused naming its file and line.

mod common;

use std::path::{Path, PathBuf};

use larder_engine::{ChatMessage, Engine, GenerateOptions, StreamDecoder, TextTokenizer};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

fn reference() -> Value {
    let text = std::fs::read_to_string(fixture("tiktoken_kimi").join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn kimi() -> TextTokenizer {
    TextTokenizer::from_dir(&fixture("tiktoken_kimi"))
        .unwrap()
        .expect("fixture has a tokenizer")
}

#[test]
fn ids_equal_tiktoken_on_every_string_and_decode_round_trips() {
    let r = reference();
    let tok = kimi();
    assert_eq!(tok.vocab_size() as u64, r["n_vocab"].as_u64().unwrap());
    let cases = r["cases"].as_array().unwrap();
    assert!(cases.len() >= 20);
    let mut split_cases = 0;
    for case in cases {
        let (name, text) = (case["name"].as_str().unwrap(), case["text"].as_str().unwrap());
        let want = ids(&case["ids"]);
        assert_eq!(tok.encode(text, true).unwrap(), want, "case {name}");
        assert_eq!(tok.encode(text, false).unwrap(), want, "case {name}: Kimi adds no special tokens");
        assert_eq!(tok.decode(&want, false).unwrap(), text, "case {name}");
        for prefix in case["decoded_prefixes"].as_array().unwrap() {
            let k = prefix[0].as_u64().unwrap() as usize;
            assert_eq!(
                tok.decode(&want[..k], false).unwrap(),
                prefix[1].as_str().unwrap(),
                "case {name}, {k} ids"
            );
        }
        split_cases += usize::from(case["split_changes_ids"].as_bool().unwrap());
    }
    // Kimi's 25,000-character runs change the ids of these cases: they prove the split.
    assert_eq!(split_cases, 2);
}

#[test]
fn special_tokens_have_kimis_ids_and_can_be_skipped() {
    let r = reference();
    let tok = kimi();
    let base = r["num_base_tokens"].as_u64().unwrap() as u32;
    for (name, id) in r["special_tokens"].as_object().unwrap() {
        assert_eq!(tok.token_to_id(name), Some(id.as_u64().unwrap() as u32), "{name}");
    }
    assert_eq!(tok.token_to_id(&format!("<|reserved_token_{}|>", base + 5)), Some(base + 5));
    assert_eq!(tok.token_to_id(&format!("<|reserved_token_{}|>", base + 257)), Some(base + 257));
    let case = r["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "specials_inline")
        .unwrap();
    let all = ids(&case["ids"]);
    let ordinary: Vec<u32> = all.iter().copied().filter(|&id| id < base).collect();
    assert!(ordinary.len() < all.len());
    assert_eq!(tok.decode(&all, true).unwrap(), tok.decode(&ordinary, false).unwrap());
    let past = base + larder_engine::KIMI_SPECIAL_IDS;
    let err = tok.decode(&[past], false).unwrap_err().to_string();
    assert!(err.contains(&past.to_string()), "{err}");
}

#[test]
fn vocab_spells_every_id_once_and_token_to_id_reads_it_back() {
    let tok = kimi();
    let vocab = tok.vocab();
    assert_eq!(vocab.len(), tok.vocab_size());
    for (token, &id) in &vocab {
        assert_eq!(tok.token_to_id(token), Some(id), "{token:?}");
    }
    assert_eq!(tok.token_to_id("Ġthe"), tok.encode(" the", false).unwrap().first().copied());
}

#[test]
fn stream_decoder_reassembles_multibyte_text() {
    let tok = kimi();
    let text = "东京都は日本の首都です 👨‍👩‍👧‍👦 🏳️‍🌈 안녕하세요 naïve";
    let mut dec = StreamDecoder::new();
    let mut out = String::new();
    for id in tok.encode(text, false).unwrap() {
        if let Some(piece) = dec.push(&tok, id).unwrap() {
            out.push_str(&piece);
        }
    }
    assert_eq!(out, text);
}

/// A checkpoint folder: kimi_k2_tiny's model with the Kimi tokenizer fixture.
fn kimi_checkpoint(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("larder-tiktoken-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(fixture("kimi_k2_tiny").join(file), dir.join(file)).unwrap();
    }
    for file in ["tiktoken.model", "tokenizer_config.json"] {
        std::fs::copy(fixture("tiktoken_kimi").join(file), dir.join(file)).unwrap();
    }
    dir
}

#[test]
fn engine_loads_the_tiktoken_form_for_prompts_chats_and_decoding() {
    let r = reference();
    let dir = kimi_checkpoint("engine");
    let engine = Engine::load(&dir).unwrap();
    let case = r["cases"].as_array().unwrap().iter().find(|c| c["name"] == "cjk_han").unwrap();
    assert_eq!(engine.encode_prompt(case["text"].as_str().unwrap()).unwrap(), ids(&case["ids"]));

    let messages: Vec<ChatMessage> = serde_json::from_value(r["chat_messages"].clone()).unwrap();
    assert_eq!(engine.render_chat(&messages).unwrap(), r["chat_rendered"].as_str().unwrap());
    assert_eq!(engine.encode_chat(&messages).unwrap(), ids(&r["chat_ids"]));

    let opts = GenerateOptions {
        max_new: 4,
        ..GenerateOptions::default()
    };
    let generated = engine.generate(&[300, 301, 302], &opts, &mut |_| true).unwrap();
    let text = engine.decode(&generated.ids).unwrap();
    assert_eq!(text, engine.tokenizer().unwrap().decode(&generated.ids, true).unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_packed_store_carries_the_tiktoken_form_and_a_draft_model_is_checked_by_it() {
    let r = reference();
    let dir = kimi_checkpoint("pack");
    let store = common::scratch_dir("tiktoken-pack").join("store");
    common::pack_store(&dir, &store, &[]);
    assert!(store.join("tiktoken.model").is_file(), "pack must carry tiktoken.model");
    let engine = Engine::load_with(&store, &common::pread_streaming(2, 0, true)).unwrap();
    let case = r["cases"].as_array().unwrap().iter().find(|c| c["name"] == "cjk_han").unwrap();
    assert_eq!(engine.encode_prompt(case["text"].as_str().unwrap()).unwrap(), ids(&case["ids"]));

    // A draft model whose rank file differs (two tokens' ranks swapped) is refused.
    let draft = kimi_checkpoint("draft");
    let text = std::fs::read_to_string(draft.join("tiktoken.model")).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let token = |l: &str| l.split(' ').next().unwrap().to_string();
    let (t0, t1) = (token(&lines[0]), token(&lines[1]));
    (lines[0], lines[1]) = (format!("{t1} 0"), format!("{t0} 1"));
    std::fs::write(draft.join("tiktoken.model"), lines.join("\n") + "\n").unwrap();
    let err = engine
        .drafting(&larder_engine::DrafterChoice::DraftModel { dir: draft.clone() })
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(err.contains("vocabulary"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&draft).unwrap();
    std::fs::remove_dir_all(store.parent().unwrap()).unwrap();
}

// ---- bad input: every fault names its file and line ----

/// The 256 single-byte lines of the fixture (ranks 0..=255).
fn byte_lines() -> Vec<String> {
    let text = std::fs::read_to_string(fixture("tiktoken_kimi").join("tiktoken.model")).unwrap();
    text.lines().take(256).map(str::to_string).collect()
}

/// Loads a tokenizer from a rank file of `lines` and a config of `config`.
fn load_err(name: &str, lines: &[String], config: &str) -> String {
    let dir = std::env::temp_dir().join(format!("larder-tiktoken-bad-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tiktoken.model"), lines.join("\n") + "\n").unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), config).unwrap();
    let err = match TextTokenizer::from_dir(&dir) {
        Ok(_) => panic!("{name}: loaded"),
        Err(e) => e.to_string(),
    };
    std::fs::remove_dir_all(&dir).unwrap();
    err
}

fn with_line(line: &str) -> Vec<String> {
    let mut lines = byte_lines();
    lines.push("aGk= 256".into()); // "hi", line 257
    lines.push(line.into()); // line 258
    lines
}

fn assert_names(err: &str, file: &str, needles: &[&str]) {
    assert!(err.contains(file), "{err}");
    for needle in needles {
        assert!(err.contains(needle), "{err} lacks {needle:?}");
    }
}

const CONFIG: &str = "{}";

#[test]
fn malformed_rank_lines_are_refused_naming_file_and_line() {
    let cases = [
        ("bad_base64", "a*k= 257", "line 258: token"),
        ("bad_length", "aGV 257", "line 258: token"),
        ("missing_rank", "aGVsbG8=", "line 258: expected `base64-token rank`, found 1"),
        ("extra_field", "aGVsbG8= 257 9", "line 258: expected `base64-token rank`, found 3"),
        (
            "non_integer_rank",
            "aGVsbG8= 2x7",
            "line 258: rank \"2x7\" is not a non-negative integer",
        ),
        ("negative_rank", "aGVsbG8= -257", "line 258: rank \"-257\""),
        ("empty_token", "==== 257", "line 258"),
        ("duplicate_rank", "aGVsbG8= 256", "line 258: rank 256 is also the rank on line 257"),
        (
            "duplicate_token",
            "aGk= 257",
            "line 258: token \"hi\" is also the token on line 257",
        ),
        ("gap", "aGVsbG8= 300", "line 258: rank 300 is past the 258 ranks"),
    ];
    for (name, line, message) in cases {
        let err = load_err(name, &with_line(line), CONFIG);
        assert_names(&err, "tiktoken.model", &[message]);
    }
}

#[test]
fn missing_byte_and_non_utf8_are_refused() {
    let mut lines = byte_lines();
    lines.remove(65); // 'A'
    lines.iter_mut().enumerate().skip(65).for_each(|(i, l)| {
        let token = l.split(' ').next().unwrap().to_string();
        *l = format!("{token} {i}");
    });
    assert_names(
        &load_err("missing_byte", &lines, CONFIG),
        "tiktoken.model",
        &["byte 0x41 has no rank"],
    );

    let dir = std::env::temp_dir().join(format!("larder-tiktoken-bad-{}-utf8", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut bytes = (byte_lines().join("\n") + "\n").into_bytes();
    bytes.extend_from_slice(b"aGk=\xff 256\n");
    std::fs::write(dir.join("tiktoken.model"), bytes).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), CONFIG).unwrap();
    let err = TextTokenizer::from_dir(&dir).err().unwrap().to_string();
    assert_names(&err, "tiktoken.model", &["line 257: not UTF-8"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn added(id: &str, content: &str) -> String {
    format!("{{\n  \"added_tokens_decoder\": {{\n    \"{id}\": {{\"content\": \"{content}\", \"special\": true}}\n  }}\n}}")
}

#[test]
fn bad_special_tokens_are_refused_naming_file_and_line() {
    let lines = with_line("aGVsbG8= 257"); // 258 ranks: special ids 258..=515
    let err = load_err("collision", &lines, &added("100", "<|x|>"));
    assert_names(
        &err,
        "tokenizer_config.json",
        &["line 3:", "id 100", "collides with BPE rank 100 (line 101 of", "tiktoken.model"],
    );
    let err = load_err("past", &lines, &added("516", "<|x|>"));
    assert_names(
        &err,
        "tokenizer_config.json",
        &["line 3:", "id 516", "past the special ids 258..515"],
    );
    let err = load_err("not_an_id", &lines, &added("bos", "<|x|>"));
    assert_names(&err, "tokenizer_config.json", &["line 3:", "\"bos\" is not a token id"]);
    let err = load_err("no_content", &lines, &added("258", ""));
    assert_names(&err, "tokenizer_config.json", &["line 3:", "no non-empty \"content\""]);
    let err = load_err("same_name", &lines, &added("258", "<|reserved_token_259|>"));
    assert_names(&err, "tokenizer_config.json", &["names two ids, 258 and 259"]);
    let err = load_err("bos_unknown", &lines, r#"{"bos_token": "[BOS]"}"#);
    assert_names(
        &err,
        "tokenizer_config.json",
        &["bos_token \"[BOS]\" is not one of the special tokens"],
    );
    let err = load_err("not_json", &lines, "{");
    assert_names(&err, "tokenizer_config.json", &["not valid JSON"]);
}

#[test]
fn a_rank_file_without_its_config_is_refused() {
    let dir = std::env::temp_dir().join(format!("larder-tiktoken-bad-{}-noconfig", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tiktoken.model"), byte_lines().join("\n")).unwrap();
    let err = TextTokenizer::from_dir(&dir).err().unwrap().to_string();
    assert_names(&err, "tiktoken.model", &["tokenizer_config.json"]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(TextTokenizer::from_dir(&dir.join("nothing-here")).unwrap().is_none());
}
