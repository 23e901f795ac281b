//! Text <-> token ids, from whichever tokenizer a checkpoint ships:
//! - `tokenizer.json`, through the `tokenizers` crate (the same Rust core
//!   transformers' fast tokenizers use);
//! - Kimi's `tiktoken.model` + `tokenizer_config.json` (Kimi-K2, Kimi Linear,
//!   Kimi K3), through our own rank-based BPE ([`tiktoken`], [`kimi`]); a
//!   checkpoint in Kimi K3's form ([`kimi_k3_form`]) gets K3's 256 special ids
//!   after the ranks instead of K2's 258.
//!
//! [`TextTokenizer`] hides which; [`StreamDecoder`] turns a growing list of
//! ids into text as characters complete; [`spelling`] gives each id's bytes
//! (for structured output's grammar engine).

mod kimi;
mod spelling;
mod tiktoken;

use std::collections::HashMap;
use std::path::Path;

use crate::error::EngineError;

pub(crate) use kimi::{python_isspace, KimiTokenizer};
pub use kimi::{KIMI_K3_SPECIAL_IDS, KIMI_SPECIAL_IDS};
pub(crate) use spelling::TokenSpelling;

/// The Hugging Face tokenizer file.
pub(crate) const TOKENIZER_JSON: &str = "tokenizer.json";
/// Kimi's rank file (read with `tokenizer_config.json` when there is no `tokenizer.json`).
pub(crate) const TIKTOKEN_MODEL: &str = "tiktoken.model";
/// The file holding Kimi's special tokens (and the chat template).
pub(crate) const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
/// The control tokens of Kimi K3's chat format (its `encoding_k3.py`).
pub(crate) const KIMI_K3_MARKERS: [&str; 4] = ["<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"];

/// Whether checkpoint folder `dir` ships Kimi K3's tokenizer and chat
/// format: `config.json` says `"model_type": "kimi_k3"`, or
/// `tokenizer_config.json` names all of K3's control tokens
/// ([`KIMI_K3_MARKERS`]) in `added_tokens_decoder` and there is no chat
/// template (no `chat_template` field, no `chat_template.jinja`), as K3
/// ships. A file that cannot be read or parsed here counts as not saying so
/// (loading the model or the tokenizer reports it).
pub(crate) fn kimi_k3_form(dir: &Path) -> bool {
    let read = |name: &str| -> Option<serde_json::Value> { serde_json::from_str(&std::fs::read_to_string(dir.join(name)).ok()?).ok() };
    if read("config.json").is_some_and(|c| c.get("model_type").and_then(serde_json::Value::as_str) == Some("kimi_k3")) {
        return true;
    }
    let Some(config) = read(TOKENIZER_CONFIG) else { return false };
    if config.get("chat_template").is_some_and(|t| !t.is_null()) || dir.join("chat_template.jinja").exists() {
        return false;
    }
    let Some(decoder) = config.get("added_tokens_decoder").and_then(serde_json::Value::as_object) else {
        return false;
    };
    let named = |marker: &str| {
        decoder
            .values()
            .any(|e| e.get("content").and_then(serde_json::Value::as_str) == Some(marker))
    };
    KIMI_K3_MARKERS.iter().all(|m| named(m))
}

/// A checkpoint's tokenizer, whichever form it shipped in.
pub struct TextTokenizer {
    backend: Backend,
}

enum Backend {
    HuggingFace(Box<tokenizers::Tokenizer>),
    Kimi(Box<KimiTokenizer>),
}

impl TextTokenizer {
    /// The tokenizer of checkpoint folder `dir`: `tokenizer.json` if present,
    /// else `tiktoken.model` with `tokenizer_config.json`; `None` if neither.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>, EngineError> {
        let json = dir.join(TOKENIZER_JSON);
        if json.exists() {
            return Self::from_file(&json).map(Some);
        }
        let model = dir.join(TIKTOKEN_MODEL);
        if !model.exists() {
            return Ok(None);
        }
        let config = dir.join(TOKENIZER_CONFIG);
        if !config.exists() {
            return Err(EngineError::File {
                path: model,
                message: format!("a tiktoken.model needs {TOKENIZER_CONFIG} beside it for its special tokens, and there is none"),
            });
        }
        let reserved = if kimi_k3_form(dir) { KIMI_K3_SPECIAL_IDS } else { KIMI_SPECIAL_IDS };
        Self::from_tiktoken(&model, &config, reserved).map(Some)
    }

    /// Loads `path` (a `tokenizer.json`).
    pub fn from_file(path: &Path) -> Result<Self, EngineError> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| EngineError::File {
            path: path.to_path_buf(),
            message: format!("cannot load tokenizer: {e}"),
        })?;
        Ok(TextTokenizer {
            backend: Backend::HuggingFace(Box::new(inner)),
        })
    }

    /// Loads Kimi's `tiktoken.model` with the special tokens of its
    /// `tokenizer_config.json`, `reserved` special ids after the ranks.
    pub(crate) fn from_tiktoken(model: &Path, config: &Path, reserved: u32) -> Result<Self, EngineError> {
        Ok(TextTokenizer {
            backend: Backend::Kimi(Box::new(KimiTokenizer::load(model, config, reserved)?)),
        })
    }

    /// Token ids of `text`. `add_special_tokens` applies the tokenizer's
    /// post-processor (e.g. a BOS token), as `tokenizer(text)` does in
    /// transformers; Kimi's adds none. Kimi's tokenizer matches its special
    /// tokens in any text, as its `encode` does. Only ids are computed (no
    /// offsets: `encode_fast`, the same ids for less work on long prompts).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, EngineError> {
        match &self.backend {
            Backend::HuggingFace(inner) => {
                let enc = inner
                    .encode_fast(text, add_special_tokens)
                    .map_err(|e| EngineError::Tokenizer(format!("cannot encode text: {e}")))?;
                Ok(enc.get_ids().to_vec())
            }
            Backend::Kimi(kimi) => kimi.encode(text),
        }
    }

    /// Ids of one segment of a chat that is encoded segment by segment (Kimi
    /// K3's, [`crate::kimi_k3_chat`]): special tokens are matched in `text`
    /// only when `control`, so message text never yields a special id. Only
    /// the `tiktoken.model` form has this (K3 ships it); a `tokenizer.json`
    /// is refused rather than guessed at.
    pub fn encode_segment(&self, text: &str, control: bool) -> Result<Vec<u32>, EngineError> {
        match &self.backend {
            Backend::Kimi(kimi) => kimi.encode_with(text, control),
            Backend::HuggingFace(_) => Err(EngineError::Tokenizer(
                "Kimi K3's chat is encoded segment by segment with its tiktoken.model (as its tokenization_kimi.py does); \
                 this checkpoint's tokenizer is a tokenizer.json, for which no reference encoder exists"
                    .into(),
            )),
        }
    }

    /// Text of `ids`, special tokens left out when `skip_special_tokens`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, EngineError> {
        match &self.backend {
            Backend::HuggingFace(inner) => inner
                .decode(ids, skip_special_tokens)
                .map_err(|e| EngineError::Tokenizer(format!("cannot decode ids: {e}"))),
            Backend::Kimi(kimi) => kimi.decode(ids, skip_special_tokens),
        }
    }

    /// The id of a token string, if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        match &self.backend {
            Backend::HuggingFace(inner) => inner.token_to_id(token),
            Backend::Kimi(kimi) => kimi.token_to_id(token),
        }
    }

    /// Token string -> id, special tokens included.
    pub fn vocab(&self) -> HashMap<String, u32> {
        match &self.backend {
            Backend::HuggingFace(inner) => inner.get_vocab(true),
            Backend::Kimi(kimi) => kimi.vocab(),
        }
    }

    /// Each id's bytes and whether it is a special token (index = id), for
    /// the grammar engine of structured output ([`spelling`]).
    pub(crate) fn token_spellings(&self) -> Result<Vec<TokenSpelling>, EngineError> {
        match &self.backend {
            Backend::HuggingFace(inner) => spelling::hf_spellings(inner),
            Backend::Kimi(kimi) => Ok(kimi.token_spellings()),
        }
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        match &self.backend {
            Backend::HuggingFace(inner) => inner.get_vocab_size(true),
            Backend::Kimi(kimi) => kimi.vocab_size(),
        }
    }
}

/// Turns a growing list of ids into text pieces as soon as they are complete
/// characters (a token may end inside a multi-byte UTF-8 sequence).
#[derive(Debug, Default)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    /// Start of the window re-decoded for context (tokenizers merge spaces across tokens).
    prefix_offset: usize,
    /// End of the text already emitted, in ids.
    read_offset: usize,
    /// Spell special tokens too (tool-call and reasoning markers that are
    /// special tokens, for the output parsers); default: left out.
    keep_special_tokens: bool,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// A decoder that spells special tokens too.
    pub fn keeping_special_tokens() -> Self {
        StreamDecoder {
            keep_special_tokens: true,
            ..Self::default()
        }
    }

    /// Adds one id; returns the newly completed text, if any.
    pub fn push(&mut self, tok: &TextTokenizer, id: u32) -> Result<Option<String>, EngineError> {
        self.ids.push(id);
        let skip = !self.keep_special_tokens;
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset], skip)?;
        let full = tok.decode(&self.ids[self.prefix_offset..], skip)?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') && full.is_char_boundary(prefix.len()) {
            let piece = full[prefix.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            Ok(Some(piece))
        } else {
            Ok(None)
        }
    }
}
