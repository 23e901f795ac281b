//! gpt-oss's harmony format: the output is a run of messages, each a header
//! and a body,
//!
//! ```text
//! <|channel|>analysis<|message|>Need the weather.<|end|>
//! <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>
//! <|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>
//! ```
//!
//! (the prompt ends in `<|start|>assistant`, so the first message's header
//! starts at `<|channel|>`). The `analysis` channel is reasoning; `final`,
//! and `commentary` with no recipient (a preamble), are content; a message
//! to `functions.NAME` (its `to=` in the header, before or after the
//! channel) is a call whose body is the JSON arguments. A body ends at
//! `<|end|>`, `<|call|>`, `<|return|>` or the end of the output (the stop
//! tokens `<|call|>` and `<|return|>` are usually cut off).
//!
//! Read against OpenAI's harmony format (the `openai/harmony` crate's
//! docs, "Receiving tool calls") and the gpt-oss chat template
//! (fixtures/tokenizer_gptoss: past calls rendered as
//! `<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>`),
//! and vLLM's gpt-oss handling (`vllm/entrypoints/harmony_utils.py`:
//! analysis to `reasoning_content`, final to content, `functions.` recipients
//! to tool calls).
//!
//! A call whose body is not JSON, a call to a recipient other than
//! `functions.*` (the builtin browser and python tools, which larder does
//! not run), or a header without a channel: that message's text, as
//! written, is content.

use super::{held_back, json_value, OutputParser, ParsedOutput, ParsedToolCall};

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const ENDS: [&str; 4] = ["<|end|>", "<|call|>", "<|return|>", START];

/// The harmony reader (reasoning, content and calls together).
pub struct Harmony;

impl OutputParser for Harmony {
    fn parse(&self, text: &str) -> ParsedOutput {
        read(text, true)
    }

    fn parse_partial(&self, text: &str) -> ParsedOutput {
        read(text, false)
    }
}

/// What one message is.
enum Kind {
    Reasoning,
    Content,
    Call(String),
    /// Not understood: its text is content.
    Raw,
}

fn read(text: &str, finished: bool) -> ParsedOutput {
    let mut out = ParsedOutput::default();
    let mut pos = 0;
    while pos < text.len() {
        let rest = &text[pos..];
        let Some(m) = rest.find(MESSAGE) else {
            // A header still arriving, or text that is no message.
            if finished {
                out.content.push_str(rest);
            }
            break;
        };
        let header = &rest[..m];
        let body_start = m + MESSAGE.len();
        let body_text = &rest[body_start..];
        let (body_len, end_len) = match ENDS
            .iter()
            .filter_map(|e| body_text.find(e).map(|i| (i, if *e == START { 0 } else { e.len() })))
            .min()
        {
            Some((i, n)) => (i, Some(n)),
            None => (body_text.len(), None),
        };
        let body = &body_text[..body_len];
        let kind = kind(header);
        let terminated = end_len.is_some();
        if !terminated && !finished {
            // The last message, still arriving: stream text bodies, hold calls.
            match kind {
                Kind::Reasoning => out.reasoning.push_str(&body[..body.len() - held_back(body, &ENDS)]),
                Kind::Content => out.content.push_str(&body[..body.len() - held_back(body, &ENDS)]),
                Kind::Call(_) | Kind::Raw => {}
            }
            break;
        }
        let whole = body_start + body_len + end_len.unwrap_or(0);
        match kind {
            Kind::Reasoning => out.reasoning.push_str(body),
            Kind::Content => out.content.push_str(body),
            Kind::Call(name) => match json_value(body) {
                Some(_) => out.tool_calls.push(ParsedToolCall {
                    id: None,
                    name,
                    arguments: body.trim().to_string(),
                }),
                None => out.content.push_str(&rest[..whole]),
            },
            Kind::Raw => out.content.push_str(&rest[..whole]),
        }
        pos += whole;
    }
    out
}

/// A header's kind: `[<|start|>ROLE][ to=R]<|channel|>CHANNEL[ to=R][ <|constrain|>json]`.
fn kind(header: &str) -> Kind {
    let header = header.strip_prefix(START).unwrap_or(header);
    let Some(c) = header.find(CHANNEL) else { return Kind::Raw };
    let channel = word(&header[c + CHANNEL.len()..]);
    let recipient = header.find("to=").map(|i| word(&header[i + 3..]));
    match (channel, recipient) {
        (_, Some(r)) => match r.strip_prefix("functions.") {
            Some(name) if !name.is_empty() => Kind::Call(name.to_string()),
            _ => Kind::Raw,
        },
        ("analysis", None) => Kind::Reasoning,
        ("final" | "commentary", None) => Kind::Content,
        _ => Kind::Raw,
    }
}

/// The text up to whitespace or the next `<|`.
fn word(s: &str) -> &str {
    let end = s.find(|c: char| c.is_whitespace()).unwrap_or(s.len());
    let end = s[..end].find("<|").unwrap_or(end);
    &s[..end]
}
