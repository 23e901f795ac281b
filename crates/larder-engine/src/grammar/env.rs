//! The token environment llguidance works in: a trie of every id's bytes.
//!
//! Special tokens are spelled with toktrie's marker byte (0xff, never in
//! UTF-8 text) before their name, so grammar text never matches them while
//! a Lark grammar can still name them; ids with no bytes (gaps, ids past the
//! tokenizer's vocabulary up to the model's) are never allowed. Text is
//! tokenized greedily over the trie (llguidance only needs that for forced
//! tokens, which larder does not use: every token is sampled under the mask).

use std::sync::Arc;

use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

use crate::error::EngineError;
use crate::tokenizer::TextTokenizer;

/// The trie for `tokenizer` with EOS ids `eos_ids`, padded to `vocab_size` ids.
pub(super) fn token_env(tokenizer: &TextTokenizer, eos_ids: &[u32], vocab_size: usize) -> Result<TokEnv, EngineError> {
    let spellings = tokenizer.token_spellings()?;
    let size = vocab_size.max(spellings.len());
    let Some(&first_eos) = eos_ids.first() else {
        return Err(EngineError::Tokenizer(
            "structured output needs the model's EOS id, and there is none".into(),
        ));
    };
    if let Some(bad) = eos_ids.iter().find(|&&id| id as usize >= size) {
        return Err(EngineError::Tokenizer(format!("EOS id {bad} is past the vocabulary of {size} ids")));
    }
    let mut words: Vec<Vec<u8>> = Vec::with_capacity(size);
    for spelling in spellings {
        let mut bytes = spelling.bytes;
        if spelling.special && !bytes.is_empty() {
            bytes.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
        }
        words.push(bytes);
    }
    words.resize(size, Vec::new());
    let vocab = u32::try_from(size).map_err(|_| EngineError::Tokenizer(format!("a vocabulary of {size} ids is too large")))?;
    let trie = TokTrie::from(&TokRxInfo::new(vocab, first_eos), &words).with_eos_tokens(eos_ids);
    Ok(Arc::new(ApproximateTokEnv::new(trie)))
}
