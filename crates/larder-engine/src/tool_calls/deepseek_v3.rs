//! DeepSeek-V3's tool calls, in its special tokens:
//!
//! ```text
//! <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
//! ```json
//! {"city": "Paris"}
//! ```<｜tool▁call▁end｜>
//! <｜tool▁call▁begin｜>function<｜tool▁sep｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>
//! ```
//!
//! as its chat template renders past calls (fixtures/deepseek_v3_tok:
//! calls joined by `\n`, the section closed by `<｜tool▁calls▁end｜>`).
//! Read against vLLM's `DeepSeekV3ToolParser`
//! (`vllm/entrypoints/openai/tool_parsers/deepseekv3_tool_parser.py`, its
//! `tool_call_regex`: `<｜tool▁call▁begin｜>(?P<type>.*)<｜tool▁sep｜>(?P<function_name>.*)\n```json\n(?P<function_arguments>.*)\n```<｜tool▁call▁end｜>`).
//! The arguments are returned as the model wrote them, once checked to be
//! JSON. Stricter than vLLM: the section must end with
//! `<｜tool▁calls▁end｜>` (optionally `<｜end▁of▁sentence｜>` and whitespace
//! after), or the output is content.

use super::{json_value, ParsedToolCall, SectionFormat};

pub const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
pub const CALLS_END: &str = "<｜tool▁calls▁end｜>";
pub const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
pub const CALL_END: &str = "<｜tool▁call▁end｜>";
pub const SEP: &str = "<｜tool▁sep｜>";
const EOS: &str = "<｜end▁of▁sentence｜>";

/// The DeepSeek-V3 format.
pub struct DeepSeekV3;

impl SectionFormat for DeepSeekV3 {
    fn start(&self) -> &'static str {
        CALLS_BEGIN
    }

    fn parse_section(&self, section: &str) -> Option<Vec<ParsedToolCall>> {
        let mut rest = section.strip_prefix(CALLS_BEGIN)?;
        let mut calls = Vec::new();
        loop {
            rest = rest.trim_start();
            if let Some(after) = rest.strip_prefix(CALLS_END) {
                let tail = after.trim_start();
                let tail = tail.strip_prefix(EOS).unwrap_or(tail);
                return tail.trim().is_empty().then_some(calls);
            }
            let body = rest.strip_prefix(CALL_BEGIN)?;
            let end = body.find(CALL_END)?;
            calls.push(call(&body[..end])?);
            rest = &body[end + CALL_END.len()..];
        }
    }
}

/// `TYPE<｜tool▁sep｜>NAME\n```json\nARGS\n```` (type `function`).
fn call(body: &str) -> Option<ParsedToolCall> {
    let (kind, rest) = body.split_once(SEP)?;
    if kind.trim() != "function" {
        return None;
    }
    let (name, rest) = rest.split_once('\n')?;
    let args = rest.trim_start().strip_prefix("```json")?;
    let args = args.trim_end().strip_suffix("```")?.trim();
    json_value(args)?;
    let name = name.trim();
    if name.is_empty() {
        return None;
    }
    Some(ParsedToolCall {
        id: None,
        name: name.to_string(),
        arguments: args.to_string(),
    })
}
