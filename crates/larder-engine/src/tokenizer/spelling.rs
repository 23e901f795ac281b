//! Each token id's bytes, for a grammar engine that matches text byte by
//! byte ([`crate::grammar`]): the text a token adds when decoded, and
//! whether it is a special token (never part of constrained text).
//!
//! - Kimi's `tiktoken.model`: a rank's bytes as they are; a special token's
//!   name, special unless marked `"special": false`.
//! - `tokenizer.json`: model tokens through the decoder's alphabet: GPT-2's
//!   byte-level stand-ins (`ByteLevel`), or SentencePiece's `▁` for a space
//!   with `<0xNN>` byte tokens (`ByteFallback`, `Replace`, `Metaspace`);
//!   added tokens are their content. A token whose spelling cannot be read
//!   (a character outside the byte-level alphabet) gets no bytes, so a
//!   grammar never allows it; another decoder is refused.

use serde_json::Value as Json;

use super::kimi::byte_of_char;
use crate::error::EngineError;

/// One id's bytes and whether it is a special token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TokenSpelling {
    pub(crate) bytes: Vec<u8>,
    pub(crate) special: bool,
}

/// How a `tokenizer.json` spells a model token's bytes.
enum Alphabet {
    /// GPT-2's byte-level stand-ins.
    ByteLevel,
    /// Text with `space` standing for a space; `<0xNN>` is byte NN when `byte_fallback`.
    Pieces { space: char, byte_fallback: bool },
}

impl Alphabet {
    fn of(decoder: Option<&Json>) -> Result<Self, EngineError> {
        let Some(decoder) = decoder else {
            return Err(EngineError::Tokenizer(
                "tokenizer.json has no decoder, so the bytes of its tokens are unknown (structured output needs them)".into(),
            ));
        };
        let kind = decoder.get("type").and_then(Json::as_str).unwrap_or("");
        match kind {
            "ByteLevel" => Ok(Alphabet::ByteLevel),
            "Metaspace" => Ok(Alphabet::Pieces {
                space: single_char(decoder.get("replacement")).unwrap_or('▁'),
                byte_fallback: false,
            }),
            "Sequence" => {
                let parts = decoder.get("decoders").and_then(Json::as_array).map(Vec::as_slice).unwrap_or(&[]);
                let mut space = None;
                let mut byte_fallback = false;
                for part in parts {
                    match part.get("type").and_then(Json::as_str) {
                        Some("ByteLevel") => return Ok(Alphabet::ByteLevel),
                        Some("ByteFallback") => byte_fallback = true,
                        Some("Replace") if part.get("content").and_then(Json::as_str) == Some(" ") => {
                            space = single_char(part.get("pattern").and_then(|p| p.get("String")));
                        }
                        Some("Metaspace") => space = single_char(part.get("replacement")).or(Some('▁')),
                        _ => {}
                    }
                }
                match (space, byte_fallback) {
                    (None, false) => Err(unsupported(kind)),
                    (space, byte_fallback) => Ok(Alphabet::Pieces {
                        space: space.unwrap_or(' '),
                        byte_fallback,
                    }),
                }
            }
            _ => Err(unsupported(kind)),
        }
    }

    /// The bytes of model token `name`, `None` if it cannot be read.
    fn bytes(&self, name: &str) -> Option<Vec<u8>> {
        match self {
            Alphabet::ByteLevel => name.chars().map(byte_of_char).collect(),
            Alphabet::Pieces { space, byte_fallback } => {
                if *byte_fallback {
                    if let Some(hex) = name.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')) {
                        if hex.len() == 2 {
                            return u8::from_str_radix(hex, 16).ok().map(|b| vec![b]);
                        }
                    }
                }
                Some(name.replace(*space, " ").into_bytes())
            }
        }
    }
}

fn single_char(v: Option<&Json>) -> Option<char> {
    let s = v?.as_str()?;
    let mut chars = s.chars();
    let c = chars.next()?;
    chars.next().is_none().then_some(c)
}

fn unsupported(kind: &str) -> EngineError {
    EngineError::Tokenizer(format!(
        "tokenizer.json's decoder {kind:?} is not one whose token bytes larder can read (ByteLevel, or ByteFallback/Replace/Metaspace); \
         structured output needs them"
    ))
}

/// Every id's spelling for a `tokenizer.json` tokenizer; index = id, over
/// its whole vocabulary (added tokens included).
pub(crate) fn hf_spellings(tok: &tokenizers::Tokenizer) -> Result<Vec<TokenSpelling>, EngineError> {
    let decoder = tok
        .get_decoder()
        .map(serde_json::to_value)
        .transpose()
        .map_err(|e| EngineError::Tokenizer(format!("cannot read tokenizer.json's decoder: {e}")))?;
    let alphabet = Alphabet::of(decoder.as_ref())?;
    let vocab = tok.get_vocab(false);
    let added = tok.get_added_tokens_decoder();
    let size = vocab
        .values()
        .chain(added.keys())
        .map(|&id| id as usize + 1)
        .max()
        .unwrap_or(0)
        .max(tok.get_vocab_size(true));
    let mut out = vec![TokenSpelling::default(); size];
    for (name, id) in vocab {
        if let Some(bytes) = alphabet.bytes(&name) {
            out[id as usize].bytes = bytes;
        }
    }
    for (id, token) in added {
        out[id as usize] = TokenSpelling {
            bytes: token.content.into_bytes(),
            special: token.special,
        };
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn piece_alphabet_reads_spaces_and_byte_tokens() {
        let a = Alphabet::Pieces {
            space: '▁',
            byte_fallback: true,
        };
        assert_eq!(a.bytes("▁the").as_deref(), Some(&b" the"[..]));
        assert_eq!(a.bytes("<0x0A>").as_deref(), Some(&b"\n"[..]));
        assert_eq!(a.bytes("<0xZZ>"), None);
        assert_eq!(Alphabet::ByteLevel.bytes("\u{120}a").as_deref(), Some(&b" a"[..]));
        assert_eq!(Alphabet::ByteLevel.bytes("\u{4e00}"), None);
    }

    /// Over every fixture tokenizer, the spellings of a text's ids join to
    /// the text, and special tokens are flagged.
    #[test]
    fn fixture_spellings_join_to_the_decoded_text() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
        let text = "{\"naïve\": [1, 2.5e-3], \"城市\": \"Zürich 🙂\"}\n\ttab";
        for name in ["qwen3_moe_tok", "deepseek_v3_tok", "tokenizer_gptoss", "tiktoken_kimi"] {
            let tok = crate::TextTokenizer::from_dir(&root.join(name)).unwrap().unwrap();
            let spellings = tok.token_spellings().unwrap();
            assert!(spellings.len() >= tok.vocab_size(), "{name}");
            let ids = tok.encode(text, false).unwrap();
            let joined: Vec<u8> = ids.iter().flat_map(|&id| spellings[id as usize].bytes.clone()).collect();
            assert_eq!(String::from_utf8(joined).unwrap(), text, "{name}");
            assert!(ids.iter().all(|&id| !spellings[id as usize].special), "{name}");
            assert!(spellings.iter().any(|s| s.special), "{name} has special tokens");
        }
    }

    #[test]
    fn unknown_decoders_are_refused() {
        let wordpiece = serde_json::json!({"type": "WordPiece", "prefix": "##"});
        assert!(Alphabet::of(Some(&wordpiece)).is_err());
        assert!(Alphabet::of(None).is_err());
    }
}
