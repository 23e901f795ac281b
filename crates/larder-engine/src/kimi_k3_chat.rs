//! Kimi K3's chat format ("XTML"), built as its release builds it.
//!
//! K3 ships no jinja template: `tokenization_kimi.py`'s
//! `apply_chat_template` calls `encoding_k3.build_chat_segments`, which
//! returns a list of segments, and `_encode_chat_segments` tokenizes each
//! segment on its own: control segments (`<|open|>`, `<|close|>`, `<|sep|>`,
//! `<|end_of_msg|>`) with special tokens matched, every other segment (tag
//! names, attributes, message text) with none matched, so text a user types
//! never becomes a control token and no BPE merge crosses a segment
//! boundary. [`segments`] transcribes the builder, [`render`] joins the
//! segments (`apply_chat_template(tokenize=False)`), [`encode`] tokenizes
//! them (`tokenize=True`).
//!
//! ```text
//! <|open|>message role="user"<|sep|>TEXT<|close|>message<|sep|><|end_of_msg|>
//! ```
//!
//! - a tag opens as `<|open|>` + name + per attribute the four text segments
//!   ` key`, `="`, the value (`&` -> `&amp;`, then `"` -> `&quot;`), `"` +
//!   `<|sep|>`, and closes as `<|close|>` + name + `<|sep|>`;
//! - with thinking on and an effort (by default `max`, as
//!   `apply_chat_template` sets it), a system message of type
//!   `thinking-effort` comes first;
//! - system and user messages are one `message` tag; an assistant message
//!   holds a `think` tag (thinking on; its reasoning when there is any, else
//!   empty) and a `response` tag;
//! - the generation prompt opens an assistant message and its `think` tag
//!   (thinking on) or `response` tag (off); the model ends its turn with
//!   `<|end_of_msg|>`. No BOS is added.
//!
//! Sources: Moonshot's `encoding_k3.py` as transcribed by vLLM
//! (`vllm/tokenizers/encoding_k3.py`, "derived from moonshotai/Kimi-K3
//! encoding_k3.py at commit c5d1dd4") and by google-deepmind/simply
//! (`simply/zoo/kimi_k3/utils/lm_format.py`), checked against simply's
//! goldens, which the release itself produced (`encoding_k3.py` sha256
//! b9cb7ae1…, `tiktoken.model` b6c497a7…): `fixtures/tiktoken_k3/reference.json`.
//! The two transcriptions disagree on attributes: vLLM's makes
//! ` key="value"` one segment; the release's segments and ids (a name ending
//! in `;` before the closing `"`) show four, which is what is built here.
//!
//! Tools ([`tools`]): the `tool-declare` system message first (before the
//! thinking effort), an assistant message's calls in a `tools` tag after
//! its response, tool results as `message role="tool"` tags, and the
//! `tool-choice` note (`required`, `none`) after the conversation.
//!
//! `response_format` (`json_object`, `json_schema`) adds the release's
//! `response-format` note after the `tool-choice` one.
//!
//! Not built: the `name` attribute, images, the lazy `tools` of a system
//! message. A message of any other role renders
//! nothing, as in the release.

mod tools;

use std::str::FromStr;

use crate::chat_message::ChatMessage;
use crate::error::EngineError;
use crate::tokenizer::{python_isspace, TextTokenizer};

/// Opens a tag.
pub const OPEN: &str = "<|open|>";
/// Opens a closing tag.
pub const CLOSE: &str = "<|close|>";
/// Ends a tag's name and attributes.
pub const SEP: &str = "<|sep|>";
/// Ends a message; generation stops on it.
pub const END_OF_MSG: &str = "<|end_of_msg|>";

/// How much the model is told to think (`thinking_effort`).
///
/// The release accepts `low`, `high` and `max` (its
/// `_VALID_THINKING_EFFORTS`), though the text it sends the model also
/// names `medium`; llama.cpp's template accepts `medium` too. The code is
/// the reference: `medium` is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkingEffort {
    Low,
    High,
    Max,
}

impl ThinkingEffort {
    /// The value as the release spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ThinkingEffort::Low => "low",
            ThinkingEffort::High => "high",
            ThinkingEffort::Max => "max",
        }
    }
}

impl FromStr for ThinkingEffort {
    type Err = EngineError;

    fn from_str(s: &str) -> Result<Self, EngineError> {
        match s {
            "low" => Ok(ThinkingEffort::Low),
            "high" => Ok(ThinkingEffort::High),
            "max" => Ok(ThinkingEffort::Max),
            _ => Err(EngineError::Invalid {
                field: "thinking_effort",
                message: format!(
                    "{s:?} is not one Kimi K3's encoder accepts: low, high or max (its prompt text names medium, its code refuses it)"
                ),
            }),
        }
    }
}

/// The switches of `apply_chat_template` that shape a K3 prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// OpenAI function declarations (`tools`), declared first.
    pub tools: Option<Vec<serde_json::Value>>,
    /// `tool_choice` (`required` and `none` add a note).
    pub tool_choice: Option<String>,
    /// OpenAI's `response_format` (`json_object` and `json_schema` add a note).
    pub response_format: Option<serde_json::Value>,
    /// Think before responding (`thinking`, default true): assistant
    /// messages hold a `think` tag and the generation prompt opens one.
    pub thinking: bool,
    /// The `thinking-effort` system message (`thinking_effort`, default
    /// `max`); only sent while thinking, none when `None`.
    pub thinking_effort: Option<ThinkingEffort>,
    /// Open the assistant's turn at the end (default true).
    pub add_generation_prompt: bool,
}

impl Default for Options {
    /// `apply_chat_template`'s defaults: thinking, effort `max`, generation prompt.
    fn default() -> Self {
        Options {
            tools: None,
            tool_choice: None,
            response_format: None,
            thinking: true,
            thinking_effort: Some(ThinkingEffort::Max),
            add_generation_prompt: true,
        }
    }
}

/// One piece of a K3 prompt, tokenized on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub text: String,
    /// A control token: its special token is matched (`allow_special`);
    /// in every other segment, special-token spellings are plain text.
    pub control: bool,
}

/// The segments of `messages` under `options`, as `build_chat_segments`
/// builds them. Errors: a tool result no name can be found for, call
/// arguments that are JSON but not an object.
pub fn segments(messages: &[ChatMessage], options: &Options) -> Result<Vec<Segment>, EngineError> {
    let mut b = Builder::default();
    if let Some(declared) = options.tools.as_deref().filter(|t| !t.is_empty()) {
        tools::declare(&mut b, declared);
    }
    if options.thinking {
        if let Some(effort) = options.thinking_effort {
            let body = format!(
                "`thinking_effort` guides on how much to think in your thinking channel (not including the response \
                 channel), supported values include `low`, `medium`, `high`, and `max`.\nNow the system is invoked with \
                 `thinking_effort={}`.",
                effort.as_str()
            );
            b.system_message("thinking-effort", &body);
        }
    }
    let (mut calls, mut results): (&[crate::chat_message::ToolCall], usize) = (&[], 0);
    for (i, named) in tools::ordered(messages) {
        let message = &messages[i];
        match message.role.as_str() {
            role @ ("system" | "user") => {
                b.open("message", &[("role", role)]);
                b.text(message.text());
                b.end_message();
            }
            "assistant" => {
                (calls, results) = (&message.tool_calls, 0);
                b.open("message", &[("role", "assistant")]);
                if options.thinking {
                    b.open("think", &[]);
                    if let Some(reasoning) = message.reasoning_content.as_deref() {
                        if !reasoning.trim_matches(python_isspace).is_empty() {
                            b.text(reasoning);
                        }
                    }
                    b.close("think");
                }
                b.open("response", &[]);
                b.text(message.text());
                b.close("response");
                if !message.tool_calls.is_empty() {
                    tools::calls(&mut b, message, i)?;
                }
                b.end_message();
            }
            "tool" => {
                results += 1;
                tools::result(&mut b, message, named, results, calls, i)?;
            }
            // The release's chain of roles has no else: other roles render nothing.
            _ => {}
        }
    }
    tools::choice_note(&mut b, options.tool_choice.as_deref());
    tools::format_note(&mut b, options.response_format.as_ref());
    if options.add_generation_prompt {
        b.open("message", &[("role", "assistant")]);
        b.open(if options.thinking { "think" } else { "response" }, &[]);
    }
    Ok(b.out)
}

/// The prompt as text: the segments joined (what `apply_chat_template`
/// returns untokenized). Tokenizing this string whole is not the same as
/// [`encode`]: special-token spellings in message text would match.
pub fn render(segments: &[Segment]) -> String {
    segments.iter().map(|s| s.text.as_str()).collect()
}

/// The prompt's ids: each segment tokenized on its own, special tokens
/// matched in control segments only (`_encode_chat_segments`).
pub fn encode(tokenizer: &TextTokenizer, segments: &[Segment]) -> Result<Vec<u32>, EngineError> {
    let mut ids = Vec::new();
    for segment in segments {
        ids.extend(tokenizer.encode_segment(&segment.text, segment.control)?);
    }
    Ok(ids)
}

/// `&` -> `&amp;`, then `"` -> `&quot;` (nothing else: `<` and `>` stay).
fn escape_attribute(value: &str) -> String {
    value.replace('&', "&amp;").replace('"', "&quot;")
}

/// Collects segments; empty text makes none (the release's `_segment`).
#[derive(Default)]
struct Builder {
    out: Vec<Segment>,
}

impl Builder {
    fn push(&mut self, text: &str, control: bool) {
        if !text.is_empty() {
            self.out.push(Segment {
                text: text.to_string(),
                control,
            });
        }
    }

    fn text(&mut self, text: &str) {
        self.push(text, false);
    }

    fn open(&mut self, tag: &str, attributes: &[(&str, &str)]) {
        self.push(OPEN, true);
        self.text(tag);
        for (key, value) in attributes {
            self.text(&format!(" {key}"));
            self.text("=\"");
            self.text(&escape_attribute(value));
            self.text("\"");
        }
        self.push(SEP, true);
    }

    fn close(&mut self, tag: &str) {
        self.push(CLOSE, true);
        self.text(tag);
        self.push(SEP, true);
    }

    /// Closes a `message` tag and ends the message.
    fn end_message(&mut self) {
        self.close("message");
        self.push(END_OF_MSG, true);
    }

    /// A message the encoder itself adds: role system, a `type`, its body stripped.
    fn system_message(&mut self, kind: &str, body: &str) {
        self.open("message", &[("role", "system"), ("type", kind)]);
        self.text(body.trim_matches(python_isspace));
        self.end_message();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(segments: &[Segment]) -> Vec<(&str, bool)> {
        segments.iter().map(|s| (s.text.as_str(), s.control)).collect()
    }

    #[test]
    fn attributes_are_four_text_segments_and_escaped() {
        let mut b = Builder::default();
        b.open("call", &[("tool", "a&b\"c"), ("index", "1")]);
        assert_eq!(
            texts(&b.out),
            [
                (OPEN, true),
                ("call", false),
                (" tool", false),
                ("=\"", false),
                ("a&amp;b&quot;c", false),
                ("\"", false),
                (" index", false),
                ("=\"", false),
                ("1", false),
                ("\"", false),
                (SEP, true)
            ]
        );
        // `&` first, so an escaped quote in the input is escaped again.
        assert_eq!(escape_attribute("&quot;"), "&amp;quot;");
        assert_eq!(escape_attribute("<x>"), "<x>");
    }

    #[test]
    fn thinking_off_opens_the_response_and_sends_no_effort() {
        let options = Options {
            thinking: false,
            ..Options::default()
        };
        let mut assistant = ChatMessage::new("assistant", "a");
        assistant.reasoning_content = Some("why".into());
        let s = segments(&[ChatMessage::new("user", "q"), assistant], &options).unwrap();
        let text = render(&s);
        assert!(!text.contains("think"), "{text}");
        assert!(
            text.ends_with("<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>"),
            "{text}"
        );
    }

    #[test]
    fn blank_reasoning_leaves_the_think_tag_empty_and_other_roles_render_nothing() {
        let mut assistant = ChatMessage::new("assistant", "a");
        assistant.reasoning_content = Some(" \n\u{1c}".into());
        let options = Options {
            thinking_effort: None,
            add_generation_prompt: false,
            ..Options::default()
        };
        let s = segments(&[ChatMessage::new("developer", "x"), assistant], &options).unwrap();
        assert_eq!(
            render(&s),
            "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|><|close|>think<|sep|>\
             <|open|>response<|sep|>a<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
        );
    }

    #[test]
    fn tool_messages_and_unknown_efforts_are_refused() {
        let e = segments(&[ChatMessage::new("tool", "r")], &Options::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("tool"), "{e}");
        let e = "medium".parse::<ThinkingEffort>().unwrap_err().to_string();
        assert!(e.contains("low, high or max"), "{e}");
        assert_eq!("high".parse::<ThinkingEffort>().unwrap(), ThinkingEffort::High);
    }
}
