//! Anthropic's Messages API: `POST /v1/messages` and
//! `POST /v1/messages/count_tokens`, parsed into the server's chat request
//! ([`crate::agent`]) and run on the same admission, queue and engine as
//! chat completions; answers and errors in Anthropic's shapes.
//!
//! Accepted: `model`, `messages` (roles user and assistant; content a string
//! or blocks: `text`, `tool_use`, `tool_result`, and `thinking` /
//! `redacted_thinking` in assistant turns, which are dropped from the
//! prompt as chat templates drop earlier reasoning), `system` (a string or
//! text blocks), `max_tokens` (required), `stop_sequences`, `temperature`,
//! `top_p`, `top_k`, `metadata`, `stream`, `tools`, `tool_choice` (`auto`,
//! `any`, `tool` with a name, `none`; `disable_parallel_tool_use`),
//! `thinking`, `service_tier`; the `anthropic-version` and `anthropic-beta`
//! headers are accepted and not needed. Tools and tool turns are rendered
//! by the model's chat template ([`crate::agent::to_request`]); its output
//! is read by its own parser into `thinking`, `text` and `tool_use` blocks
//! (`stop_reason: "tool_use"` when it called tools). `thinking` switches
//! the template's thinking on or off (`enable_thinking`, Kimi K3's
//! `thinking`); without it the template's default holds. `budget_tokens`
//! is enforced as the reasoning budget (`max_reasoning_tokens`: once spent,
//! the close of the reasoning is forced).
//!
//! A stream sends `message_start`, `ping`, then per block
//! `content_block_start`, its deltas (`thinking_delta`, `text_delta`,
//! `input_json_delta` with a call's whole arguments) and
//! `content_block_stop`, then `message_delta` (stop reason, output tokens)
//! and `message_stop`; a failure midway sends an `error` event and ends.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::agent::{self, opt_str, req_str, Conversation, Finish, Limits, StreamShape, ToolCall, ToolSpec, Turn};
use crate::api::ApiError;
use crate::exchange::{json_reply, ReplyBody};
use crate::fields;
use crate::state::State;
use crate::worker::Worker;

/// Most `stop_sequences` a request may give.
pub const MAX_STOP_SEQUENCES: usize = 16;

const FIELDS: &[&str] = &[
    "model",
    "messages",
    "system",
    "max_tokens",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "metadata",
    "stream",
    "tools",
    "tool_choice",
    "thinking",
    "service_tier",
];
const COUNT_FIELDS: &[&str] = &["model", "messages", "system", "tools", "tool_choice", "thinking"];

/// The Anthropic error type for an HTTP status.
fn error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// Anthropic's error body: `{"type": "error", "error": {"type", "message"}}`.
pub fn error_body(e: &ApiError) -> Value {
    json!({"type": "error", "error": {"type": error_type(e.status), "message": e.message}})
}

/// An error reply in Anthropic's shape (5xx logged in full; `retry-after`
/// on 429 and 503, the connection closed after a refused body).
pub fn error_reply(e: &ApiError) -> Response<ReplyBody> {
    let mut r = crate::exchange::body_error(e);
    let body = error_body(e).to_string();
    *r.body_mut() = ReplyBody::Full(http_body_util::Full::new(Bytes::from(body)));
    r.headers_mut().remove(hyper::header::CONTENT_LENGTH);
    r
}

/// Parses a Messages body (`count`: a count_tokens body, without
/// `max_tokens` and the sampling fields).
pub fn parse(body: &[u8], model_id: &str, count: bool) -> Result<Conversation, ApiError> {
    let obj = agent::body_object(body)?;
    agent::only_fields(&obj, if count { COUNT_FIELDS } else { FIELDS }, "")?;
    agent::check_model(&obj, model_id)?;
    let thinking = match obj.get("thinking") {
        None | Some(Value::Null) => None,
        Some(t) if t.get("type").and_then(Value::as_str) == Some("disabled") => Some((false, None)),
        Some(t) if t.get("type").and_then(Value::as_str) == Some("enabled") => {
            match t
                .get("budget_tokens")
                .and_then(Value::as_u64)
                .filter(|&b| (1024..=u32::MAX as u64).contains(&b))
            {
                Some(budget) => Some((true, Some(budget as usize))),
                None => {
                    return Err(ApiError::invalid(
                        "thinking.budget_tokens",
                        "thinking.budget_tokens must be an integer of at least 1024",
                    ))
                }
            }
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "thinking",
                "thinking must be {\"type\": \"enabled\" | \"disabled\", ...}",
            ))
        }
    };
    if let Some(v) = obj.get("metadata").filter(|v| !v.is_null() && !v.is_object()) {
        return Err(ApiError::invalid(
            "metadata",
            format!("metadata must be an object, not {}", agent::kind_of(v)),
        ));
    }
    let (tool_choice, parallel_tool_calls) = tool_choice(obj.get("tool_choice"))?;
    opt_str(&obj, "service_tier", "")?;
    let mut turns = system(obj.get("system"))?;
    turns.extend(messages(obj.get("messages"))?);
    let limits = if count {
        Limits::default()
    } else {
        let max_tokens = fields::opt_positive(&obj, "max_tokens")?
            .ok_or_else(|| ApiError::invalid("max_tokens", "max_tokens is required (a positive integer)"))?;
        let top_p = fields::top_p(&obj)?;
        let top_k = fields::top_k(&obj)?;
        Limits {
            max_tokens: Some(max_tokens),
            temperature: fields::opt_number(&obj, "temperature", 0.0, 1.0)?,
            top_p,
            top_k,
            stop: stop_sequences(obj.get("stop_sequences"))?,
            stream: fields::opt_flag(&obj, "stream")?,
        }
    };
    let mut conversation = Conversation::new(turns, tools(obj.get("tools"))?, limits);
    conversation.tool_choice = tool_choice;
    conversation.parallel_tool_calls = parallel_tool_calls;
    if let Some((on, budget)) = thinking {
        // Qwen3's and DeepSeek's templates read `enable_thinking`, Kimi K3's `thinking`.
        conversation.template_kwargs.insert("enable_thinking".into(), json!(on));
        conversation.template_kwargs.insert("thinking".into(), json!(on));
        conversation.max_reasoning_tokens = budget;
    }
    Ok(conversation)
}

/// `tool_choice`: `{"type": "auto" | "any" | "tool" | "none", "name",
/// "disable_parallel_tool_use"}` (default auto, parallel calls allowed).
fn tool_choice(v: Option<&Value>) -> Result<(Option<agent::ToolChoice>, bool), ApiError> {
    let o = match v {
        None | Some(Value::Null) => return Ok((Some(agent::ToolChoice::Auto), true)),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(ApiError::invalid("tool_choice", "tool_choice must be an object with a `type`")),
    };
    agent::only_fields(o, &["type", "name", "disable_parallel_tool_use"], "tool_choice")?;
    let parallel = match o.get("disable_parallel_tool_use") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => !b,
        Some(_) => {
            return Err(ApiError::invalid(
                "tool_choice.disable_parallel_tool_use",
                "disable_parallel_tool_use must be a boolean",
            ))
        }
    };
    let choice = match o.get("type").and_then(Value::as_str) {
        Some("auto") => Some(agent::ToolChoice::Auto),
        Some("any") => Some(agent::ToolChoice::Required),
        Some("none") => None,
        Some("tool") => Some(agent::ToolChoice::Function(req_str(o, "name", "tool_choice")?.to_string())),
        _ => {
            return Err(ApiError::invalid(
                "tool_choice.type",
                "tool_choice.type must be auto, any, tool or none",
            ))
        }
    };
    Ok((choice, parallel))
}

fn stop_sequences(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let bad = || {
        ApiError::invalid(
            "stop_sequences",
            format!("stop_sequences must be a list of up to {MAX_STOP_SEQUENCES} non-empty strings"),
        )
    };
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) if a.len() <= MAX_STOP_SEQUENCES => a
            .iter()
            .map(|s| s.as_str().filter(|s| !s.is_empty()).map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(bad),
        Some(_) => Err(bad()),
    }
}

/// `system`: a string or a list of text blocks.
fn system(v: Option<&Value>) -> Result<Vec<Turn>, ApiError> {
    let text = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => {
            let mut text = String::new();
            for (i, b) in blocks.iter().enumerate() {
                text.push_str(&text_block(b, &format!("system[{i}]"))?);
            }
            text
        }
        Some(v) => {
            return Err(ApiError::invalid(
                "system",
                format!("system must be a string or a list of text blocks, not {}", agent::kind_of(v)),
            ))
        }
    };
    Ok(vec![Turn::System(text)])
}

/// A `text` block's text.
fn text_block(b: &Value, param: &str) -> Result<String, ApiError> {
    let o = b
        .as_object()
        .filter(|o| o.get("type").and_then(Value::as_str) == Some("text"))
        .ok_or_else(|| ApiError::invalid(param, "expected a text block {\"type\": \"text\", \"text\": ...}"))?;
    agent::only_fields(o, &["type", "text", "cache_control", "citations"], param)?;
    Ok(req_str(o, "text", param)?.to_string())
}

fn messages(v: Option<&Value>) -> Result<Vec<Turn>, ApiError> {
    let list = v
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
        .ok_or_else(|| ApiError::invalid("messages", "messages must be a non-empty list"))?;
    let mut turns = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let param = format!("messages[{i}]");
        let o = m
            .as_object()
            .ok_or_else(|| ApiError::invalid(&param, "each message must be an object {\"role\", \"content\"}"))?;
        agent::only_fields(o, &["role", "content"], &param)?;
        let role = req_str(o, "role", &param)?;
        if role != "user" && role != "assistant" {
            return Err(ApiError::invalid(
                &format!("{param}.role"),
                format!("role must be \"user\" or \"assistant\", not {role:?} (system instructions go in `system`)"),
            ));
        }
        let assistant = role == "assistant";
        let blocks = match o.get("content") {
            Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
            Some(Value::Array(a)) => a.clone(),
            _ => {
                return Err(ApiError::invalid(
                    &format!("{param}.content"),
                    "content must be a string or a list of content blocks",
                ))
            }
        };
        let (mut text, mut calls) = (String::new(), Vec::new());
        for (j, b) in blocks.iter().enumerate() {
            let bp = format!("{param}.content[{j}]");
            let kind = b.get("type").and_then(Value::as_str).unwrap_or("");
            match (kind, assistant) {
                ("text", _) => text.push_str(&text_block(b, &bp)?),
                ("tool_use", true) => calls.push(tool_use(b, &bp)?),
                ("thinking" | "redacted_thinking", true) => {}
                ("tool_result", false) => {
                    if !text.is_empty() {
                        turns.push(Turn::User(std::mem::take(&mut text)));
                    }
                    turns.push(tool_result(b, &bp)?);
                }
                _ => {
                    return Err(ApiError::invalid(
                        &bp,
                        format!(
                            "content block of type {kind:?} is not supported in a {role} message \
                             (text; tool_use and thinking from the assistant; tool_result from the user)"
                        ),
                    ))
                }
            }
        }
        if assistant {
            turns.push(Turn::Assistant { text, tool_calls: calls });
        } else if !text.is_empty() || !matches!(turns.last(), Some(Turn::ToolResult { .. })) {
            turns.push(Turn::User(text));
        }
    }
    Ok(turns)
}

fn tool_use(b: &Value, param: &str) -> Result<ToolCall, ApiError> {
    let o = b
        .as_object()
        .ok_or_else(|| ApiError::invalid(param, "a tool_use block must be an object"))?;
    agent::only_fields(o, &["type", "id", "name", "input", "cache_control"], param)?;
    let arguments = o
        .get("input")
        .filter(|v| v.is_object())
        .cloned()
        .ok_or_else(|| ApiError::invalid(&format!("{param}.input"), "a tool_use block's input must be an object"))?;
    Ok(ToolCall {
        id: req_str(o, "id", param)?.to_string(),
        name: req_str(o, "name", param)?.to_string(),
        arguments,
    })
}

fn tool_result(b: &Value, param: &str) -> Result<Turn, ApiError> {
    let o = b
        .as_object()
        .ok_or_else(|| ApiError::invalid(param, "a tool_result block must be an object"))?;
    agent::only_fields(o, &["type", "tool_use_id", "content", "is_error", "cache_control"], param)?;
    let content = match o.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) => {
            let mut text = String::new();
            for (k, part) in a.iter().enumerate() {
                text.push_str(&text_block(part, &format!("{param}.content[{k}]"))?);
            }
            text
        }
        Some(_) => return Err(ApiError::invalid(param, "tool_result content must be a string or text blocks")),
    };
    let is_error = match o.get("is_error") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::invalid(&format!("{param}.is_error"), "is_error must be a boolean")),
    };
    Ok(Turn::ToolResult {
        call_id: req_str(o, "tool_use_id", param)?.to_string(),
        content,
        is_error,
    })
}

fn tools(v: Option<&Value>) -> Result<Vec<ToolSpec>, ApiError> {
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::invalid("tools", "tools must be a list")),
    };
    list.iter()
        .enumerate()
        .map(|(i, t)| {
            let param = format!("tools[{i}]");
            let o = t
                .as_object()
                .ok_or_else(|| ApiError::invalid(&param, "each tool must be an object"))?;
            if let Some(kind) = o.get("type").and_then(Value::as_str).filter(|k| *k != "custom") {
                return Err(ApiError::invalid(
                    &param,
                    format!("server tools ({kind}) are not supported; give client tools {{name, description, input_schema}}"),
                ));
            }
            agent::only_fields(o, &["type", "name", "description", "input_schema", "cache_control"], &param)?;
            let parameters = o
                .get("input_schema")
                .filter(|s| s.is_object())
                .cloned()
                .ok_or_else(|| ApiError::invalid(&format!("{param}.input_schema"), "input_schema must be a JSON Schema object"))?;
            Ok(ToolSpec {
                name: req_str(o, "name", &param)?.to_string(),
                description: opt_str(o, "description", &param)?.map(str::to_string),
                parameters,
            })
        })
        .collect()
}

/// Anthropic's stop reason for how generation ended.
fn stop_reason(finish: &Finish, calls: bool) -> &'static str {
    match (finish.reason, &finish.stop_sequence) {
        _ if calls => "tool_use",
        ("length", _) => "max_tokens",
        (_, Some(_)) => "stop_sequence",
        _ => "end_turn",
    }
}

/// The `content` blocks of an answer: its reasoning, its text (when there
/// is some, or nothing else), then its tool calls.
fn content(output: &agent::Output) -> Vec<Value> {
    let mut blocks = Vec::new();
    if !output.reasoning.is_empty() {
        blocks.push(json!({"type": "thinking", "thinking": output.reasoning, "signature": ""}));
    }
    if !output.text.is_empty() || output.tool_calls.is_empty() {
        blocks.push(json!({"type": "text", "text": output.text}));
    }
    for c in &output.tool_calls {
        blocks.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}));
    }
    blocks
}

/// The whole answer of a finished generation.
pub fn message(id: &str, model: &str, output: &agent::Output, finish: &Finish) -> Value {
    json!({
        "id": id, "type": "message", "role": "assistant", "model": model,
        "content": content(output),
        "stop_reason": stop_reason(finish, !output.tool_calls.is_empty()),
        "stop_sequence": finish.stop_sequence,
        "usage": {"input_tokens": finish.prompt_tokens, "output_tokens": finish.completion_tokens,
                  "cache_read_input_tokens": finish.cached_tokens, "cache_creation_input_tokens": 0},
    })
}

/// `POST /v1/messages`.
pub async fn create(state: &Arc<State>, worker: &Worker, req: Request<Incoming>) -> Response<ReplyBody> {
    let body = match crate::exchange::read_body(&state.config, req).await {
        Ok(b) => b,
        Err(e) => return error_reply(&e),
    };
    let request = match parse(&body, &state.config.served_name, false).and_then(|c| agent::to_request(&c, "tools", "messages")) {
        Ok(r) => r,
        Err(e) => return error_reply(&e),
    };
    let (prompt_tokens, mut rx) = match crate::exchange::admit(&state.abort, worker, &request).await {
        Ok(started) => started,
        Err(e) => return error_reply(&e),
    };
    let id = agent::fresh_id("msg_", state.ids.fetch_add(1, Ordering::Relaxed));
    let model = state.config.served_name.clone();
    let abort = state.abort.clone();
    if request.stream {
        let (out, body) = mpsc::unbounded_channel::<Bytes>();
        let shape = Stream {
            id,
            model,
            prompt_tokens,
            open: None,
            blocks: 0,
            texted: false,
        };
        let parallel = request.tools.as_ref().is_none_or(|t| t.parallel);
        tokio::spawn(agent::drive(shape, prompt_tokens, rx, parallel, out, abort));
        return crate::exchange::sse_reply(body);
    }
    let mut abort = abort;
    match agent::collect(prompt_tokens, &mut rx, &mut abort).await {
        Ok((text, finish)) => {
            let parallel = request.tools.as_ref().is_none_or(|t| t.parallel);
            let output = agent::split_output(rx.reader.as_ref(), text, parallel, &state.ids);
            json_reply(200, &message(&id, &model, &output, &finish))
        }
        Err(e) => error_reply(&e),
    }
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": n}`, the rendered
/// prompt's length in tokens.
pub async fn count_tokens(state: &Arc<State>, worker: &Worker, req: Request<Incoming>) -> Response<ReplyBody> {
    let body = match crate::exchange::read_body(&state.config, req).await {
        Ok(b) => b,
        Err(e) => return error_reply(&e),
    };
    let request = match parse(&body, &state.config.served_name, true).and_then(|c| agent::to_request(&c, "tools", "messages")) {
        Ok(r) => r,
        Err(e) => return error_reply(&e),
    };
    match crate::exchange::count_prompt(&state.abort, worker, &request).await {
        Ok(n) => json_reply(200, &json!({"input_tokens": n})),
        Err(e) => error_reply(&e),
    }
}

/// A Messages stream: a thinking block while the model reasons, a text
/// block while it answers, a `tool_use` block per call at the end, then the
/// stop reason.
struct Stream {
    id: String,
    model: String,
    prompt_tokens: usize,
    /// The block open now (`thinking` or `text`), if any.
    open: Option<&'static str>,
    /// Blocks started so far (the next block's index).
    blocks: usize,
    /// A text block was started.
    texted: bool,
}

impl Stream {
    /// Events ending the open block, if any.
    fn close(&mut self) -> Vec<Bytes> {
        match self.open.take() {
            Some(_) => vec![agent::sse(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": self.blocks - 1}),
            )],
            None => Vec::new(),
        }
    }

    /// Events for a delta of a `kind` block (opened first when needed).
    fn delta(&mut self, kind: &'static str, delta: Value) -> Vec<Bytes> {
        let mut out = Vec::new();
        if self.open != Some(kind) {
            out.extend(self.close());
            let block = if kind == "thinking" {
                json!({"type": "thinking", "thinking": "", "signature": ""})
            } else {
                json!({"type": "text", "text": ""})
            };
            out.push(agent::sse(
                "content_block_start",
                &json!({"type": "content_block_start", "index": self.blocks, "content_block": block}),
            ));
            self.open = Some(kind);
            self.blocks += 1;
        }
        let index = self.blocks - 1;
        out.push(agent::sse(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
        ));
        out
    }
}

impl StreamShape for Stream {
    fn started(&mut self) -> Vec<Bytes> {
        let message = json!({"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0}});
        vec![
            agent::sse("message_start", &json!({"type": "message_start", "message": message})),
            agent::sse("ping", &json!({"type": "ping"})),
        ]
    }

    fn text(&mut self, text: &str) -> Vec<Bytes> {
        self.texted = true;
        self.delta("text", json!({"type": "text_delta", "text": text}))
    }

    fn reasoning(&mut self, text: &str) -> Vec<Bytes> {
        self.delta("thinking", json!({"type": "thinking_delta", "thinking": text}))
    }

    fn done(&mut self, finish: Finish, output: agent::Output) -> Vec<Bytes> {
        let mut out = Vec::new();
        if !self.texted && output.tool_calls.is_empty() {
            // No text and no calls: still one (empty) text block, as the
            // whole answer has.
            out.extend(self.text(""));
        }
        out.extend(self.close());
        for c in &output.tool_calls {
            let index = self.blocks;
            self.blocks += 1;
            let block = json!({"type": "tool_use", "id": c.id, "name": c.name, "input": {}});
            out.push(agent::sse(
                "content_block_start",
                &json!({"type": "content_block_start", "index": index, "content_block": block}),
            ));
            let delta = json!({"type": "input_json_delta", "partial_json": c.arguments.to_string()});
            out.push(agent::sse(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ));
            out.push(agent::sse(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            ));
        }
        let delta = json!({"type": "message_delta",
            "delta": {"stop_reason": stop_reason(&finish, !output.tool_calls.is_empty()), "stop_sequence": finish.stop_sequence},
            "usage": {"output_tokens": finish.completion_tokens}});
        out.push(agent::sse("message_delta", &delta));
        out.push(agent::sse("message_stop", &json!({"type": "message_stop"})));
        out
    }

    fn failed(&mut self, error: &ApiError) -> Vec<Bytes> {
        vec![agent::sse("error", &error_body(error))]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_json(v: Value) -> Result<Conversation, ApiError> {
        parse(v.to_string().as_bytes(), "m", false)
    }

    #[test]
    fn accepts_what_anthropic_clients_send() {
        let c = parse_json(json!({"model": "m", "max_tokens": 5, "system": [{"type": "text", "text": "be brief"}],
            "messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "x"}, {"type": "text", "text": "yo"}]},
                         {"role": "user", "content": [{"type": "text", "text": "more", "cache_control": {"type": "ephemeral"}}]}],
            "stop_sequences": ["END"], "temperature": 0, "top_k": 3, "metadata": {"user_id": "u"}, "thinking": {"type": "disabled"}}))
        .unwrap();
        assert_eq!(
            c.turns,
            vec![
                Turn::System("be brief".into()),
                Turn::User("hi".into()),
                Turn::Assistant {
                    text: "yo".into(),
                    tool_calls: vec![]
                },
                Turn::User("more".into())
            ]
        );
        assert_eq!(
            (c.limits.max_tokens, c.limits.top_k, c.limits.stop.clone()),
            (Some(5), Some(3), vec!["END".to_string()])
        );
        let tools = parse_json(
            json!({"model": "m", "max_tokens": 5, "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "42"}]}]}),
        )
        .unwrap();
        assert_eq!(tools.tools[0].name, "f");
        assert!(matches!(&tools.turns[2], Turn::ToolResult { call_id, content, .. } if call_id == "t1" && content == "42"));
        let request = agent::to_request(&tools, "tools", "messages").unwrap();
        assert_eq!(request.tools.as_ref().map(|t| t.schemas.len()), Some(1));
        let crate::api::Prompt::Chat(messages) = &request.prompt else {
            panic!()
        };
        assert_eq!(messages[1].tool_calls[0].function.arguments, r#"{"a":1}"#);
        assert_eq!(messages[2].tool_call_id.as_deref(), Some("t1"));
        assert_eq!(messages[2].name.as_deref(), Some("f"));
    }

    #[test]
    fn refuses_with_anthropic_shaped_errors() {
        let base = || json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
        let with = |k: &str, v: Value| {
            let mut b = base();
            b[k] = v;
            parse_json(b).unwrap_err()
        };
        assert_eq!(
            with("thinking", json!({"type": "enabled", "budget_tokens": 10})).param.as_deref(),
            Some("thinking.budget_tokens")
        );
        assert_eq!(
            with("tool_choice", json!({"type": "some"})).param.as_deref(),
            Some("tool_choice.type")
        );
        assert_eq!(with("max_tokens", json!(null)).param.as_deref(), Some("max_tokens"));
        assert_eq!(with("bogus", json!(1)).param.as_deref(), Some("bogus"));
        assert_eq!(with("model", json!("other")).status, 404);
        assert_eq!(with("temperature", json!(1.5)).param.as_deref(), Some("temperature"));
        let img = json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]);
        assert_eq!(with("messages", img).param.as_deref(), Some("messages[0].content[0]"));
        let e = with("messages", json!([{"role": "system", "content": "x"}]));
        assert_eq!(error_body(&e)["error"]["type"], "invalid_request_error");
        assert_eq!(
            error_body(&ApiError::plain(429, "x", None, "busy"))["error"]["type"],
            "rate_limit_error"
        );
        assert!(parse(br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#, "m", true).is_ok());
    }
}
