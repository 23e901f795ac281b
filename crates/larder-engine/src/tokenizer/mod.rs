//! Text <-> token ids, from whichever tokenizer a checkpoint ships:
//! - `tokenizer.json`, through the `tokenizers` crate (the same Rust core
//!   transformers' fast tokenizers use);
//! - Kimi's `tiktoken.model` + `tokenizer_config.json` (Kimi-K2, Kimi Linear),
//!   through our own rank-based BPE ([`tiktoken`], [`kimi`]).
//!
//! [`TextTokenizer`] hides which; [`StreamDecoder`] turns a growing list of
//! ids into text as characters complete.

mod kimi;
mod tiktoken;

use std::collections::HashMap;
use std::path::Path;

use crate::error::EngineError;

pub(crate) use kimi::KimiTokenizer;
pub use kimi::KIMI_SPECIAL_IDS;

/// The Hugging Face tokenizer file.
pub(crate) const TOKENIZER_JSON: &str = "tokenizer.json";
/// Kimi's rank file (read with `tokenizer_config.json` when there is no `tokenizer.json`).
pub(crate) const TIKTOKEN_MODEL: &str = "tiktoken.model";
/// The file holding Kimi's special tokens (and the chat template).
pub(crate) const TOKENIZER_CONFIG: &str = "tokenizer_config.json";

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
        Self::from_tiktoken(&model, &config).map(Some)
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

    /// Loads Kimi's `tiktoken.model` with the special tokens of its `tokenizer_config.json`.
    pub(crate) fn from_tiktoken(model: &Path, config: &Path) -> Result<Self, EngineError> {
        Ok(TextTokenizer {
            backend: Backend::Kimi(Box::new(KimiTokenizer::load(model, config)?)),
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
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one id; returns the newly completed text, if any.
    pub fn push(&mut self, tok: &TextTokenizer, id: u32) -> Result<Option<String>, EngineError> {
        self.ids.push(id);
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset], true)?;
        let full = tok.decode(&self.ids[self.prefix_offset..], true)?;
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
