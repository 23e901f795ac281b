//! Kimi K3's tool formats, as the release's `encoding_k3.py` builds them:
//! the `tool-declare` system message, an assistant message's `tools` tag,
//! tool results (`message role="tool" tool=NAME index=N`, reordered into
//! the order of the calls they answer), and the `tool-choice` notes.
//!
//! - declarations: `# Tools\nHere are the available tools, described in
//!   JSONSchema.\n\n```json\n` + the tools (every object's keys sorted,
//!   recursively: `deep_sort_dict`) as compact JSON (`,` and `:`, no ASCII
//!   escaping) + `\n```` (`_render_tool_declare`);
//! - a call: `call tool=NAME index=I` (I counts from 1 within the message),
//!   holding per argument `argument key=K type=T` (T the XTML type of the
//!   value: `string` written raw, every other type as `json.dumps`), or,
//!   when the arguments are not JSON, the text as written in one
//!   `json type="object"` tag; empty arguments are none; arguments that
//!   are JSON but not an object are refused (`normalize_tool_arguments`);
//! - notes after the conversation: `tool-choice` (`required`, `none`), then
//!   `response-format` (`json_object`, `json_schema` with its schema);
//! - tool results: each run of consecutive `tool` messages is sorted by the
//!   position of the call each answers (`tool_call_id`) in the last
//!   assistant message's calls and named after it; a run with a message
//!   that answers no call there is left as sent, its names from the
//!   message, else from the call at its position
//!   (`normalize_xtml_tool_result_messages`); `index` counts the results
//!   since the last assistant message.
//!
//! Sources: Moonshot's `encoding_k3.py` as transcribed by vLLM and by other
//! public ports (docs/tools.md names them); they agree on these parts.

use serde_json::Value as Json;

use super::Builder;
use crate::chat_message::ChatMessage;
use crate::error::EngineError;

/// Every object's keys sorted, recursively.
fn deep_sort(v: &Json) -> Json {
    match v {
        Json::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            Json::Object(keys.into_iter().map(|k| (k.clone(), deep_sort(&map[k]))).collect())
        }
        Json::Array(items) => Json::Array(items.iter().map(deep_sort).collect()),
        other => other.clone(),
    }
}

/// The `tool-declare` system message.
pub(super) fn declare(b: &mut Builder, tools: &[Json]) {
    let compact = crate::chat_json::python_dumps_with(&deep_sort(&Json::Array(tools.to_vec())), ",", ":");
    let body = format!("# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n{compact}\n```");
    b.open("message", &[("role", "system"), ("type", "tool-declare")]);
    b.text(&body);
    b.end_message();
}

/// The XTML type of an argument's value.
fn xtml_type(v: &Json) -> &'static str {
    match v {
        Json::Bool(_) => "boolean",
        Json::Null => "null",
        Json::Number(_) => "number",
        Json::String(_) => "string",
        Json::Object(_) => "object",
        Json::Array(_) => "array",
    }
}

/// An assistant message's `tools` tag (message `i`'s calls).
pub(super) fn calls(b: &mut Builder, message: &ChatMessage, i: usize) -> Result<(), EngineError> {
    let invalid = |what: String| EngineError::Invalid {
        field: "messages",
        message: format!("message {i}: {what}"),
    };
    b.open("tools", &[]);
    for (n, call) in message.tool_calls.iter().enumerate() {
        let name = &call.function.name;
        if name.is_empty() {
            return Err(invalid("Kimi K3 tool calls need a function name".into()));
        }
        let index = (n + 1).to_string();
        b.open("call", &[("tool", name), ("index", &index)]);
        let text = call.function.arguments.as_str();
        match serde_json::from_str::<Json>(text) {
            _ if text.trim().is_empty() => {}
            Ok(Json::Object(arguments)) => {
                for (key, value) in &arguments {
                    b.open("argument", &[("key", key), ("type", xtml_type(value))]);
                    match value {
                        Json::String(s) => b.text(s),
                        other => b.text(&crate::chat_json::python_dumps(other)),
                    }
                    b.close("argument");
                }
            }
            Ok(_) => return Err(invalid(format!("the arguments of call {name:?} must be a JSON object"))),
            Err(_) => {
                b.open("json", &[("type", "object")]);
                b.text(text);
                b.close("json");
            }
        }
        b.close("call");
    }
    b.close("tools");
    Ok(())
}

/// `messages` with each run of tool results in the order of the calls they
/// answer, and the tool name each result renders with when its call names
/// it.
pub(super) fn ordered(messages: &[ChatMessage]) -> Vec<(usize, Option<&str>)> {
    let mut out = Vec::with_capacity(messages.len());
    let mut calls: &[crate::chat_message::ToolCall] = &[];
    let mut i = 0;
    while i < messages.len() {
        if messages[i].role != "tool" {
            if messages[i].role == "assistant" {
                calls = &messages[i].tool_calls;
            }
            out.push((i, None));
            i += 1;
            continue;
        }
        let start = i;
        while i < messages.len() && messages[i].role == "tool" {
            i += 1;
        }
        let position = |m: &ChatMessage| {
            let id = m.tool_call_id.as_deref()?;
            calls.iter().position(|c| c.id == id)
        };
        let run: Vec<(usize, Option<usize>)> = (start..i).map(|j| (j, position(&messages[j]))).collect();
        if run.iter().all(|(_, p)| p.is_some()) {
            let mut sorted = run;
            sorted.sort_by_key(|&(j, p)| (p, j));
            out.extend(sorted.into_iter().map(|(j, p)| (j, p.map(|p| calls[p].function.name.as_str()))));
        } else {
            out.extend(run.into_iter().map(|(j, _)| (j, None)));
        }
    }
    out
}

/// A tool result: the `index`-th since the last assistant message, whose
/// calls are `calls`; `named` is the name its call gives it.
pub(super) fn result(
    b: &mut Builder,
    message: &ChatMessage,
    named: Option<&str>,
    index: usize,
    calls: &[crate::chat_message::ToolCall],
    i: usize,
) -> Result<(), EngineError> {
    let name = named
        .or(message.name.as_deref())
        .or_else(|| calls.get(index - 1).map(|c| c.function.name.as_str()))
        .ok_or_else(|| EngineError::Invalid {
            field: "messages",
            message: format!(
                "message {i} is a tool result Kimi K3 cannot name: give its `name`, or answer a call of the assistant message before it"
            ),
        })?;
    let index = index.to_string();
    b.open("message", &[("role", "tool"), ("tool", name), ("index", &index)]);
    b.text(message.text());
    b.end_message();
    Ok(())
}

/// The `response-format` note the release adds after the conversation for
/// `response_format` `json_object` and `json_schema` (the schema found as
/// its `extract_response_schema` finds it, keys sorted, compact).
pub(super) fn format_note(b: &mut Builder, response_format: Option<&Json>) {
    let Some(format) = response_format else { return };
    const RAW: &str = "Your response must be raw JSON data without markdown code blocks (```json) or any additional formatting.";
    let body = match format.get("type").and_then(Json::as_str) {
        Some("json_object") => format!("The system is invoked with `response_format=json_object`.\n{RAW}"),
        Some("json_schema") => {
            let holder = format.get("json_schema").unwrap_or(&Json::Null);
            let schema = holder.get("schema").or_else(|| holder.get("json_schema")).unwrap_or(holder);
            let schema = crate::chat_json::python_dumps_with(&deep_sort(schema), ",", ":");
            format!(
                "The system is invoked with `response_format=json_schema`.\n{RAW}\nThe JSON data must match the following schema:\n```json\n{schema}\n```"
            )
        }
        _ => return,
    };
    b.system_message("response-format", &body);
}

/// The `tool-choice` note the release adds after the conversation for
/// `required` and `none` (other values add none).
pub(super) fn choice_note(b: &mut Builder, tool_choice: Option<&str>) {
    let body = match tool_choice {
        Some("required") => "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.",
        Some("none") => "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.",
        _ => return,
    };
    b.system_message("tool-choice", body);
}
