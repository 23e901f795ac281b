//! A model's output split into reasoning, content and tool calls, per
//! family, whole or as it streams.
//!
//! Every family implements [`OutputParser`]: `parse` reads a finished
//! output; `parse_partial` reads an unfinished one and returns only what no
//! continuation can change (so each field of `parse_partial(prefix)` is a
//! prefix of the same field of `parse(whole)`). [`StreamParser`] turns that
//! into deltas: after each piece of text, what is new since the last call;
//! at the end, the rest. Streamed deltas joined equal `parse` of the whole
//! text, wherever the text was split (tests split at every byte).
//!
//! Bad output is never an error: a tool-call section that does not parse
//! (malformed JSON, a marker missing, truncated by `max_tokens`) is
//! returned as content, as written, with no calls, and the request
//! finishes with `stop` ([`ParsedOutput::finish_reason`]). Calls are
//! therefore streamed when their section is complete, each whole in one
//! delta (OpenAI's stream format allows a call's arguments in one delta).
//!
//! The text parsed is the generated text decoded with special tokens kept
//! (the markers are special tokens in DeepSeek-V3, Kimi-K2 and gpt-oss),
//! without the stop token.
//!
//! Families (docs/tools.md has each format and the sources read):
//! [`hermes`] (Qwen3, Qwen2.5, Hermes: `<tool_call>` JSON), [`deepseek_v3`],
//! [`kimi_k2`], [`harmony`] (gpt-oss); reasoning: [`crate::reasoning`].

pub mod deepseek_v3;
pub mod harmony;
pub mod hermes;
pub mod kimi_k2;
pub mod kimi_k3;

use serde::{Deserialize, Serialize};

/// One tool call the model made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParsedToolCall {
    /// The model's own id for the call, where its format has one (Kimi-K2's
    /// `functions.NAME:IDX`); else the server makes one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub name: String,
    /// The arguments as JSON text (checked to parse).
    pub arguments: String,
}

/// A model's output, split.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParsedOutput {
    /// Reasoning (`reasoning_content`), apart from the answer.
    #[serde(default)]
    pub reasoning: String,
    /// The answer (`content`).
    #[serde(default)]
    pub content: String,
    #[serde(default)]
    pub tool_calls: Vec<ParsedToolCall>,
}

impl ParsedOutput {
    /// Plain content.
    pub fn content(text: &str) -> Self {
        ParsedOutput {
            content: text.to_string(),
            ..Default::default()
        }
    }

    /// `tool_calls` when the model called tools, else `stop` (for a request
    /// that ended on a stop token; `length` is the caller's to say).
    pub fn finish_reason(&self) -> &'static str {
        if self.tool_calls.is_empty() {
            "stop"
        } else {
            "tool_calls"
        }
    }
}

/// A family's reader of model output.
pub trait OutputParser: Send + Sync {
    /// Splits a finished output.
    fn parse(&self, text: &str) -> ParsedOutput;
    /// What of an unfinished output no continuation changes: each field a
    /// prefix of the field `parse` gives for any continuation.
    fn parse_partial(&self, text: &str) -> ParsedOutput;
}

/// One piece of a streamed output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    Reasoning(String),
    Content(String),
    /// Call number `index` of this output, whole.
    ToolCall {
        index: usize,
        call: ParsedToolCall,
    },
}

/// Streams an [`OutputParser`]'s split as text arrives.
///
/// Each push re-reads the text so far (linear in its length): fine for the
/// outputs of a chat turn; a parser that resumes where it stopped is left
/// for when long outputs show the cost.
pub struct StreamParser<P> {
    parser: P,
    text: String,
    sent: ParsedOutput,
}

impl<P: OutputParser> StreamParser<P> {
    pub fn new(parser: P) -> Self {
        StreamParser {
            parser,
            text: String::new(),
            sent: ParsedOutput::default(),
        }
    }

    /// The deltas `piece` makes certain.
    pub fn push(&mut self, piece: &str) -> Vec<Delta> {
        self.text.push_str(piece);
        let now = self.parser.parse_partial(&self.text);
        self.advance(now)
    }

    /// The rest, once the output has ended; the whole split.
    pub fn finish(mut self) -> (Vec<Delta>, ParsedOutput) {
        let whole = self.parser.parse(&self.text);
        let deltas = self.advance(whole.clone());
        (deltas, whole)
    }

    /// Deltas from what was sent to `now`. A field that is not an extension
    /// of what was sent (a parser bug) sends nothing more for it.
    fn advance(&mut self, now: ParsedOutput) -> Vec<Delta> {
        let mut out = Vec::new();
        if let Some(new) = now.reasoning.strip_prefix(self.sent.reasoning.as_str()) {
            if !new.is_empty() {
                out.push(Delta::Reasoning(new.to_string()));
                self.sent.reasoning = now.reasoning.clone();
            }
        }
        if let Some(new) = now.content.strip_prefix(self.sent.content.as_str()) {
            if !new.is_empty() {
                out.push(Delta::Content(new.to_string()));
                self.sent.content = now.content.clone();
            }
        }
        if now.tool_calls.starts_with(&self.sent.tool_calls) {
            for (index, call) in now.tool_calls.iter().enumerate().skip(self.sent.tool_calls.len()) {
                out.push(Delta::ToolCall { index, call: call.clone() });
            }
            self.sent.tool_calls = now.tool_calls;
        }
        out
    }
}

impl<P: OutputParser + ?Sized> OutputParser for Box<P> {
    fn parse(&self, text: &str) -> ParsedOutput {
        (**self).parse(text)
    }
    fn parse_partial(&self, text: &str) -> ParsedOutput {
        (**self).parse_partial(text)
    }
}

/// A family whose calls come as one section opened by a marker
/// (`<tool_call>`, `<｜tool▁calls▁begin｜>`, ...): content before it, calls
/// in it.
pub trait SectionFormat: Send + Sync {
    /// What opens the tool-call section.
    fn start(&self) -> &'static str;
    /// The calls of a whole section (from [`SectionFormat::start`] to the
    /// end of the output); `None` when it does not parse.
    fn parse_section(&self, section: &str) -> Option<Vec<ParsedToolCall>>;
}

/// A [`SectionFormat`] as an [`OutputParser`] (no reasoning).
pub struct Sectioned<F>(pub F);

impl<F: SectionFormat> OutputParser for Sectioned<F> {
    fn parse(&self, text: &str) -> ParsedOutput {
        let Some(at) = text.find(self.0.start()) else {
            return ParsedOutput::content(text);
        };
        match self.0.parse_section(&text[at..]) {
            Some(calls) if !calls.is_empty() => ParsedOutput {
                reasoning: String::new(),
                content: text[..at].to_string(),
                tool_calls: calls,
            },
            _ => ParsedOutput::content(text),
        }
    }

    fn parse_partial(&self, text: &str) -> ParsedOutput {
        let end = match text.find(self.0.start()) {
            Some(at) => at,
            None => text.len() - held_back(text, &[self.0.start()]),
        };
        ParsedOutput::content(&text[..end])
    }
}

/// How many bytes at the end of `text` could be the start of one of
/// `markers` (held back while streaming until the next piece tells).
pub fn held_back(text: &str, markers: &[&str]) -> usize {
    let mut held = 0;
    for m in markers {
        for n in (1..m.len().min(text.len() + 1)).rev() {
            if n > held && m.is_char_boundary(n) && text.ends_with(&m[..n]) {
                held = n;
                break;
            }
        }
    }
    held
}

/// A JSON value's text when `text` is exactly one JSON value (surrounding
/// whitespace aside).
pub(crate) fn json_value(text: &str) -> Option<serde_json::Value> {
    serde_json::from_str(text.trim()).ok()
}

/// The tool-call family a checkpoint writes, from its chat template and
/// `config.json`'s `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFamily {
    /// `<tool_call>{"name": ..., "arguments": ...}</tool_call>` (Qwen3, Qwen2.5, Hermes).
    Hermes,
    DeepSeekV3,
    KimiK2,
    /// gpt-oss's harmony channels.
    Harmony,
    /// Kimi K3's XTML `tools` tag after its response.
    KimiK3,
}

impl ToolFamily {
    /// The family of a checkpoint; `None` when larder knows no tool-call
    /// format for it (see docs/tools.md).
    pub fn for_checkpoint(model_type: Option<&str>, template: Option<&str>) -> Option<Self> {
        let t = template.unwrap_or("");
        if model_type == Some("kimi_k3") {
            return Some(ToolFamily::KimiK3);
        }
        if model_type == Some("gpt_oss") || t.contains("<|channel|>") {
            Some(ToolFamily::Harmony)
        } else if t.contains("<|tool_calls_section_begin|>") || matches!(model_type, Some("kimi_k2")) {
            Some(ToolFamily::KimiK2)
        } else if t.contains(deepseek_v3::CALLS_BEGIN) || model_type == Some("deepseek_v3") {
            Some(ToolFamily::DeepSeekV3)
        } else if t.contains(hermes::START) {
            Some(ToolFamily::Hermes)
        } else {
            None
        }
    }

    /// The markers its calls are written with (special tokens in some
    /// tokenizers: the text must then spell them for the parser).
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            ToolFamily::Hermes => &[hermes::START, hermes::END],
            ToolFamily::DeepSeekV3 => &[
                deepseek_v3::CALLS_BEGIN,
                deepseek_v3::CALL_BEGIN,
                deepseek_v3::SEP,
                deepseek_v3::CALL_END,
                deepseek_v3::CALLS_END,
            ],
            ToolFamily::KimiK2 => &[
                kimi_k2::SECTION_BEGIN,
                kimi_k2::CALL_BEGIN,
                kimi_k2::ARGUMENT_BEGIN,
                kimi_k2::CALL_END,
                kimi_k2::SECTION_END,
            ],
            ToolFamily::Harmony => &["<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|start|>"],
            ToolFamily::KimiK3 => &[crate::kimi_k3_chat::OPEN, crate::kimi_k3_chat::CLOSE, crate::kimi_k3_chat::SEP],
        }
    }

    /// The family's parser (tool calls only; [`crate::reasoning`] composes
    /// it with a reasoning split).
    pub fn parser(self) -> Box<dyn OutputParser> {
        match self {
            ToolFamily::Hermes => Box::new(Sectioned(hermes::Hermes)),
            ToolFamily::DeepSeekV3 => Box::new(Sectioned(deepseek_v3::DeepSeekV3)),
            ToolFamily::KimiK2 => Box::new(Sectioned(kimi_k2::KimiK2)),
            ToolFamily::Harmony => Box::new(harmony::Harmony),
            // The content after any reasoning: the response tag, then calls.
            ToolFamily::KimiK3 => Box::new(kimi_k3::K3Response {
                opened: false,
                calls: true,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_marker_starts() {
        assert_eq!(held_back("abc<tool", &["<tool_call>"]), 5);
        assert_eq!(held_back("abc<", &["<tool_call>"]), 1);
        assert_eq!(held_back("abc", &["<tool_call>"]), 0);
        assert_eq!(held_back("a<|", &["<|end|>", "<|call|>"]), 2);
    }

    #[test]
    fn families_from_checkpoints() {
        assert_eq!(
            ToolFamily::for_checkpoint(Some("qwen3_moe"), Some("<tool_call>")),
            Some(ToolFamily::Hermes)
        );
        assert_eq!(ToolFamily::for_checkpoint(Some("gpt_oss"), None), Some(ToolFamily::Harmony));
        assert_eq!(ToolFamily::for_checkpoint(Some("deepseek_v3"), None), Some(ToolFamily::DeepSeekV3));
        assert_eq!(ToolFamily::for_checkpoint(Some("kimi_k2"), None), Some(ToolFamily::KimiK2));
        assert_eq!(
            ToolFamily::for_checkpoint(Some("kimi_k3"), Some("<tool_call>")),
            Some(ToolFamily::KimiK3)
        );
        assert_eq!(ToolFamily::for_checkpoint(Some("llama"), Some("{{ x }}")), None);
    }
}
