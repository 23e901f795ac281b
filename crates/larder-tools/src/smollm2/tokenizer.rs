//! The tokenizer files of the converted checkpoint, built from the GGUF
//! tokenizer metadata exactly as `scripts/smollm2_from_gguf.py` builds them:
//! `tokenizer.json` (byte-level BPE with a Digits + ByteLevel pre-tokenizer,
//! ByteLevel decoder, control and user-defined tokens as added tokens),
//! `tokenizer_config.json` (chat template, special token strings) and
//! `special_tokens_map.json`.

use std::collections::HashMap;

use super::gguf::{Gguf, Value};
use super::json::J;
use super::{refuse, ConvertError, Result};

const TOKEN_TYPE_NORMAL: i64 = 1;
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// A token the tokenizer matches before BPE (control or user-defined).
pub struct Added {
    pub id: usize,
    pub content: String,
    pub special: bool,
}

/// The GGUF vocabulary: tokens, merges and added tokens.
pub struct Vocab {
    pub tokens: Vec<String>,
    pub merges: Vec<String>,
    pub added: Vec<Added>,
}

/// Special token ids from the GGUF metadata.
#[derive(Debug, Clone, Copy)]
pub struct SpecialIds {
    pub bos: Option<i64>,
    pub eos: Option<i64>,
    pub pad: Option<i64>,
    pub unk: Option<i64>,
}

fn strings(g: &Gguf, key: &str) -> Result<Vec<String>> {
    let Some(Value::Arr(items)) = g.get(key) else {
        refuse!("GGUF metadata has no {key:?} array");
    };
    items
        .iter()
        .map(|v| v.as_str().map(str::to_string))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| ConvertError::Gguf(format!("GGUF metadata {key:?} holds a non-string")))
}

/// Reads and checks the vocabulary (byte-level BPE only).
pub fn read_vocab(g: &Gguf) -> Result<Vocab> {
    match g.get("tokenizer.ggml.model").and_then(Value::as_str) {
        Some("gpt2") => {}
        Some(m) => refuse!("tokenizer.ggml.model is {m:?}; only 'gpt2' (byte-level BPE) is supported"),
        None => refuse!("GGUF metadata has no 'tokenizer.ggml.model'"),
    }
    let tokens = strings(g, "tokenizer.ggml.tokens")?;
    let merges = strings(g, "tokenizer.ggml.merges")?;
    let types: Vec<i64> = match g.get("tokenizer.ggml.token_type") {
        None => vec![TOKEN_TYPE_NORMAL; tokens.len()],
        Some(Value::Arr(items)) => items
            .iter()
            .map(Value::as_int)
            .collect::<Option<_>>()
            .ok_or_else(|| ConvertError::Gguf("tokenizer.ggml.token_type holds a non-integer".into()))?,
        Some(_) => refuse!("tokenizer.ggml.token_type is not an array"),
    };
    if types.len() != tokens.len() {
        refuse!("token_type and tokens differ in length");
    }
    if let Some(mg) = merges.iter().find(|m| m.split(' ').count() != 2) {
        refuse!("merge {mg:?} is not two space-separated tokens");
    }
    let mut seen = HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        if let Some(j) = seen.insert(t.as_str(), i) {
            refuse!("duplicate token {t:?} at ids {j} and {i}");
        }
    }
    let added = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (_, ty))| **ty == TOKEN_TYPE_CONTROL || **ty == TOKEN_TYPE_USER_DEFINED)
        .map(|(id, (t, ty))| Added {
            id,
            content: t.clone(),
            special: *ty == TOKEN_TYPE_CONTROL,
        })
        .collect();
    Ok(Vocab { tokens, merges, added })
}

fn byte_level(add_prefix_space: bool, trim_offsets: bool) -> Vec<(&'static str, J)> {
    vec![
        ("type", J::s("ByteLevel")),
        ("add_prefix_space", J::Bool(add_prefix_space)),
        ("trim_offsets", J::Bool(trim_offsets)),
        ("use_regex", J::Bool(true)),
    ]
}

/// `tokenizer.json`.
pub fn tokenizer_json(v: &Vocab) -> J {
    let added = v
        .added
        .iter()
        .map(|a| {
            J::obj(vec![
                ("id", J::Int(a.id as i64)),
                ("content", J::s(&a.content)),
                ("single_word", J::Bool(false)),
                ("lstrip", J::Bool(false)),
                ("rstrip", J::Bool(false)),
                ("normalized", J::Bool(false)),
                ("special", J::Bool(a.special)),
            ])
        })
        .collect();
    let pre = J::obj(vec![
        ("type", J::s("Sequence")),
        (
            "pretokenizers",
            J::Arr(vec![
                J::obj(vec![("type", J::s("Digits")), ("individual_digits", J::Bool(true))]),
                J::obj(byte_level(false, true)),
            ]),
        ),
    ]);
    let vocab = J::Obj(v.tokens.iter().enumerate().map(|(i, t)| (t.clone(), J::Int(i as i64))).collect());
    let model = J::obj(vec![
        ("type", J::s("BPE")),
        ("dropout", J::Null),
        ("unk_token", J::Null),
        ("continuing_subword_prefix", J::Null),
        ("end_of_word_suffix", J::Null),
        ("fuse_unk", J::Bool(false)),
        ("byte_fallback", J::Bool(false)),
        ("vocab", vocab),
        ("merges", J::Arr(v.merges.iter().map(J::s).collect())),
    ]);
    J::obj(vec![
        ("version", J::s("1.0")),
        ("truncation", J::Null),
        ("padding", J::Null),
        ("added_tokens", J::Arr(added)),
        ("normalizer", J::Null),
        ("pre_tokenizer", pre),
        ("post_processor", J::obj(byte_level(true, false))),
        ("decoder", J::obj(byte_level(true, true))),
        ("model", model),
    ])
}

fn token_str(v: &Vocab, id: Option<i64>) -> Result<J> {
    match id {
        None => Ok(J::Null),
        Some(i) => usize::try_from(i)
            .ok()
            .and_then(|i| v.tokens.get(i))
            .map(J::s)
            .ok_or_else(|| ConvertError::Gguf(format!("special token id {i} is outside the vocabulary of {}", v.tokens.len()))),
    }
}

/// `tokenizer_config.json` and `special_tokens_map.json`.
pub fn tokenizer_configs(v: &Vocab, ids: SpecialIds, ctx: i64, chat_template: Option<&str>) -> Result<(J, J)> {
    let decoder = v
        .added
        .iter()
        .map(|a| {
            let entry = J::obj(vec![
                ("content", J::s(&a.content)),
                ("lstrip", J::Bool(false)),
                ("normalized", J::Bool(false)),
                ("rstrip", J::Bool(false)),
                ("single_word", J::Bool(false)),
                ("special", J::Bool(a.special)),
            ]);
            (a.id.to_string(), entry)
        })
        .collect();
    let named = [ids.bos, ids.eos, ids.pad, ids.unk];
    let extra = J::Arr(
        v.added
            .iter()
            .filter(|a| a.special && !named.contains(&Some(a.id as i64)))
            .map(|a| J::s(&a.content))
            .collect(),
    );
    let (bos, eos, pad, unk) = (
        token_str(v, ids.bos)?,
        token_str(v, ids.eos)?,
        token_str(v, ids.pad)?,
        token_str(v, ids.unk)?,
    );
    let mut config = vec![
        ("add_prefix_space", J::Bool(false)),
        ("added_tokens_decoder", J::Obj(decoder)),
        ("additional_special_tokens", extra.clone()),
        ("bos_token", bos.clone()),
        ("eos_token", eos.clone()),
        ("pad_token", pad.clone()),
        ("unk_token", unk.clone()),
        ("clean_up_tokenization_spaces", J::Bool(false)),
        ("model_max_length", J::Int(ctx)),
        ("tokenizer_class", J::s("PreTrainedTokenizerFast")),
        ("vocab_size", J::Int(v.tokens.len() as i64)),
    ];
    if let Some(t) = chat_template {
        config.push(("chat_template", J::s(t)));
    }
    let map = J::obj(vec![
        ("additional_special_tokens", extra),
        ("bos_token", bos),
        ("eos_token", eos),
        ("pad_token", pad),
        ("unk_token", unk),
    ]);
    Ok((J::obj(config), map))
}
