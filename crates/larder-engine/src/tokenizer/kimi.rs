//! Kimi's tokenizer: `tiktoken.model` (byte-level BPE by rank, see
//! [`super::tiktoken`]) plus the special tokens of `tokenizer_config.json`,
//! as the `TikTokenTokenizer` of Kimi's `tokenization_kimi.py` (Kimi-K2,
//! Kimi Linear, Kimi K3) defines them:
//! - the pre-tokenizer regex is its class constant `pat_str` ([`KIMI_PAT_STR`]);
//! - special tokens take the ids right after the ranks, each named by
//!   `added_tokens_decoder` or else `<|reserved_token_{id}|>`: K2's and Kimi
//!   Linear's file reserves `num_reserved_special_tokens + 2` = 258 of them
//!   ([`KIMI_SPECIAL_IDS`]), K3's 256 ([`KIMI_K3_SPECIAL_IDS`], 163,840 ids
//!   in all over its 163,584 ranks);
//! - its `encode` cuts the text into runs of at most 25,000 whitespace or
//!   non-whitespace characters (Python's `str.isspace`) before tiktoken, and
//!   matches every special token in the text (`allowed_special="all"`); K3's
//!   chat encoder encodes message text with none matched
//!   (`allow_special_tokens=False`, [`KimiTokenizer::encode_with`]);
//! - decoding joins the bytes of the ids and replaces invalid UTF-8; with
//!   special tokens skipped, an added token marked `"special": false` (K3's
//!   `<|open|>`, `<|close|>`, `<|sep|>`) is still text and is kept.
//!
//! The regex runs on `fancy-regex` (through `tokenizers::utils::SysRegex`,
//! the `tokenizers` crate being built with its fancy-regex backend), the
//! engine tiktoken itself uses, so pieces split as tiktoken splits them.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::LazyLock;

use serde_json::Value as Json;
use tokenizers::utils::SysRegex;

use super::tiktoken::Ranks;
use crate::error::EngineError;

/// `pat_str` of Kimi's `tokenization_kimi.py`: Han runs alone; letter runs
/// split at case changes, English contractions attached; digits in threes;
/// other symbols with one leading space; newline and whitespace runs.
pub(super) const KIMI_PAT_STR: &str = concat!(
    r"[\p{Han}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"|\s*[\r\n]+",
    r"|\s+(?!\S)",
    r"|\s+",
);

/// Special-token ids after the ranks in K2's and Kimi Linear's
/// `tokenization_kimi.py`: `num_reserved_special_tokens` (256) + 2.
pub const KIMI_SPECIAL_IDS: u32 = 258;
/// Special-token ids after the ranks in K3's `tokenization_kimi.py`:
/// `num_reserved_special_tokens` (256), ids 163,584..=163,839.
pub const KIMI_K3_SPECIAL_IDS: u32 = 256;
/// Longest run of whitespace or non-whitespace characters handed to tiktoken at once.
const MAX_RUN_CHARS: usize = 25_000;
/// Longest text handed to tiktoken at once, in characters.
const MAX_ENCODE_CHARS: usize = 400_000;
/// `tokenizer_config.json` fields that name one special token each.
const NAMED_TOKEN_FIELDS: [&str; 4] = ["bos_token", "eos_token", "unk_token", "pad_token"];

/// A loaded Kimi tokenizer.
pub(crate) struct KimiTokenizer {
    ranks: Ranks,
    pattern: SysRegex,
    /// Name of special id `ranks.len() + i` at index i.
    special_names: Vec<String>,
    special_ids: HashMap<String, u32>,
    /// Added tokens marked `"special": false`: decoded as text even when
    /// special tokens are skipped.
    text_specials: HashSet<u32>,
    /// Special ids by the first byte of their name, longest name first.
    specials_by_first_byte: HashMap<u8, Vec<u32>>,
}

impl KimiTokenizer {
    /// Loads `model` (`tiktoken.model`) with the special tokens of `config`
    /// (`tokenizer_config.json`), `reserved` special ids after the ranks
    /// ([`KIMI_SPECIAL_IDS`] or [`KIMI_K3_SPECIAL_IDS`]); every fault names
    /// its file (and line).
    pub(crate) fn load(model: &Path, config: &Path, reserved: u32) -> Result<Self, EngineError> {
        let ranks = Ranks::from_file(model)?;
        let config_text = std::fs::read_to_string(config).map_err(|source| EngineError::Io {
            path: config.to_path_buf(),
            source,
        })?;
        let json: Json = serde_json::from_str(&config_text).map_err(|e| file_error(config, format!("not valid JSON: {e}")))?;
        let Specials {
            names: special_names,
            text,
        } = special_names(&ranks, &json, &config_text, (model, config), reserved)?;
        let pattern = SysRegex::new(KIMI_PAT_STR).map_err(|e| EngineError::Tokenizer(format!("Kimi's pre-tokenizer regex: {e}")))?;
        let base = ranks.len() as u32;
        let special_ids: HashMap<String, u32> = special_names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), base + i as u32))
            .collect();
        let mut specials_by_first_byte: HashMap<u8, Vec<u32>> = HashMap::new();
        for (name, &id) in &special_ids {
            specials_by_first_byte.entry(name.as_bytes()[0]).or_default().push(id);
        }
        for ids in specials_by_first_byte.values_mut() {
            ids.sort_by_key(|&id| (std::cmp::Reverse(special_names[(id - base) as usize].len()), id));
        }
        let text_specials = text.into_iter().map(|i| base + i).collect();
        let tokenizer = KimiTokenizer {
            ranks,
            pattern,
            special_names,
            special_ids,
            text_specials,
            specials_by_first_byte,
        };
        tokenizer.check_named_tokens(&json, config)?;
        Ok(tokenizer)
    }

    /// `bos_token`, `eos_token`, ... must each be a special token, as Kimi's
    /// tokenizer looks their ids up among them.
    fn check_named_tokens(&self, json: &Json, config: &Path) -> Result<(), EngineError> {
        for field in NAMED_TOKEN_FIELDS {
            let name = match json.get(field) {
                None | Some(Json::Null) => continue,
                Some(Json::String(s)) => s.as_str(),
                Some(v) => match v.get("content").and_then(Json::as_str) {
                    Some(s) => s,
                    None => return Err(file_error(config, format!("{field} is neither a string nor {{\"content\": ...}}"))),
                },
            };
            if !self.special_ids.contains_key(name) {
                return Err(file_error(config, format!("{field} {name:?} is not one of the special tokens")));
            }
        }
        Ok(())
    }

    /// Ids of `text`, special tokens matched wherever they occur.
    pub(crate) fn encode(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        self.encode_with(text, true)
    }

    /// Ids of `text`; special tokens are matched only when `allow_special`
    /// (otherwise their spellings are ordinary text, tiktoken's
    /// `disallowed_special=()`). Either way the text is cut into runs first.
    pub(crate) fn encode_with(&self, text: &str, allow_special: bool) -> Result<Vec<u32>, EngineError> {
        let mut ids = Vec::new();
        for run in kimi_runs(text) {
            let mut start = 0;
            let next_special = |from| if allow_special { self.next_special(run, from) } else { None };
            while let Some((at, id)) = next_special(start) {
                self.encode_ordinary(&run[start..at], &mut ids)?;
                ids.push(id);
                start = at + self.special_name(id).len();
            }
            self.encode_ordinary(&run[start..], &mut ids)?;
        }
        Ok(ids)
    }

    /// The first special token at or after byte `from` of `text`: (offset, id).
    fn next_special(&self, text: &str, from: usize) -> Option<(usize, u32)> {
        let rest = &text.as_bytes()[from..];
        rest.iter().enumerate().find_map(|(offset, byte)| {
            let candidates = self.specials_by_first_byte.get(byte)?;
            let at = &rest[offset..];
            let id = candidates.iter().find(|&&id| at.starts_with(self.special_name(id).as_bytes()))?;
            Some((from + offset, *id))
        })
    }

    /// Ids of `text` holding no special token: regex pieces, BPE on each.
    fn encode_ordinary(&self, text: &str, ids: &mut Vec<u32>) -> Result<(), EngineError> {
        let mut covered = 0;
        for (start, end) in self.pattern.find_iter(text) {
            if start != covered {
                break;
            }
            self.ranks.encode_piece(&text.as_bytes()[start..end], ids);
            covered = end;
        }
        // KIMI_PAT_STR matches every character, so a gap means the regex
        // engine gave up (its backtracking limit) rather than drop text.
        if covered != text.len() {
            return Err(EngineError::Tokenizer(format!(
                "Kimi's pre-tokenizer regex stopped at byte {covered} of a {}-byte run of text",
                text.len()
            )));
        }
        Ok(())
    }

    /// Text of `ids` (invalid UTF-8 replaced by U+FFFD), special tokens left
    /// out when `skip_special_tokens` (but not those marked `"special": false`).
    pub(crate) fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, EngineError> {
        let mut bytes = Vec::new();
        for &id in ids {
            if let Some(token) = self.ranks.bytes(id) {
                bytes.extend_from_slice(token);
            } else if self.is_special(id) {
                if !skip_special_tokens || self.text_specials.contains(&id) {
                    bytes.extend_from_slice(self.special_name(id).as_bytes());
                }
            } else {
                return Err(EngineError::Tokenizer(format!(
                    "cannot decode id {id}: the vocabulary has {} ids",
                    self.vocab_size()
                )));
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The id of a token: a special token's name, or a BPE token spelled in
    /// GPT-2's byte-level alphabet (as Kimi's `get_vocab` spells them).
    pub(crate) fn token_to_id(&self, token: &str) -> Option<u32> {
        if let Some(&id) = self.special_ids.get(token) {
            return Some(id);
        }
        let bytes: Option<Vec<u8>> = token.chars().map(byte_of_char).collect();
        self.ranks.rank(&bytes?)
    }

    /// Token string -> id for every id, as [`Self::token_to_id`] spells them.
    pub(crate) fn vocab(&self) -> HashMap<String, u32> {
        let mut vocab: HashMap<String, u32> = self.ranks.iter().map(|(bytes, rank)| (byte_level(bytes), rank)).collect();
        vocab.extend(self.special_ids.iter().map(|(name, &id)| (name.clone(), id)));
        vocab
    }

    /// Ranks plus the special ids.
    pub(crate) fn vocab_size(&self) -> usize {
        self.ranks.len() + self.special_names.len()
    }

    /// Each id's bytes and whether it is a special token (one marked
    /// `"special": false` is text, like a rank); index = id.
    pub(crate) fn token_spellings(&self) -> Vec<super::TokenSpelling> {
        let ranks = (0..self.ranks.len() as u32).map(|rank| super::TokenSpelling {
            bytes: self.ranks.bytes(rank).unwrap_or_default().to_vec(),
            special: false,
        });
        let base = self.ranks.len() as u32;
        let specials = self.special_names.iter().enumerate().map(|(i, name)| super::TokenSpelling {
            bytes: name.as_bytes().to_vec(),
            special: !self.text_specials.contains(&(base + i as u32)),
        });
        ranks.chain(specials).collect()
    }

    fn is_special(&self, id: u32) -> bool {
        id >= self.ranks.len() as u32 && ((id - self.ranks.len() as u32) as usize) < self.special_names.len()
    }

    fn special_name(&self, id: u32) -> &str {
        &self.special_names[(id - self.ranks.len() as u32) as usize]
    }
}

/// The special ids after the ranks: their names (index i names id
/// `ranks.len() + i`) and the indexes of those marked `"special": false`.
struct Specials {
    names: Vec<String>,
    text: Vec<u32>,
}

/// Names of the `reserved` special ids after the ranks, from
/// `added_tokens_decoder` (ids as keys, `{"content": name}` as values) or
/// `<|reserved_token_{id}|>`.
fn special_names(ranks: &Ranks, json: &Json, config_text: &str, files: (&Path, &Path), reserved: u32) -> Result<Specials, EngineError> {
    let (model, config) = files;
    let base = ranks.len() as u32;
    let mut names: Vec<String> = (base..base + reserved).map(|id| format!("<|reserved_token_{id}|>")).collect();
    let mut text = Vec::new();
    let decoder = match json.get("added_tokens_decoder") {
        None | Some(Json::Null) => None,
        Some(Json::Object(map)) => Some(map),
        Some(_) => return Err(file_error(config, "added_tokens_decoder is not an object".into())),
    };
    for (key, entry) in decoder.into_iter().flatten() {
        let at = line_of(config_text, &format!("\"{key}\""));
        let id: u32 = key
            .parse()
            .map_err(|_| file_error(config, format!("{at}added_tokens_decoder key {key:?} is not a token id")))?;
        let Some(name) = entry.get("content").and_then(Json::as_str).filter(|s| !s.is_empty()) else {
            return Err(file_error(
                config,
                format!("{at}added_tokens_decoder[{key:?}] has no non-empty \"content\""),
            ));
        };
        if id < base {
            let message = format!(
                "{at}added_tokens_decoder id {id} ({name:?}) collides with BPE rank {id} (line {} of {})",
                ranks.line(id).unwrap_or(0),
                model.display()
            );
            return Err(file_error(config, message));
        }
        if id >= base + reserved {
            let message = format!(
                "{at}added_tokens_decoder id {id} ({name:?}) is past the special ids {base}..{} that follow the {base} ranks of {}",
                base + reserved - 1,
                model.display()
            );
            return Err(file_error(config, message));
        }
        names[(id - base) as usize] = name.to_string();
        match entry.get("special") {
            None | Some(Json::Null) | Some(Json::Bool(true)) => {}
            Some(Json::Bool(false)) => text.push(id - base),
            Some(_) => {
                return Err(file_error(
                    config,
                    format!("{at}added_tokens_decoder[{key:?}].special is neither true nor false"),
                ))
            }
        }
    }
    let mut seen: HashMap<&str, u32> = HashMap::new();
    for (i, name) in names.iter().enumerate() {
        if let Some(other) = seen.insert(name, base + i as u32) {
            let message = format!("special token {name:?} names two ids, {other} and {}", base + i as u32);
            return Err(file_error(config, message));
        }
    }
    Ok(Specials { names, text })
}

/// "line N: " for the first line of `text` holding `needle`, or "".
fn line_of(text: &str, needle: &str) -> String {
    text.lines()
        .position(|line| line.contains(needle))
        .map(|i| format!("line {}: ", i + 1))
        .unwrap_or_default()
}

/// Kimi's cut of `text` before tiktoken: chunks of 400,000 characters, each
/// cut into runs of at most 25,000 characters of one kind (whitespace or not).
fn kimi_runs(text: &str) -> Vec<&str> {
    let mut runs = Vec::new();
    let mut chars_in_chunk = 0;
    let mut run_start = 0;
    let mut run_len = 0;
    let mut run_is_space = text.chars().next().is_some_and(python_isspace);
    for (at, c) in text.char_indices() {
        if chars_in_chunk == MAX_ENCODE_CHARS {
            runs.push(&text[run_start..at]);
            (chars_in_chunk, run_start, run_len, run_is_space) = (0, at, 0, python_isspace(c));
        }
        chars_in_chunk += 1;
        if python_isspace(c) != run_is_space {
            (run_len, run_is_space) = (1, !run_is_space);
        } else {
            run_len += 1;
            if run_len > MAX_RUN_CHARS {
                runs.push(&text[run_start..at]);
                (run_start, run_len) = (at, 1);
            }
        }
    }
    runs.push(&text[run_start..]);
    runs
}

/// Python's `str.isspace`: Unicode White_Space plus the separators U+001C..U+001F.
pub(crate) fn python_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// GPT-2's printable stand-in for each byte (`bytes_to_unicode`): printable
/// Latin-1 bytes stand for themselves, the others for U+0100 onwards in order.
static CHAR_OF_BYTE: LazyLock<[char; 256]> = LazyLock::new(|| {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut table = ['\0'; 256];
    let mut next_stand_in = 256u32;
    for byte in 0..=255u8 {
        table[byte as usize] = if printable(byte) {
            byte as char
        } else {
            next_stand_in += 1;
            char::from_u32(next_stand_in - 1).unwrap_or('\u{FFFD}')
        };
    }
    table
});

pub(super) fn byte_of_char(c: char) -> Option<u8> {
    CHAR_OF_BYTE.iter().position(|&stand_in| stand_in == c).map(|b| b as u8)
}

fn byte_level(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| CHAR_OF_BYTE[b as usize]).collect()
}

fn file_error(path: &Path, message: String) -> EngineError {
    EngineError::File {
        path: path.to_path_buf(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_chars(text: &str) -> Vec<usize> {
        kimi_runs(text).iter().map(|run| run.chars().count()).collect()
    }

    /// Run lengths Kimi's split gives for the same texts in Python 3.11.
    #[test]
    fn runs_are_cut_as_kimis_split_cuts_them() {
        assert_eq!(run_chars(""), vec![0]);
        assert_eq!(run_chars(&"a".repeat(25_001)), vec![25_000, 1]);
        // U+001C..U+001F are whitespace to Python's str.isspace.
        assert_eq!(run_chars(&"\u{1c}".repeat(25_001)), vec![25_000, 1]);
        assert_eq!(run_chars(&(" ".repeat(25_000) + "\u{1c}")), vec![25_000, 1]);
        // A change of kind restarts the count but does not cut; each
        // 400,000-character chunk is cut on its own.
        let text = "a".repeat(399_999) + " " + &"b".repeat(25_001);
        let mut want = vec![25_000; 17];
        want.push(1);
        assert_eq!(run_chars(&text), want);
    }

    #[test]
    fn byte_level_alphabet_is_gpt2s() {
        assert_eq!(byte_level(b" the\n"), "\u{120}the\u{10a}");
        assert_eq!(byte_of_char('\u{120}'), Some(b' '));
        assert_eq!(byte_of_char('a'), Some(b'a'));
        assert_eq!(byte_of_char('\u{4e00}'), None);
    }
}
