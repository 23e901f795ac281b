//! Kimi-K2's tool calls, in its special tokens:
//!
//! ```text
//! <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>
//! ```
//!
//! The call id is `functions.NAME:IDX` (IDX counts calls over the
//! conversation) and is returned as the call's id, as Kimi's template
//! expects it back in `tool_call_id`. Read against SGLang's `KimiK2Detector`
//! (`python/sglang/srt/function_call/kimik2_detector.py`, which cites
//! Moonshot's `docs/tool_call_guidance.md` of moonshotai/Kimi-K2-Instruct)
//! and vLLM's `KimiK2ToolParser`. The section must be closed by
//! `<|tool_calls_section_end|>` (whitespace after it allowed), else the
//! output is content.

use super::{json_value, ParsedToolCall, SectionFormat};

pub const SECTION_BEGIN: &str = "<|tool_calls_section_begin|>";
pub const SECTION_END: &str = "<|tool_calls_section_end|>";
pub const CALL_BEGIN: &str = "<|tool_call_begin|>";
pub const ARGUMENT_BEGIN: &str = "<|tool_call_argument_begin|>";
pub const CALL_END: &str = "<|tool_call_end|>";

/// The Kimi-K2 format.
pub struct KimiK2;

impl SectionFormat for KimiK2 {
    fn start(&self) -> &'static str {
        SECTION_BEGIN
    }

    fn parse_section(&self, section: &str) -> Option<Vec<ParsedToolCall>> {
        let mut rest = section.strip_prefix(SECTION_BEGIN)?;
        let mut calls = Vec::new();
        loop {
            rest = rest.trim_start();
            if let Some(after) = rest.strip_prefix(SECTION_END) {
                return after.trim().is_empty().then_some(calls);
            }
            let body = rest.strip_prefix(CALL_BEGIN)?;
            let end = body.find(CALL_END)?;
            calls.push(call(&body[..end])?);
            rest = &body[end + CALL_END.len()..];
        }
    }
}

/// `functions.NAME:IDX<|tool_call_argument_begin|>ARGS`.
fn call(body: &str) -> Option<ParsedToolCall> {
    let (id, args) = body.split_once(ARGUMENT_BEGIN)?;
    let id = id.trim();
    let (path, index) = id.rsplit_once(':')?;
    index.parse::<u64>().ok()?;
    let name = path.strip_prefix("functions.").unwrap_or(path);
    if name.is_empty() {
        return None;
    }
    json_value(args)?;
    Some(ParsedToolCall {
        id: Some(id.to_string()),
        name: name.to_string(),
        arguments: args.trim().to_string(),
    })
}
