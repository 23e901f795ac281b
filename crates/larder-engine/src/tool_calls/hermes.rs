//! Hermes-style tool calls, which Qwen3 (and Qwen2.5, Hermes 2 Pro) write:
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! one block per call, blocks separated by whitespace, text before the first
//! block being content. The template tells the model this format in its
//! tools preamble (fixtures/qwen3_moe_tok). Read against vLLM's
//! `Hermes2ProToolParser` (`vllm/entrypoints/openai/tool_parsers/hermes_tool_parser.py`:
//! content before `<tool_call>`, each block's JSON `name` and `arguments`,
//! the arguments written back with `json.dumps(..., ensure_ascii=False)`).
//! Stricter than vLLM: a block that is not closed (truncated), is not a JSON
//! object with a string `name`, or text other than whitespace after a block
//! makes the whole output content.

use serde_json::Value as Json;

use super::{json_value, ParsedToolCall, SectionFormat};
use crate::chat_json::python_dumps;

/// Opens a call.
pub const START: &str = "<tool_call>";
/// Closes a call.
pub const END: &str = "</tool_call>";

/// The Hermes format.
pub struct Hermes;

impl SectionFormat for Hermes {
    fn start(&self) -> &'static str {
        START
    }

    fn parse_section(&self, section: &str) -> Option<Vec<ParsedToolCall>> {
        let mut calls = Vec::new();
        let mut rest = section;
        loop {
            rest = rest.trim_start();
            if rest.is_empty() {
                return Some(calls);
            }
            let body = rest.strip_prefix(START)?;
            let end = body.find(END)?;
            calls.push(call(&body[..end])?);
            rest = &body[end + END.len()..];
        }
    }
}

/// One block's call: `{"name": NAME, "arguments": ARGS}` (arguments an
/// object, or a string holding one; `{}` when absent).
fn call(body: &str) -> Option<ParsedToolCall> {
    let Json::Object(o) = json_value(body)? else { return None };
    let name = o.get("name")?.as_str()?.to_string();
    let arguments = match o.get("arguments") {
        None => "{}".to_string(),
        Some(Json::String(s)) => {
            json_value(s)?;
            s.clone()
        }
        Some(v @ Json::Object(_)) => python_dumps(v),
        Some(_) => return None,
    };
    Some(ParsedToolCall { id: None, name, arguments })
}
