//! tiktoken's rank files and its byte-pair encoding by rank.
//!
//! A rank file (`tiktoken.model` in Kimi checkpoints, `*.tiktoken` for
//! OpenAI's encodings) holds one `base64(token bytes) rank` pair per line; a
//! lower rank merges first. [`Ranks`] loads one strictly (every fault names the
//! file and line) and encodes one pre-tokenized piece the way tiktoken does:
//! a piece that is itself a token is that token; otherwise, starting from
//! single bytes, the adjacent pair whose concatenation has the lowest rank is
//! merged (the leftmost on a tie) until no adjacent pair is a token.

use std::collections::HashMap;
use std::path::Path;

use crate::error::EngineError;

/// Token bytes <-> rank of a rank file: ranks are exactly `0..len()`, and
/// every single byte is a token (so every piece can be encoded).
pub(crate) struct Ranks {
    by_bytes: HashMap<Vec<u8>, u32>,
    by_rank: Vec<Vec<u8>>,
    /// 1-based line of each rank in its file.
    line_of_rank: Vec<usize>,
}

/// One parsed line: the token, its rank, and its 1-based line number.
struct RankLine {
    token: Vec<u8>,
    rank: u32,
    line: usize,
}

impl Ranks {
    /// Reads and checks the rank file at `path`.
    pub(crate) fn from_file(path: &Path) -> Result<Self, EngineError> {
        let bytes = std::fs::read(path).map_err(|source| EngineError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let text = String::from_utf8(bytes).map_err(|e| {
            let at = e.utf8_error().valid_up_to();
            let line = 1 + e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count();
            file_error(path, format!("line {line}: not UTF-8 text (a rank file is base64 and digits)"))
        })?;
        Self::parse(path, &text)
    }

    /// Parses the text of a rank file; `path` only names it in errors.
    /// Empty lines are skipped, as tiktoken's loader skips them.
    pub(crate) fn parse(path: &Path, text: &str) -> Result<Self, EngineError> {
        let mut entries = Vec::new();
        for (index, line) in text.lines().enumerate() {
            if !line.is_empty() {
                entries.push(parse_line(line, index + 1).map_err(|message| file_error(path, message))?);
            }
        }
        Self::from_entries(path, entries)
    }

    fn from_entries(path: &Path, entries: Vec<RankLine>) -> Result<Self, EngineError> {
        let mut by_bytes: HashMap<Vec<u8>, u32> = HashMap::with_capacity(entries.len());
        let mut first_line_of_rank: HashMap<u32, usize> = HashMap::with_capacity(entries.len());
        let mut line_of_token: HashMap<&[u8], usize> = HashMap::with_capacity(entries.len());
        for e in &entries {
            if let Some(first) = first_line_of_rank.insert(e.rank, e.line) {
                let message = format!("line {}: rank {} is also the rank on line {first} (duplicate rank)", e.line, e.rank);
                return Err(file_error(path, message));
            }
            if let Some(first) = line_of_token.insert(&e.token, e.line) {
                let message = format!(
                    "line {}: token {:?} is also the token on line {first} (duplicate token)",
                    e.line,
                    lossy(&e.token)
                );
                return Err(file_error(path, message));
            }
        }
        let count = entries.len();
        // Kimi numbers its special tokens from the count of ranks and decodes
        // every id below that count, so a gap would break both.
        if let Some(e) = entries.iter().find(|e| e.rank as usize >= count) {
            let message = format!(
                "line {}: rank {} is past the {count} ranks of the file: ranks must be 0..{} without gaps",
                e.line,
                e.rank,
                count.saturating_sub(1)
            );
            return Err(file_error(path, message));
        }
        let mut by_rank = vec![Vec::new(); count];
        let mut line_of_rank = vec![0; count];
        for e in entries {
            by_rank[e.rank as usize] = e.token.clone();
            line_of_rank[e.rank as usize] = e.line;
            by_bytes.insert(e.token, e.rank);
        }
        if let Some(byte) = (0..=255u8).find(|b| !by_bytes.contains_key(&[*b][..])) {
            let message = format!("byte 0x{byte:02x} has no rank: every single byte must be a token, or some text cannot be encoded");
            return Err(file_error(path, message));
        }
        Ok(Ranks {
            by_bytes,
            by_rank,
            line_of_rank,
        })
    }

    /// Number of ranks (the first id after them is Kimi's first special token).
    pub(crate) fn len(&self) -> usize {
        self.by_rank.len()
    }

    /// The line of rank `rank` in its file.
    pub(crate) fn line(&self, rank: u32) -> Option<usize> {
        self.line_of_rank.get(rank as usize).copied()
    }

    /// The bytes of rank `rank`, if there is one.
    pub(crate) fn bytes(&self, rank: u32) -> Option<&[u8]> {
        self.by_rank.get(rank as usize).map(Vec::as_slice)
    }

    /// The rank of `token`, if it is one.
    pub(crate) fn rank(&self, token: &[u8]) -> Option<u32> {
        self.by_bytes.get(token).copied()
    }

    /// Every token with its rank.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], u32)> {
        self.by_rank.iter().enumerate().map(|(rank, token)| (token.as_slice(), rank as u32))
    }

    /// Appends the ids of one pre-tokenized `piece` (non-empty) to `out`.
    pub(crate) fn encode_piece(&self, piece: &[u8], out: &mut Vec<u32>) {
        if let Some(rank) = self.rank(piece) {
            out.push(rank);
            return;
        }
        // bounds[i]..bounds[i + 1] is part i; merge_rank[i] is the rank of
        // parts i and i + 1 together (u32::MAX: not a token).
        let mut bounds: Vec<usize> = (0..=piece.len()).collect();
        let mut merge_rank: Vec<u32> = (0..piece.len().saturating_sub(1))
            .map(|i| self.rank_or_max(&piece[i..i + 2]))
            .collect();
        while let Some(i) = lowest_leftmost(&merge_rank) {
            bounds.remove(i + 1);
            merge_rank.remove(i);
            if i + 2 < bounds.len() {
                merge_rank[i] = self.rank_or_max(&piece[bounds[i]..bounds[i + 2]]);
            }
            if i > 0 {
                merge_rank[i - 1] = self.rank_or_max(&piece[bounds[i - 1]..bounds[i + 1]]);
            }
        }
        for part in bounds.windows(2) {
            // Every part is a single byte or the result of a merge: a token.
            out.push(self.rank_or_max(&piece[part[0]..part[1]]));
        }
    }

    fn rank_or_max(&self, token: &[u8]) -> u32 {
        self.rank(token).unwrap_or(u32::MAX)
    }
}

/// Index of the lowest rank below `u32::MAX`, the first one on a tie.
fn lowest_leftmost(ranks: &[u32]) -> Option<usize> {
    let mut best: Option<(u32, usize)> = None;
    for (i, &rank) in ranks.iter().enumerate() {
        if rank != u32::MAX && best.is_none_or(|(b, _)| rank < b) {
            best = Some((rank, i));
        }
    }
    best.map(|(_, i)| i)
}

/// `base64-token rank` (whitespace between, nothing else).
fn parse_line(line: &str, number: usize) -> Result<RankLine, String> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let [token, rank] = fields[..] else {
        return Err(format!(
            "line {number}: expected `base64-token rank`, found {} field(s) in {:?}",
            fields.len(),
            truncate(line)
        ));
    };
    let token = decode_base64(token).map_err(|why| format!("line {number}: token {:?} is not base64: {why}", truncate(token)))?;
    if token.is_empty() {
        return Err(format!("line {number}: the token is empty"));
    }
    if rank.is_empty() || !rank.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("line {number}: rank {:?} is not a non-negative integer", truncate(rank)));
    }
    let rank: u32 = rank
        .parse()
        .ok()
        .filter(|&r| r < u32::MAX)
        .ok_or_else(|| format!("line {number}: rank {rank} is too large (ranks are below {})", u32::MAX))?;
    Ok(RankLine { token, rank, line: number })
}

/// Standard base64 with `=` padding to a multiple of 4 characters.
fn decode_base64(text: &str) -> Result<Vec<u8>, String> {
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return Err(format!("{} characters, not a multiple of 4", bytes.len()));
    }
    let padding = bytes.iter().rev().take_while(|&&b| b == b'=').count();
    if padding > 2 {
        return Err("more than two `=` at the end".into());
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for &c in &bytes[..bytes.len() - padding] {
        let value = base64_value(c).ok_or_else(|| format!("character {:?} is not in the base64 alphabet", c as char))?;
        acc = (acc << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

fn base64_value(c: u8) -> Option<u8> {
    match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

fn file_error(path: &Path, message: String) -> EngineError {
    EngineError::File {
        path: path.to_path_buf(),
        message,
    }
}

/// At most 40 characters of `text`, for error messages.
fn truncate(text: &str) -> String {
    text.chars().take(40).collect()
}

fn lossy(bytes: &[u8]) -> String {
    truncate(&String::from_utf8_lossy(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranks(extra: &[&[u8]]) -> Ranks {
        let mut entries: Vec<RankLine> = (0..=255u8)
            .map(|b| RankLine {
                token: vec![b],
                rank: b as u32,
                line: 0,
            })
            .collect();
        for (i, token) in extra.iter().enumerate() {
            entries.push(RankLine {
                token: token.to_vec(),
                rank: 256 + i as u32,
                line: 0,
            });
        }
        Ranks::from_entries(Path::new("t"), entries).unwrap()
    }

    fn encode(r: &Ranks, piece: &[u8]) -> Vec<u32> {
        let mut out = Vec::new();
        r.encode_piece(piece, &mut out);
        out
    }

    #[test]
    fn lowest_rank_merges_first_and_ties_go_left() {
        let r = ranks(&[b"aa", b"ab", b"aab"]);
        // "aab": "aa" (256) merges before "ab" (257), then "aa"+"b" = "aab" (258) as the whole piece.
        assert_eq!(encode(&r, b"aab"), vec![258]);
        // "aaa": two "aa" candidates of equal rank, the left one wins.
        assert_eq!(encode(&r, b"aaa"), vec![256, b'a' as u32]);
        // "abab": no merge of "ab"+"ab", two tokens.
        assert_eq!(encode(&r, b"abab"), vec![257, 257]);
    }

    #[test]
    fn base64_is_strict() {
        assert_eq!(decode_base64("aGk=").unwrap(), b"hi");
        assert_eq!(decode_base64("aGVsbG8=").unwrap(), b"hello");
        assert!(decode_base64("aGk").is_err());
        assert!(decode_base64("a*k=").is_err());
        assert!(decode_base64("a===").is_err());
    }
}
