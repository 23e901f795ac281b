//! Text <-> token ids through the checkpoint's `tokenizer.json` (the
//! `tokenizers` crate, the same Rust core transformers' fast tokenizers use).

use std::path::Path;

use crate::error::EngineError;

/// A loaded `tokenizer.json`.
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
}

impl TextTokenizer {
    /// Loads `path` (a `tokenizer.json`).
    pub fn from_file(path: &Path) -> Result<Self, EngineError> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| EngineError::File {
            path: path.to_path_buf(),
            message: format!("cannot load tokenizer: {e}"),
        })?;
        Ok(TextTokenizer { inner })
    }

    /// Token ids of `text`. `add_special_tokens` applies the tokenizer's
    /// post-processor (e.g. a BOS token), as `tokenizer(text)` does in transformers.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, EngineError> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| EngineError::Tokenizer(format!("cannot encode text: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`, special tokens left out when `skip_special_tokens`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, EngineError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| EngineError::Tokenizer(format!("cannot decode ids: {e}")))
    }

    /// The id of a token string, if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Token string -> id, special tokens included.
    pub fn vocab(&self) -> std::collections::HashMap<String, u32> {
        self.inner.get_vocab(true)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
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
