//! Tool calling on chat completions: the request's `tools`, `tool_choice`
//! and `parallel_tool_calls` ([`parse_tools`]), and the answer read from
//! the generated text by the model's own parser ([`ChatReader`]: reasoning
//! to `reasoning_content`, content, and tool calls), whole
//! ([`whole_message`]) or as stream deltas ([`ChatStream`]).
//!
//! - `tool_choice: "auto"` (the default with tools): the tools are rendered
//!   by the chat template and the output is parsed for calls; a call that
//!   does not parse is returned as content with `finish_reason: "stop"`.
//! - `"required"` or a named function: a grammar forces one call in the
//!   model's own syntax, to one of the tools (or the named one), with
//!   arguments valid against its parameters (larder-engine's
//!   `Engine::tool_call_constraint`). One call, whatever
//!   `parallel_tool_calls` says.
//! - `"none"`: the tools are not rendered and the output is not parsed for
//!   calls (as if no tools were sent).
//! - `parallel_tool_calls: false`: only the first call is returned.

use std::sync::Arc;

use larder_engine::tool_calls::{Delta, OutputParser, ParsedOutput, ParsedToolCall, StreamParser};
use larder_engine::{ToolSchema, MAX_GRAMMAR_BYTES};
use serde_json::{json, Map, Value};

use crate::error::ApiError;

/// Most tools one request may declare (OpenAI's limit).
pub const MAX_TOOLS: usize = 128;

/// Which calls the model may or must make.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// The model decides (calls are parsed from its output).
    Auto,
    /// One call to one of the tools, forced by a grammar.
    Required,
    /// One call to the named tool, forced by a grammar.
    Function(String),
}

/// A request's tools (absent when none were sent or `tool_choice` is `none`).
#[derive(Debug, Clone, PartialEq)]
pub struct Tools {
    /// As sent (`{"type": "function", "function": {...}}`), for the template.
    pub declarations: Vec<Value>,
    /// Each tool's name and parameters, for a forced call's grammar.
    pub schemas: Vec<ToolSchema>,
    /// Each tool's `function.strict`.
    pub strict: Vec<bool>,
    pub choice: ToolChoice,
    /// More than one call may be returned.
    pub parallel: bool,
}

impl Tools {
    /// The tools a forced call may call and whether their grammar is strict;
    /// `None` for `auto`.
    pub fn forced(&self) -> Option<(Vec<ToolSchema>, bool)> {
        let chosen: Vec<usize> = match &self.choice {
            ToolChoice::Auto => return None,
            ToolChoice::Required => (0..self.schemas.len()).collect(),
            ToolChoice::Function(name) => self.schemas.iter().position(|t| &t.name == name).into_iter().collect(),
        };
        let strict = chosen.iter().all(|&i| self.strict[i]);
        Some((chosen.iter().map(|&i| self.schemas[i].clone()).collect(), strict))
    }
}

/// Parses `tools`, `tool_choice` and `parallel_tool_calls`.
pub fn parse_tools(obj: &Map<String, Value>) -> Result<Option<Tools>, ApiError> {
    let list = match obj.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(_) => return Err(ApiError::invalid("tools", "tools must be a list of function tools")),
    };
    if list.len() > MAX_TOOLS {
        return Err(ApiError::invalid("tools", format!("at most {MAX_TOOLS} tools, not {}", list.len())));
    }
    let mut schemas: Vec<ToolSchema> = Vec::with_capacity(list.len());
    let mut strict = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let (schema, is_strict) = tool_schema(tool, &format!("tools[{i}]"))?;
        if schemas.iter().any(|t| t.name == schema.name) {
            return Err(ApiError::invalid(
                &format!("tools[{i}]"),
                format!("two tools are named {:?}", schema.name),
            ));
        }
        schemas.push(schema);
        strict.push(is_strict);
    }
    let choice = match obj.get("tool_choice") {
        None | Some(Value::Null) => Some(ToolChoice::Auto),
        Some(Value::String(s)) if s == "none" => None,
        Some(Value::String(s)) if s == "auto" => Some(ToolChoice::Auto),
        Some(Value::String(s)) if s == "required" => Some(ToolChoice::Required),
        Some(Value::Object(o)) => Some(ToolChoice::Function(named_choice(o)?)),
        Some(v) => {
            return Err(ApiError::invalid(
                "tool_choice",
                format!("tool_choice must be none, auto, required or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, not {v}"),
            ))
        }
    };
    let parallel = match obj.get("parallel_tool_calls") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::invalid("parallel_tool_calls", "parallel_tool_calls must be a boolean")),
    };
    match &choice {
        Some(ToolChoice::Required | ToolChoice::Function(_)) if schemas.is_empty() => {
            return Err(ApiError::invalid(
                "tool_choice",
                "tool_choice asks for a call, but no tools were given",
            ))
        }
        Some(ToolChoice::Function(name)) if !schemas.iter().any(|t| &t.name == name) => {
            return Err(ApiError::invalid(
                "tool_choice",
                format!("tool_choice names the function {name:?}, which is not among the tools"),
            ))
        }
        _ => {}
    }
    Ok(match choice {
        Some(choice) if !schemas.is_empty() => Some(Tools {
            declarations: list,
            schemas,
            strict,
            choice,
            parallel,
        }),
        _ => None,
    })
}

/// `{"type": "function", "function": {"name": ...}}`'s name.
fn named_choice(o: &Map<String, Value>) -> Result<String, ApiError> {
    let name = match (o.get("type").and_then(Value::as_str), o.get("function").and_then(|f| f.get("name"))) {
        (Some("function"), Some(Value::String(name))) => name.clone(),
        _ => {
            return Err(ApiError::invalid(
                "tool_choice",
                "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}",
            ))
        }
    };
    Ok(name)
}

/// One function tool: its name and parameters, and whether it is strict.
fn tool_schema(tool: &Value, param: &str) -> Result<(ToolSchema, bool), ApiError> {
    let bad = |p: &str, m: String| ApiError::invalid(&format!("{param}{p}"), m);
    let o = tool.as_object().ok_or_else(|| bad("", "each tool must be an object".into()))?;
    if o.get("type").and_then(Value::as_str) != Some("function") {
        return Err(bad(".type", "only function tools are supported (type: \"function\")".into()));
    }
    if let Some(k) = o.keys().find(|k| !["type", "function"].contains(&k.as_str())) {
        return Err(bad("", format!("unsupported tool field `{k}`")));
    }
    let f = o
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| bad(".function", "a function tool needs its `function` object".into()))?;
    if let Some(k) = f
        .keys()
        .find(|k| !["name", "description", "parameters", "strict"].contains(&k.as_str()))
    {
        return Err(bad(".function", format!("unsupported function field `{k}`")));
    }
    let name = f.get("name").and_then(Value::as_str).unwrap_or("");
    if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        return Err(bad(
            ".function.name",
            format!("a function name is 1 to 64 letters, digits, `_` or `-`, not {name:?}"),
        ));
    }
    if f.get("description").is_some_and(|d| !d.is_string() && !d.is_null()) {
        return Err(bad(".function.description", "description must be a string".into()));
    }
    let parameters = match f.get("parameters") {
        None | Some(Value::Null) => None,
        Some(p @ Value::Object(_)) => {
            check_schema_size(p, &format!("{param}.function.parameters"), "the parameters schema")?;
            Some(p.clone())
        }
        Some(_) => return Err(bad(".function.parameters", "parameters must be a JSON schema object".into())),
    };
    let strict = match f.get("strict") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad(".function.strict", "strict must be a boolean".into())),
    };
    Ok((
        ToolSchema {
            name: name.to_string(),
            parameters,
        },
        strict,
    ))
}

/// Refuses a tool's schema (`what`, at field `param`) over the grammar
/// engine's limit, before anything is compiled.
pub fn check_schema_size(schema: &Value, param: &str, what: &str) -> Result<(), ApiError> {
    let size = schema.to_string().len();
    if size > MAX_GRAMMAR_BYTES {
        return Err(ApiError::invalid(
            param,
            format!("{what} is {size} bytes, over the limit of {MAX_GRAMMAR_BYTES} bytes"),
        ));
    }
    Ok(())
}

/// The model's output reader for one request (larder-engine's
/// `OutputReader` parser), shared by its choices.
#[derive(Clone)]
pub struct ChatReader(pub Arc<dyn OutputParser>);

impl std::fmt::Debug for ChatReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChatReader")
    }
}

impl OutputParser for ChatReader {
    fn parse(&self, text: &str) -> ParsedOutput {
        self.0.parse(text)
    }
    fn parse_partial(&self, text: &str) -> ParsedOutput {
        self.0.parse_partial(text)
    }
}

/// A call as OpenAI writes it (`index` for stream deltas only).
fn call_json(call: &ParsedToolCall, id: String, index: Option<usize>) -> Value {
    let mut v = json!({"id": call.id.clone().unwrap_or(id), "type": "function",
                       "function": {"name": call.name, "arguments": call.arguments}});
    if let Some(i) = index {
        v["index"] = json!(i);
    }
    v
}

/// The assistant message of a finished choice and its finish reason:
/// `tool_calls` when it called tools and ended on its own. `new_id` makes
/// a call id where the model's format has none.
pub fn whole_message(
    reader: &ChatReader,
    text: &str,
    finish: &'static str,
    parallel: bool,
    new_id: &mut dyn FnMut() -> String,
) -> (Value, &'static str) {
    let mut out = reader.parse(text);
    if !parallel {
        out.tool_calls.truncate(1);
    }
    let mut message = json!({"role": "assistant", "content": out.content});
    if !out.reasoning.is_empty() {
        message["reasoning_content"] = json!(out.reasoning);
    }
    if out.tool_calls.is_empty() {
        return (message, finish);
    }
    if out.content.is_empty() {
        message["content"] = Value::Null;
    }
    let calls: Vec<Value> = out.tool_calls.iter().map(|c| call_json(c, new_id(), None)).collect();
    message["tool_calls"] = json!(calls);
    (message, if finish == "stop" { "tool_calls" } else { finish })
}

/// One choice's stream: the deltas each piece of text makes certain.
pub struct ChatStream {
    parser: StreamParser<ChatReader>,
    parallel: bool,
    called: bool,
}

impl ChatStream {
    pub fn new(reader: ChatReader, parallel: bool) -> Self {
        ChatStream {
            parser: StreamParser::new(reader),
            parallel,
            called: false,
        }
    }

    /// The chunk deltas (`{"content": ...}`, `{"reasoning_content": ...}`,
    /// `{"tool_calls": [...]}`) that `piece` makes certain.
    pub fn push(&mut self, piece: &str, new_id: &mut dyn FnMut() -> String) -> Vec<Value> {
        let deltas = self.parser.push(piece);
        shape(deltas, self.parallel, &mut self.called, new_id)
    }

    /// The last deltas, and the finish reason (`tool_calls` when it called
    /// tools and `finish` is `stop`).
    pub fn finish(self, finish: &'static str, new_id: &mut dyn FnMut() -> String) -> (Vec<Value>, &'static str) {
        let ChatStream {
            parser,
            parallel,
            mut called,
        } = self;
        let (deltas, _) = parser.finish();
        let shaped = shape(deltas, parallel, &mut called, new_id);
        (shaped, if called && finish == "stop" { "tool_calls" } else { finish })
    }
}

/// Stream deltas as OpenAI's chunk deltas (only the first call unless
/// `parallel`); `called` is set once a call is sent.
fn shape(deltas: Vec<Delta>, parallel: bool, called: &mut bool, new_id: &mut dyn FnMut() -> String) -> Vec<Value> {
    let mut out = Vec::new();
    for d in deltas {
        match d {
            Delta::Reasoning(t) => out.push(json!({"reasoning_content": t})),
            Delta::Content(t) => out.push(json!({"content": t})),
            Delta::ToolCall { index, call } if parallel || index == 0 => {
                *called = true;
                out.push(json!({"tool_calls": [call_json(&call, new_id(), Some(index))]}));
            }
            Delta::ToolCall { .. } => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use larder_engine::tool_calls::ToolFamily;

    fn hermes() -> ChatReader {
        ChatReader(Arc::from(ToolFamily::Hermes.parser()))
    }

    fn ids() -> impl FnMut() -> String {
        let mut n = 0;
        move || {
            n += 1;
            format!("call_{n}")
        }
    }

    #[test]
    fn calls_are_read_and_malformed_ones_are_text() {
        let good = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
        let (m, finish) = whole_message(&hermes(), good, "stop", true, &mut ids());
        assert_eq!(finish, "tool_calls");
        assert_eq!(m["content"], Value::Null);
        assert_eq!(m["tool_calls"][0]["function"], json!({"name": "f", "arguments": "{\"a\": 1}"}));
        assert_eq!(m["tool_calls"][0]["id"], "call_1");
        for (bad, reason) in [
            ("<tool_call>\n{bad json}\n</tool_call>", "stop"),
            ("<tool_call>\n{\"name\": \"f\", \"argu", "length"),
            ("<tool_call>\n[1, 2]\n</tool_call>", "stop"),
        ] {
            let (m, finish) = whole_message(&hermes(), bad, reason, true, &mut ids());
            assert_eq!((m["content"].as_str(), finish), (Some(bad), reason), "{bad}");
            assert!(m.get("tool_calls").is_none());
            let mut s = ChatStream::new(hermes(), true);
            let mut text = String::new();
            for piece in bad.split_inclusive(['\n', ',']) {
                for d in s.push(piece, &mut ids()) {
                    text.push_str(d["content"].as_str().unwrap());
                }
            }
            let (rest, finish) = s.finish(reason, &mut ids());
            for d in rest {
                text.push_str(d["content"].as_str().unwrap());
            }
            assert_eq!((text.as_str(), finish), (bad, reason));
        }
    }

    #[test]
    fn only_the_first_call_without_parallel_calls() {
        let two = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>";
        let (m, _) = whole_message(&hermes(), two, "stop", true, &mut ids());
        assert_eq!(m["tool_calls"].as_array().unwrap().len(), 2);
        let (m, _) = whole_message(&hermes(), two, "stop", false, &mut ids());
        assert_eq!(m["tool_calls"].as_array().unwrap().len(), 1);
        let mut s = ChatStream::new(hermes(), false);
        let mut calls = s.push(two, &mut ids());
        calls.extend(s.finish("stop", &mut ids()).0);
        assert_eq!(calls.len(), 1, "{calls:?}");
    }

    #[test]
    fn tool_requests_are_checked() {
        let parse = |v: Value| parse_tools(v.as_object().unwrap());
        let tool = json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}});
        assert_eq!(parse(json!({"tools": [tool]})).unwrap().unwrap().choice, ToolChoice::Auto);
        assert_eq!(parse(json!({"tools": [tool], "tool_choice": "none"})).unwrap(), None);
        let e = parse(json!({"tools": [tool, tool]})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[1]"));
        let e = parse(json!({"tools": [tool], "tool_choice": {"type": "function", "function": {"name": "g"}}})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        let e = parse(json!({"tools": [{"type": "code_interpreter"}]})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].type"));
        let e = parse(json!({"tools": [tool], "parallel_tool_calls": 1})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("parallel_tool_calls"));
        let many: Vec<Value> = (0..129)
            .map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}}))
            .collect();
        assert_eq!(parse(json!({"tools": many})).unwrap_err().param.as_deref(), Some("tools"));
    }
}
