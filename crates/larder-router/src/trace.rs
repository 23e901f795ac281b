//! Route traces on disk: which experts every token chose at every MoE layer,
//! in which forward pass and phase, and what the routers of later layers
//! would have picked on its input (lookahead). `larder run --trace FILE`
//! writes one; `larder trace stats` and `larder bench cache` read it.
//!
//! The format is JSON Lines. Line 1 is a [`TraceHeader`] (`"larder_trace": 1`
//! names the format and its version); every further line is one
//! [`TraceToken`]. Reading checks every line against the header (expert ids
//! in range, one route per MoE layer, at most top-k experts, no repeats,
//! passes in order) and names the file and line of the first problem, so a
//! truncated or corrupt trace never replays as a different one.
//!
//! Writing is serializing ([`Trace::write_lines`]): which file may be
//! written, and replacing it atomically, is the caller's (larder's commands
//! go through `larder_engine::OutputFile`, which refuses an input of the run, a
//! non-regular file or a file that is not a trace). [`TraceHeader::parse_line`]
//! is the cheap test of whether a file is a trace: its first line.

use std::collections::HashSet;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The format version this build writes and reads.
pub const TRACE_VERSION: u32 = 1;

/// The most routed experts per layer a trace header may claim: 2^31, the
/// most any config.json larder reads may declare (larder-model's
/// `MAX_CONFIG_INT`), so every trace larder records is under it. What reads
/// a trace allocates by the routes it holds, never by this count.
pub const MAX_EXPERTS: usize = 1 << 31;

/// The most bytes one expert's record may claim in a trace header: 2^40
/// (1 TiB, far above any expert's record: DeepSeek-V3's bf16 experts are
/// 2^25), which keeps the byte sums of replaying a trace (2^24 reads of
/// the largest expert) within a u64.
pub const MAX_EXPERT_BYTES: u64 = 1 << 40;

/// Line 1 of a trace: what model it came from and its MoE shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceHeader {
    /// Always [`TRACE_VERSION`].
    pub larder_trace: u32,
    /// Where the model was loaded from (informational).
    pub model: String,
    /// Routed experts per MoE layer.
    pub experts: usize,
    /// Experts each token picks per layer.
    pub top_k: usize,
    /// The decoder layer index of each MoE layer, ascending.
    pub moe_layers: Vec<usize>,
    /// Bytes of one expert's record per MoE layer (same order; what one
    /// cache miss reads).
    pub expert_bytes: Vec<u64>,
    /// Lookahead depths recorded in every token's `predicted` (0: none).
    pub lookahead: usize,
}

/// Whether a token was part of a prompt or generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Prompt,
    Decode,
}

/// One token (one row of one forward pass).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceToken {
    /// Which sequence (conversation) the token belongs to.
    pub seq: usize,
    /// Its position in that sequence.
    pub pos: usize,
    pub phase: Phase,
    /// The forward pass it ran in (0, 1, ...; non-decreasing): a prefill
    /// pass reads the union of its rows' experts once per layer.
    pub pass: usize,
    /// Per MoE layer (header order), the chosen experts, router order.
    pub routes: Vec<Vec<usize>>,
    /// `predicted[d - 1][i]`: the experts MoE layer `i`'s router picks on the
    /// input of the MoE layer `d` before it (empty where there is none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub predicted: Vec<Vec<Vec<usize>>>,
}

/// A whole trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    pub header: TraceHeader,
    pub tokens: Vec<TraceToken>,
}

/// Why a trace cannot be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: empty file: a trace starts with a header line (`larder run --trace FILE` writes one)")]
    Empty { path: PathBuf },
    #[error("{path}, line {line}: {message}")]
    Line { path: PathBuf, line: usize, message: String },
}

impl Trace {
    /// Checks a trace held in memory (what [`Trace::read`] checks per line).
    pub fn check(&self) -> Result<(), String> {
        check_header(&self.header)?;
        let mut last_pass = 0;
        for (i, t) in self.tokens.iter().enumerate() {
            check_token(&self.header, t, last_pass).map_err(|m| format!("token {i}: {m}"))?;
            last_pass = t.pass;
        }
        Ok(())
    }

    /// Reads and checks a trace file.
    pub fn read(path: &Path) -> Result<Trace, TraceError> {
        let io = |source| TraceError::Io {
            path: path.to_path_buf(),
            source,
        };
        let bad = |line: usize, message: String| TraceError::Line {
            path: path.to_path_buf(),
            line,
            message,
        };
        let mut lines = BufReader::new(fs::File::open(path).map_err(io)?).lines();
        let first = lines
            .next()
            .ok_or_else(|| TraceError::Empty { path: path.to_path_buf() })?
            .map_err(io)?;
        let header = TraceHeader::parse_line(&first).map_err(|m| bad(1, m))?;
        let mut tokens = Vec::new();
        let mut last_pass = 0;
        for (i, line) in lines.enumerate() {
            let line = line.map_err(io)?;
            if line.trim().is_empty() {
                continue;
            }
            let t: TraceToken = serde_json::from_str(&line).map_err(|e| bad(i + 2, format!("not a trace token: {e}")))?;
            check_token(&header, &t, last_pass).map_err(|m| bad(i + 2, m))?;
            last_pass = t.pass;
            tokens.push(t);
        }
        Ok(Trace { header, tokens })
    }

    /// Writes the trace as JSON Lines to `out` (the header line, then one
    /// line per token); the caller flushes and places the file.
    pub fn write_lines(&self, mut out: impl Write) -> std::io::Result<()> {
        serde_json::to_writer(&mut out, &self.header)?;
        out.write_all(b"\n")?;
        for t in &self.tokens {
            serde_json::to_writer(&mut out, t)?;
            out.write_all(b"\n")?;
        }
        Ok(())
    }

    /// Bytes of all experts of all MoE layers (saturating: a header is
    /// checked on reading, not when built in memory).
    pub fn bank_bytes(&self) -> u64 {
        self.header
            .expert_bytes
            .iter()
            .map(|b| b.saturating_mul(self.header.experts as u64))
            .fold(0, u64::saturating_add)
    }
}

impl TraceHeader {
    /// Parses and checks line 1 of a trace file (the message says why it is
    /// not one).
    pub fn parse_line(line: &str) -> Result<TraceHeader, String> {
        let header: TraceHeader = serde_json::from_str(line).map_err(|e| format!("not a trace header: {e}"))?;
        check_header(&header)?;
        Ok(header)
    }
}

fn check_header(h: &TraceHeader) -> Result<(), String> {
    if h.larder_trace != TRACE_VERSION {
        return Err(format!(
            "larder_trace = {}: this build reads version {TRACE_VERSION}; record the trace again",
            h.larder_trace
        ));
    }
    if h.experts == 0 || h.top_k == 0 || h.top_k > h.experts {
        return Err(format!("experts = {}, top_k = {}: need 1 <= top_k <= experts", h.experts, h.top_k));
    }
    if h.experts > MAX_EXPERTS {
        return Err(format!(
            "experts = {}: more than the {MAX_EXPERTS} experts per layer any model larder loads may have",
            h.experts
        ));
    }
    if h.moe_layers.is_empty() || h.moe_layers.windows(2).any(|w| w[0] >= w[1]) {
        return Err("moe_layers must be a non-empty ascending list of layer indices".into());
    }
    if h.expert_bytes.len() != h.moe_layers.len() {
        return Err(format!(
            "expert_bytes has {} entries for {} moe_layers: one per MoE layer",
            h.expert_bytes.len(),
            h.moe_layers.len()
        ));
    }
    if h.expert_bytes.contains(&0) {
        return Err("expert_bytes has a 0: every MoE layer's expert has a size in bytes".into());
    }
    if let Some(b) = h.expert_bytes.iter().find(|&&b| b > MAX_EXPERT_BYTES) {
        return Err(format!(
            "expert_bytes has {b}: more than the {MAX_EXPERT_BYTES} bytes (1 TiB) an expert's record may have"
        ));
    }
    if h.lookahead > h.moe_layers.len() {
        return Err(format!(
            "lookahead = {} is more than the {} MoE layers",
            h.lookahead,
            h.moe_layers.len()
        ));
    }
    Ok(())
}

fn check_token(h: &TraceHeader, t: &TraceToken, last_pass: usize) -> Result<(), String> {
    if t.pass < last_pass {
        return Err(format!("pass {} after pass {last_pass}: passes must not go backwards", t.pass));
    }
    if t.routes.len() != h.moe_layers.len() {
        return Err(format!(
            "routes has {} layers; the header has {} MoE layers",
            t.routes.len(),
            h.moe_layers.len()
        ));
    }
    check_lists(h, &t.routes, "routes")?;
    if !t.predicted.is_empty() && t.predicted.len() != h.lookahead {
        return Err(format!(
            "predicted has {} depths; the header's lookahead is {}",
            t.predicted.len(),
            h.lookahead
        ));
    }
    for (d, depth) in t.predicted.iter().enumerate() {
        if depth.len() != h.moe_layers.len() {
            return Err(format!("predicted[{d}] has {} layers, not {}", depth.len(), h.moe_layers.len()));
        }
        check_lists(h, depth, "predicted")?;
    }
    Ok(())
}

fn check_lists(h: &TraceHeader, lists: &[Vec<usize>], what: &str) -> Result<(), String> {
    for (i, experts) in lists.iter().enumerate() {
        if experts.len() > h.top_k {
            return Err(format!("{what}[{i}] has {} experts; top_k is {}", experts.len(), h.top_k));
        }
        if let Some(e) = experts.iter().find(|&&e| e >= h.experts) {
            return Err(format!("{what}[{i}] names expert {e}; the model has {}", h.experts));
        }
        if experts.iter().collect::<HashSet<_>>().len() != experts.len() {
            return Err(format!("{what}[{i}] repeats an expert"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Trace {
        let header = TraceHeader {
            larder_trace: TRACE_VERSION,
            model: "m".into(),
            experts: 8,
            top_k: 2,
            moe_layers: vec![1, 2],
            expert_bytes: vec![100, 100],
            lookahead: 1,
        };
        let tok = |pos, pass, phase, a: [usize; 2], b: [usize; 2]| TraceToken {
            seq: 0,
            pos,
            phase,
            pass,
            routes: vec![a.to_vec(), b.to_vec()],
            predicted: vec![vec![vec![], a.to_vec()]],
        };
        Trace {
            header,
            tokens: vec![
                tok(0, 0, Phase::Prompt, [0, 1], [2, 3]),
                tok(1, 0, Phase::Prompt, [1, 2], [3, 4]),
                tok(2, 1, Phase::Decode, [0, 1], [2, 3]),
            ],
        }
    }

    #[test]
    fn round_trips_and_refuses_damage_by_line() {
        let dir = std::env::temp_dir().join(format!("larder-trace-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.jsonl");
        let t = sample();
        t.write_lines(fs::File::create(&path).unwrap()).unwrap();
        assert_eq!(Trace::read(&path).unwrap(), t);
        let text = fs::read_to_string(&path).unwrap();
        let cases = [
            (text[..text.len() - 20].to_string(), "line 4"),
            (text.replace("\"experts\":8", "\"experts\":2"), "line 2"),
            (text.replace("\"larder_trace\":1", "\"larder_trace\":9"), "larder_trace = 9"),
            (text.replace("\"pass\":1", "\"pass\":0,\"extra\":1"), "unknown field"),
            (String::new(), "empty file"),
        ];
        for (body, want) in cases {
            fs::write(&path, body).unwrap();
            let e = Trace::read(&path).unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("t.jsonl"), "{e} lacks {want}");
        }
        fs::remove_dir_all(&dir).unwrap();
    }
}
