//! A chat request's `messages`, as OpenAI defines them, parsed into
//! larder-engine's [`ChatMessage`]s: system (and `developer`), user,
//! assistant (text, `tool_calls`, `reasoning_content`) and `tool` results.
//! A tool result must answer a call an earlier assistant message made;
//! content parts other than text are refused; an assistant's `null`
//! content is the empty text.

use larder_engine::{ChatMessage, FunctionCall, ToolCall};
use serde_json::{Map, Value};

use crate::error::ApiError;

/// Parses `messages` (a non-empty list).
pub fn parse_messages(v: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let list = v
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
        .ok_or_else(|| ApiError::invalid("messages", "messages must be a non-empty list"))?;
    let mut out: Vec<ChatMessage> = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let param = format!("messages[{i}]");
        let o = m
            .as_object()
            .ok_or_else(|| ApiError::invalid(&param, "each message must be an object"))?;
        let message = message(o, &param)?;
        if let Some(id) = message.tool_call_id.as_deref() {
            if !out.iter().any(|m| m.tool_calls.iter().any(|c| c.id == id)) {
                return Err(ApiError::invalid(
                    &format!("{param}.tool_call_id"),
                    format!("tool message answers call {id:?}, which no earlier assistant message makes"),
                ));
            }
        }
        out.push(message);
    }
    Ok(out)
}

fn message(o: &Map<String, Value>, param: &str) -> Result<ChatMessage, ApiError> {
    let role = o.get("role").and_then(Value::as_str).unwrap_or("");
    let fields: &[&str] = match role {
        "system" | "developer" | "user" => &["role", "content", "name"],
        "assistant" => &["role", "content", "name", "tool_calls", "reasoning_content", "reasoning", "refusal"],
        "tool" => &["role", "content", "name", "tool_call_id"],
        other => return Err(ApiError::invalid(&format!("{param}.role"), format!("unsupported role {other:?}"))),
    };
    if let Some(k) = o.keys().find(|k| !fields.contains(&k.as_str())) {
        return Err(ApiError::invalid(
            param,
            format!("message field `{k}` is not supported for role {role}"),
        ));
    }
    let tool_calls = match o.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .enumerate()
            .map(|(j, c)| tool_call(c, &format!("{param}.tool_calls[{j}]")))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::invalid(&format!("{param}.tool_calls"), "tool_calls must be a list")),
    };
    let content = match o.get("content") {
        // An assistant message that only calls tools has no content: the
        // template gets "" (as vLLM gives it; Qwen3's template adds the
        // content to a string unconditionally, so a missing one fails).
        None | Some(Value::Null) if role == "assistant" => Some(String::new()),
        c => Some(text(c, &format!("{param}.content"))?),
    };
    let reasoning = match o.get("reasoning_content").or_else(|| o.get("reasoning")) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            return Err(ApiError::invalid(
                &format!("{param}.reasoning_content"),
                "reasoning_content must be a string",
            ))
        }
    };
    let tool_call_id = match (role, o.get("tool_call_id")) {
        ("tool", Some(Value::String(id))) => Some(id.clone()),
        ("tool", _) => {
            return Err(ApiError::invalid(
                &format!("{param}.tool_call_id"),
                "a tool message needs the tool_call_id (a string) of the call it answers",
            ))
        }
        _ => None,
    };
    let name = match (role, o.get("name")) {
        ("tool", Some(Value::String(n))) => Some(n.clone()),
        _ => None,
    };
    Ok(ChatMessage {
        // OpenAI's newer name for system instructions.
        role: if role == "developer" { "system".into() } else { role.into() },
        content,
        reasoning_content: reasoning,
        tool_calls,
        tool_call_id,
        name,
    })
}

/// A message's text: a string or a list of text parts.
fn text(v: Option<&Value>, param: &str) -> Result<String, ApiError> {
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::invalid(
                            param,
                            format!("content part of type {:?} is not supported (text only)", kind.unwrap_or("?")),
                        ))
                    }
                }
            }
            Ok(text)
        }
        _ => Err(ApiError::invalid(param, "content must be a string or a list of text parts")),
    }
}

/// One call of an assistant message: `{"id", "type": "function",
/// "function": {"name", "arguments"}}` (arguments a JSON text; an object is
/// taken as its JSON text).
fn tool_call(v: &Value, param: &str) -> Result<ToolCall, ApiError> {
    let bad = |m: &str| ApiError::invalid(param, m.to_string());
    let o = v.as_object().ok_or_else(|| bad("a tool call must be an object"))?;
    if let Some(k) = o.keys().find(|k| !["id", "type", "function", "index"].contains(&k.as_str())) {
        return Err(bad(&format!("unsupported tool call field `{k}`")));
    }
    if o.get("type").is_some_and(|t| t != "function") {
        return Err(bad("only function tool calls are supported"));
    }
    let id = o
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("a tool call needs its id (a string)"))?;
    let f = o
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("a tool call needs its function {name, arguments}"))?;
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| bad("a tool call's function needs its name"))?;
    let arguments = match f.get("arguments") {
        Some(Value::String(s)) => s.clone(),
        Some(v @ Value::Object(_)) => v.to_string(),
        None | Some(Value::Null) => "{}".into(),
        Some(_) => return Err(bad("a tool call's arguments must be a JSON text (a string)")),
    };
    Ok(ToolCall {
        id: id.to_string(),
        kind: "function".into(),
        function: FunctionCall {
            name: name.to_string(),
            arguments,
        },
    })
}
