//! What a chat template sees of tools and tool calls, the way transformers
//! hands them over: each message as a mapping ([`message_context`]), and
//! `tojson` as transformers defines it for templates (`json.dumps` with
//! `ensure_ascii=False`, Python's separators, keys in the order given, no
//! HTML escaping; minijinja's own `tojson` escapes `<`, `>`, `&` and `'` and
//! drops the spaces).

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind};
use serde_json::Value as Json;

use crate::chat_message::ChatMessage;
use crate::error::EngineError;

/// `value | tojson(indent=None, separators=None)`.
pub(crate) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let _sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let _ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let json = if value.is_undefined() {
        Json::Null
    } else {
        serde_json::to_value(value).map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?
    };
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings")),
        // json.dumps: (', ', ': '), or (',', ': ') with an indent.
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let mut out = String::new();
    dump(&json, indent, &item, &key, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

/// `json.dumps(v, ensure_ascii=False)`: how vLLM and SGLang write a call's
/// arguments parsed out of a model's output.
pub(crate) fn python_dumps(v: &Json) -> String {
    let mut out = String::new();
    dump(v, None, ", ", ": ", 0, &mut out);
    out
}

/// `json.dumps(v, ensure_ascii=False, separators=(item, key))`.
pub(crate) fn python_dumps_with(v: &Json, item: &str, key: &str) -> String {
    let mut out = String::new();
    dump(v, None, item, key, 0, &mut out);
    out
}

/// `json.dumps` of `v` (`ensure_ascii=False`).
fn dump(v: &Json, indent: Option<usize>, item: &str, key: &str, depth: usize, out: &mut String) {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    match v {
        Json::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item);
                }
                newline(out, depth + 1);
                dump(x, indent, item, key, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        Json::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (k, x)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(item);
                }
                newline(out, depth + 1);
                out.push_str(&Json::String(k.clone()).to_string());
                out.push_str(key);
                dump(x, indent, item, key, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        // Scalars, `[]` and `{}`: serde_json escapes strings as Python does
        // with ensure_ascii=False (`"`, `\`, control characters).
        other => out.push_str(&other.to_string()),
    }
}

/// Whether a template concatenates a call's `arguments` as text (so they
/// must be passed as the JSON string), as DeepSeek-V3's does.
pub(crate) fn concatenates_arguments(source: &str) -> bool {
    let squeezed: String = source.chars().filter(|c| !c.is_whitespace()).collect();
    squeezed.contains("['arguments']+") || squeezed.contains(".arguments+") || squeezed.contains("[\"arguments\"]+")
}

/// A message as the template sees it. Absent fields, a `None` content
/// included, are left out (so `is defined` tests behave as with
/// transformers); reasoning is under both
/// `reasoning_content` (Qwen3) and `thinking` (gpt-oss); a call's arguments
/// are the parsed mapping unless `arguments_as_text` (or they are not JSON).
pub(crate) fn message_context(m: &ChatMessage, arguments_as_text: bool) -> Json {
    let mut o = serde_json::Map::new();
    o.insert("role".into(), Json::String(m.role.clone()));
    // transformers drops a `None` content from the message it hands the
    // template: the key is absent (undefined), not `none`.
    if let Some(content) = &m.content {
        o.insert("content".into(), Json::String(content.clone()));
    }
    if let Some(r) = &m.reasoning_content {
        o.insert("reasoning_content".into(), Json::String(r.clone()));
        o.insert("thinking".into(), Json::String(r.clone()));
    }
    if !m.tool_calls.is_empty() {
        let calls = m
            .tool_calls
            .iter()
            .map(|c| {
                let arguments = if arguments_as_text {
                    Json::String(c.function.arguments.clone())
                } else {
                    serde_json::from_str(&c.function.arguments).unwrap_or_else(|_| Json::String(c.function.arguments.clone()))
                };
                serde_json::json!({
                    "id": c.id,
                    "type": c.kind,
                    "function": {"name": c.function.name, "arguments": arguments},
                })
            })
            .collect();
        o.insert("tool_calls".into(), Json::Array(calls));
    }
    if let Some(id) = &m.tool_call_id {
        o.insert("tool_call_id".into(), Json::String(id.clone()));
    }
    if let Some(name) = &m.name {
        o.insert("name".into(), Json::String(name.clone()));
    }
    Json::Object(o)
}

/// Refuses a `tool` message that answers no call: no assistant tool call
/// before it, or a `tool_call_id` no earlier call has.
pub(crate) fn check_tool_results(messages: &[ChatMessage]) -> Result<(), EngineError> {
    let mut ids: Vec<&str> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        ids.extend(m.tool_calls.iter().map(|c| c.id.as_str()));
        if m.role != "tool" {
            continue;
        }
        let answered = match m.tool_call_id.as_deref() {
            Some(id) => ids.contains(&id),
            None => !ids.is_empty(),
        };
        if !answered {
            return Err(EngineError::Invalid {
                field: "messages",
                message: format!(
                    "message {i} is a tool result for {}, which no earlier assistant message calls",
                    m.tool_call_id
                        .as_deref()
                        .map_or("no call id".to_string(), |id| format!("call {id:?}"))
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(v: Json, indent: Option<usize>) -> String {
        let mut out = String::new();
        let item = if indent.is_some() { "," } else { ", " };
        dump(&v, indent, item, ": ", 0, &mut out);
        out
    }

    #[test]
    fn dumps_as_python_does() {
        let v = serde_json::json!({"b": [1, "x<y>&'é\n"], "a": {}, "c": null, "d": []});
        assert_eq!(dumps(v.clone(), None), r#"{"b": [1, "x<y>&'é\n"], "a": {}, "c": null, "d": []}"#);
        assert_eq!(
            dumps(v, Some(2)),
            "{\n  \"b\": [\n    1,\n    \"x<y>&'é\\n\"\n  ],\n  \"a\": {},\n  \"c\": null,\n  \"d\": []\n}"
        );
    }

    #[test]
    fn sees_concatenated_arguments() {
        assert!(concatenates_arguments("'\\n' + tool['function']['arguments'] + '\\n'"));
        assert!(!concatenates_arguments("{{ tool_call.arguments|tojson }}"));
    }
}
