//! A forced Kimi K3 call's arguments in the form its release writes them:
//! one `argument` tag per property, `<|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|>`,
//! strings raw and every other type as JSON (`encoding_k3.py`'s
//! `_render_assistant_segments`; [`crate::tool_calls::kimi_k3`] reads it).
//!
//! The properties come in the order the schema lists them, each required one
//! present, each optional one present or not. A string value is raw text of
//! the schema's length bounds (or one of its `enum`/`const` values); a value
//! of any other type is `%json` of its property schema, and its tag's type is
//! the XTML type (`number` for integers too). A schema this form cannot
//! state exactly (a property without one `type`, a string `pattern` or
//! `format`, top-level combinators) gives `None`: the caller writes the
//! arguments as one `json` tag instead.

use serde_json::Value as Json;

use super::{quoted, with_options, GrammarError};

/// Keys a top-level object schema may have for the typed form.
const OBJECT_KEYS: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "description",
    "title",
    "$schema",
    "strict",
];

/// Keys a string property may have for the typed form.
const STRING_KEYS: &[&str] = &[
    "type",
    "description",
    "title",
    "minLength",
    "maxLength",
    "enum",
    "const",
    "default",
    "examples",
];

/// For call `i`: the expression of its arguments (possibly empty) and the
/// rules it uses, or `None` when `parameters` cannot be typed.
/// `marker(m)` spells K3's control token `m` in Lark.
pub(super) fn typed_arguments(
    i: usize,
    parameters: &Json,
    strict: bool,
    marker: &dyn Fn(&str) -> String,
) -> Result<Option<(String, String)>, GrammarError> {
    use crate::kimi_k3_chat::{CLOSE, OPEN, SEP};
    let Some(object) = parameters.as_object() else { return Ok(None) };
    if object.keys().any(|k| !OBJECT_KEYS.contains(&k.as_str())) || object.get("type").is_some_and(|t| t != "object") {
        return Ok(None);
    }
    let empty = serde_json::Map::new();
    let properties = match object.get("properties") {
        None => &empty,
        Some(Json::Object(p)) => p,
        Some(_) => return Ok(None),
    };
    let required: Vec<&str> = object
        .get("required")
        .and_then(Json::as_array)
        .map(|r| r.iter().filter_map(Json::as_str).collect())
        .unwrap_or_default();
    let (mut expression, mut rules) = (Vec::new(), String::new());
    for (n, (key, schema)) in properties.iter().enumerate() {
        let Some((kind, value)) = value_rule(schema, strict)? else {
            return Ok(None);
        };
        let name = format!("arg_{i}_{n}");
        let attributes = format!("argument key=\"{}\" type=\"{kind}\"", escape(key));
        rules.push_str(&format!(
            "{name}: {} {} {} {value} {} \"argument\" {}\n",
            marker(OPEN),
            quoted(&attributes),
            marker(SEP),
            marker(CLOSE),
            marker(SEP)
        ));
        expression.push(if required.contains(&key.as_str()) {
            name
        } else {
            format!("{name}?")
        });
    }
    if required.iter().any(|r| !properties.contains_key(*r)) {
        return Ok(None);
    }
    Ok(Some((expression.join(" "), rules)))
}

/// A property's XTML type and the Lark expression of its value.
fn value_rule(schema: &Json, strict: bool) -> Result<Option<(&'static str, String)>, GrammarError> {
    let Some(object) = schema.as_object() else { return Ok(None) };
    let kind = match object.get("type").and_then(Json::as_str) {
        Some("string") => return Ok(string_rule(object)),
        Some("integer" | "number") => "number",
        Some("boolean") => "boolean",
        Some("null") => "null",
        Some("object") => "object",
        Some("array") => "array",
        _ => return Ok(None),
    };
    Ok(Some((kind, format!("%json {}", with_options(schema.clone(), strict)?))))
}

/// A string's raw value: one of its `enum`/`const` values, else text of
/// its length bounds (`None` for what raw text cannot state).
fn string_rule(object: &serde_json::Map<String, Json>) -> Option<(&'static str, String)> {
    if object.keys().any(|k| !STRING_KEYS.contains(&k.as_str())) {
        return None;
    }
    let choices: Option<Vec<String>> = match (object.get("enum"), object.get("const")) {
        (_, Some(c)) => Some(vec![c.as_str()?.to_string()]),
        (Some(Json::Array(values)), None) => values.iter().map(|v| v.as_str().map(str::to_string)).collect(),
        (Some(_), None) => return None,
        (None, None) => None,
    };
    if let Some(choices) = choices {
        let alternatives: Vec<String> = choices.iter().filter(|c| !c.is_empty()).map(|c| quoted(c)).collect();
        if alternatives.is_empty() {
            return None;
        }
        let optional = if choices.iter().any(String::is_empty) { "?" } else { "" };
        return Some(("string", format!("({}){optional}", alternatives.join(" | "))));
    }
    let min = object.get("minLength").and_then(Json::as_u64).unwrap_or(0);
    let max = object.get("maxLength").and_then(Json::as_u64);
    if max.is_some_and(|max| max < min) {
        return None;
    }
    let body = match max {
        Some(0) => return Some(("string", String::new())),
        Some(max) => format!("/(?s:.){{{},{max}}}/", min.max(1)),
        None => format!("/(?s:.){{{},}}/", min.max(1)),
    };
    Some(("string", if min == 0 { format!("{body}?") } else { body }))
}

/// An attribute value as K3 writes it (`&` then `"`).
fn escape(value: &str) -> String {
    value.replace('&', "&amp;").replace('"', "&quot;")
}
