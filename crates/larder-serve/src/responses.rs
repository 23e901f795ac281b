//! OpenAI's Responses API: `POST /v1/responses` (plain or streamed) and
//! `GET /v1/responses/{id}`, parsed into the server's chat request
//! ([`crate::agent`]) and run on the same admission, queue and engine as
//! chat completions; answers and errors in OpenAI's shapes.
//!
//! Accepted: `model`, `input` (a string, or items: messages `{role,
//! content}` with roles user, assistant, system and developer and content a
//! string or `input_text` / `output_text` parts; `function_call` and
//! `function_call_output` items; `reasoning` items, dropped from the prompt
//! as chat templates drop earlier reasoning), `instructions`,
//! `max_output_tokens`, `temperature`, `top_p`, `stream`, `store`,
//! `previous_response_id`, `metadata`, `user`, `tools` (function tools),
//! `tool_choice` (`auto`, `none`, `required`, a named function),
//! `parallel_tool_calls`, `reasoning` (`effort`: the template's
//! `reasoning_effort`), and the defaults clients send (`truncation:
//! "disabled"`, `text: {format: {type: "text"}}`, empty `include`, ...).
//! Tools and tool items are rendered by the model's chat template
//! ([`crate::agent::to_request`]); its output is read by its own parser.
//! The output items are the message (always first, its text possibly
//! empty), then a `function_call` item per call, then a `reasoning` item
//! holding the reasoning text when the model reasoned; streamed, the calls
//! and the reasoning come whole at the end.
//!
//! [`Store`] keeps stored responses (`store`, true by default) in memory,
//! bounded by count and bytes, oldest out first: a request naming one as
//! `previous_response_id` continues its conversation (the earlier input
//! and output turns come before the new input; `instructions` are not
//! carried over, as OpenAI does).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::agent::{self, opt_str, req_str, Conversation, Finish, Limits, StreamShape, ToolCall, ToolSpec, Turn};
use crate::api::ApiError;
use crate::exchange::{error_reply, json_reply, ReplyBody};
use crate::fields;
use crate::state::State;
use crate::worker::Worker;

pub use crate::response_store::STORE_BYTES;
/// Most responses the store keeps.
pub use crate::response_store::STORE_RESPONSES;

const FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stream",
    "stream_options",
    "store",
    "previous_response_id",
    "metadata",
    "user",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_tool_calls",
    "truncation",
    "text",
    "reasoning",
    "include",
    "service_tier",
    "top_logprobs",
    "prompt_cache_key",
    "safety_identifier",
    "background",
];

/// A stored response: the conversation up to and including its output, and
/// the response object `GET /v1/responses/{id}` answers.
/// A parsed Responses request: the conversation (without the earlier
/// turns of `previous_response_id`) and what the response object echoes.
#[derive(Debug, Clone)]
pub struct Parsed {
    pub conversation: Conversation,
    pub instructions: Option<String>,
    pub previous_response_id: Option<String>,
    pub store: bool,
    /// The request's fields the response object repeats.
    pub echo: Map<String, Value>,
}

/// Parses a Responses body.
pub fn parse(body: &[u8], model_id: &str) -> Result<Parsed, ApiError> {
    let obj = agent::body_object(body)?;
    agent::only_fields(&obj, FIELDS, "")?;
    agent::check_model(&obj, model_id)?;
    refuse_unsupported(&obj)?;
    let instructions = opt_str(&obj, "instructions", "")?.map(str::to_string);
    let previous_response_id = opt_str(&obj, "previous_response_id", "")?.map(str::to_string);
    let store = match obj.get("store") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::invalid("store", "store must be a boolean")),
    };
    let top_p = fields::top_p(&obj)?;
    let limits = Limits {
        max_tokens: fields::opt_positive(&obj, "max_output_tokens")?,
        temperature: fields::opt_number(&obj, "temperature", 0.0, 2.0)?,
        top_p,
        top_k: None,
        stop: Vec::new(),
        stream: fields::opt_flag(&obj, "stream")?,
    };
    let mut echo = Map::new();
    for k in [
        "max_output_tokens",
        "temperature",
        "top_p",
        "metadata",
        "user",
        "tool_choice",
        "parallel_tool_calls",
    ] {
        echo.insert(k.to_string(), obj.get(k).cloned().unwrap_or(Value::Null));
    }
    let mut conversation = Conversation::new(input(obj.get("input"))?, tools(obj.get("tools"))?, limits);
    conversation.tool_choice = tool_choice(obj.get("tool_choice"))?;
    conversation.parallel_tool_calls = obj.get("parallel_tool_calls").and_then(Value::as_bool).unwrap_or(true);
    if let Some(effort) = obj.get("reasoning").and_then(|r| r.get("effort")).filter(|e| !e.is_null()) {
        match effort.as_str() {
            Some(e @ ("minimal" | "low" | "medium" | "high")) => {
                conversation.template_kwargs.insert("reasoning_effort".into(), json!(e));
            }
            _ => {
                return Err(ApiError::invalid(
                    "reasoning.effort",
                    "reasoning.effort must be minimal, low, medium or high",
                ))
            }
        }
    }
    Ok(Parsed {
        conversation,
        instructions,
        previous_response_id,
        store,
        echo,
    })
}

/// `tool_choice`: `auto` (default), `none`, `required`, or `{"type":
/// "function", "name"}`.
fn tool_choice(v: Option<&Value>) -> Result<Option<agent::ToolChoice>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(Some(agent::ToolChoice::Auto)),
        Some(Value::String(s)) if s == "auto" => Ok(Some(agent::ToolChoice::Auto)),
        Some(Value::String(s)) if s == "required" => Ok(Some(agent::ToolChoice::Required)),
        Some(Value::String(s)) if s == "none" => Ok(None),
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            agent::only_fields(o, &["type", "name"], "tool_choice")?;
            Ok(Some(agent::ToolChoice::Function(req_str(o, "name", "tool_choice")?.to_string())))
        }
        Some(v) => Err(ApiError::invalid(
            "tool_choice",
            format!("tool_choice must be auto, none, required or {{\"type\": \"function\", \"name\": ...}}, not {v}"),
        )),
    }
}

/// Refuses the values of accepted fields the server cannot honour.
fn refuse_unsupported(obj: &Map<String, Value>) -> Result<(), ApiError> {
    let is = |k: &str, ok: &dyn Fn(&Value) -> bool, why: &str| -> Result<(), ApiError> {
        match obj.get(k) {
            Some(v) if !v.is_null() && !ok(v) => Err(ApiError::invalid(k, format!("`{k}` = {v} is not supported by this server{why}"))),
            _ => Ok(()),
        }
    };
    is("truncation", &|v| v == "disabled", "")?;
    is(
        "text",
        &|v| {
            v.as_object().is_some_and(|o| {
                o.iter().all(|(k, x)| match k.as_str() {
                    "format" => x.get("type").and_then(Value::as_str) == Some("text"),
                    "verbosity" => x.is_null() || x == "medium",
                    _ => false,
                })
            })
        },
        " (text output only)",
    )?;
    is(
        "reasoning",
        &|v| {
            v.as_object()
                .is_some_and(|o| o.keys().all(|k| ["effort", "summary", "generate_summary"].contains(&k.as_str())))
        },
        "",
    )?;
    is("include", &|v| v.as_array().is_some_and(|a| a.is_empty()), "")?;
    is("background", &|v| v == &Value::Bool(false), "")?;
    is("top_logprobs", &|v| v.as_u64() == Some(0), "")?;
    is("metadata", &Value::is_object, "")?;
    is("parallel_tool_calls", &Value::is_boolean, "")?;
    is("max_tool_calls", &Value::is_u64, "")?;
    is("stream_options", &Value::is_object, "")?;
    for k in ["user", "service_tier", "prompt_cache_key", "safety_identifier"] {
        is(k, &Value::is_string, "")?;
    }
    Ok(())
}

fn input(v: Option<&Value>) -> Result<Vec<Turn>, ApiError> {
    let items = match v {
        Some(Value::String(s)) => return Ok(vec![Turn::User(s.clone())]),
        Some(Value::Array(a)) if !a.is_empty() => a,
        _ => {
            return Err(ApiError::invalid(
                "input",
                "input must be a string or a non-empty list of input items",
            ))
        }
    };
    let mut turns = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let param = format!("input[{i}]");
        let o = item
            .as_object()
            .ok_or_else(|| ApiError::invalid(&param, "each input item must be an object"))?;
        let kind = opt_str(o, "type", &param)?.unwrap_or("message");
        match kind {
            "message" => turns.push(message_item(o, &param)?),
            "function_call" => {
                agent::only_fields(o, &["type", "id", "call_id", "name", "arguments", "status"], &param)?;
                let raw = req_str(o, "arguments", &param)?;
                let arguments = serde_json::from_str::<Value>(raw)
                    .ok()
                    .filter(Value::is_object)
                    .ok_or_else(|| ApiError::invalid(&format!("{param}.arguments"), "arguments must be a JSON object, as a string"))?;
                let call = ToolCall {
                    id: req_str(o, "call_id", &param)?.to_string(),
                    name: req_str(o, "name", &param)?.to_string(),
                    arguments,
                };
                // Calls right after the assistant's text belong to its turn.
                match turns.last_mut() {
                    Some(Turn::Assistant { tool_calls, .. }) => tool_calls.push(call),
                    _ => turns.push(Turn::Assistant {
                        text: String::new(),
                        tool_calls: vec![call],
                    }),
                }
            }
            "function_call_output" => {
                agent::only_fields(o, &["type", "id", "call_id", "output", "status"], &param)?;
                let content = match o.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => text_parts(parts, &format!("{param}.output"), &["input_text"])?,
                    _ => {
                        return Err(ApiError::invalid(
                            &format!("{param}.output"),
                            "output must be a string or input_text parts",
                        ))
                    }
                };
                turns.push(Turn::ToolResult {
                    call_id: req_str(o, "call_id", &param)?.to_string(),
                    content,
                    is_error: false,
                });
            }
            "reasoning" => {}
            other => {
                return Err(ApiError::invalid(
                    &param,
                    format!("input items of type {other:?} are not supported (message, function_call, function_call_output)"),
                ))
            }
        }
    }
    Ok(turns)
}

fn message_item(o: &Map<String, Value>, param: &str) -> Result<Turn, ApiError> {
    agent::only_fields(o, &["type", "id", "role", "content", "status", "phase"], param)?;
    let role = req_str(o, "role", param)?;
    let parts: &[&str] = if role == "assistant" {
        &["output_text", "input_text"]
    } else {
        &["input_text"]
    };
    let text = match o.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) => text_parts(a, &format!("{param}.content"), parts)?,
        _ => {
            return Err(ApiError::invalid(
                &format!("{param}.content"),
                "content must be a string or a list of text parts",
            ))
        }
    };
    Ok(match role {
        "user" => Turn::User(text),
        "system" | "developer" => Turn::System(text),
        "assistant" => Turn::Assistant {
            text,
            tool_calls: Vec::new(),
        },
        other => {
            return Err(ApiError::invalid(
                &format!("{param}.role"),
                format!("unsupported role {other:?} (user, assistant, system, developer)"),
            ))
        }
    })
}

/// The text of content parts whose types are among `kinds`.
fn text_parts(parts: &[Value], param: &str, kinds: &[&str]) -> Result<String, ApiError> {
    let mut text = String::new();
    for (j, p) in parts.iter().enumerate() {
        let pp = format!("{param}[{j}]");
        let o = p
            .as_object()
            .ok_or_else(|| ApiError::invalid(&pp, "each content part must be an object"))?;
        let kind = opt_str(o, "type", &pp)?.unwrap_or("");
        if !kinds.contains(&kind) {
            return Err(ApiError::invalid(
                &pp,
                format!("content part of type {kind:?} is not supported here ({})", kinds.join(", ")),
            ));
        }
        agent::only_fields(o, &["type", "text", "annotations", "logprobs"], &pp)?;
        text.push_str(req_str(o, "text", &pp)?);
    }
    Ok(text)
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
            let kind = req_str(o, "type", &param)?;
            if kind != "function" {
                return Err(ApiError::invalid(
                    &param,
                    format!("tools of type {kind:?} are not supported (function tools only)"),
                ));
            }
            agent::only_fields(o, &["type", "name", "description", "parameters", "strict"], &param)?;
            let parameters = match o.get("parameters") {
                None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
                Some(p) if p.is_object() => p.clone(),
                Some(_) => {
                    return Err(ApiError::invalid(
                        &format!("{param}.parameters"),
                        "parameters must be a JSON Schema object",
                    ))
                }
            };
            Ok(ToolSpec {
                name: req_str(o, "name", &param)?.to_string(),
                description: opt_str(o, "description", &param)?.map(str::to_string),
                parameters,
            })
        })
        .collect()
}

/// What the response object says besides its output and usage.
#[derive(Clone)]
struct Meta {
    id: String,
    item_id: String,
    model: String,
    created_at: u64,
    parsed: Arc<Parsed>,
}

impl Meta {
    /// The response object (`status`: in_progress, completed or incomplete).
    fn response(&self, status: &str, output: Vec<Value>, finish: Option<&Finish>) -> Value {
        let p = &self.parsed;
        let mut r = json!({
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "error": null, "incomplete_details": null, "instructions": p.instructions, "model": self.model,
            "output": output, "previous_response_id": p.previous_response_id,
            "reasoning": {"effort": null, "summary": null}, "store": p.store,
            "text": {"format": {"type": "text"}}, "truncation": "disabled", "tools": [], "usage": null,
        });
        for (k, v) in &p.echo {
            r[k] = v.clone();
        }
        r["tool_choice"] = p.echo.get("tool_choice").filter(|v| !v.is_null()).cloned().unwrap_or(json!("auto"));
        r["parallel_tool_calls"] = p
            .echo
            .get("parallel_tool_calls")
            .filter(|v| !v.is_null())
            .cloned()
            .unwrap_or(json!(true));
        r["metadata"] = p.echo.get("metadata").filter(|v| !v.is_null()).cloned().unwrap_or(json!({}));
        if let Some(f) = finish {
            if f.reason == "length" {
                r["incomplete_details"] = json!({"reason": "max_output_tokens"});
            }
            r["usage"] = json!({
                "input_tokens": f.prompt_tokens, "input_tokens_details": {"cached_tokens": f.cached_tokens},
                "output_tokens": f.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": f.prompt_tokens + f.completion_tokens,
            });
        }
        r
    }

    /// The assistant message item holding `text`.
    fn message(&self, text: &str, status: &str) -> Value {
        let content = if status == "in_progress" {
            json!([])
        } else {
            json!([{"type": "output_text", "text": text, "annotations": [], "logprobs": []}])
        };
        json!({"type": "message", "id": self.item_id, "role": "assistant", "status": status, "content": content})
    }

    /// The finished response; stored (with its conversation) when asked.
    fn finish(&self, state: &State, history: Vec<Turn>, output: agent::Output, finish: &Finish) -> Value {
        let status = if finish.reason == "length" { "incomplete" } else { "completed" };
        let mut items = vec![self.message(&output.text, status)];
        items.extend(output.tool_calls.iter().map(function_call_item));
        if !output.reasoning.is_empty() {
            items.push(
                json!({"type": "reasoning", "id": format!("rs_{}", &self.item_id["msg_".len()..]), "summary": [],
                              "content": [{"type": "reasoning_text", "text": output.reasoning}], "status": "completed"}),
            );
        }
        let response = self.response(status, items, Some(finish));
        if self.parsed.store {
            let mut turns = history;
            turns.push(Turn::Assistant {
                text: output.text,
                tool_calls: output.tool_calls,
            });
            state.responses.put(self.id.clone(), turns, response.clone());
        }
        response
    }
}

/// A `function_call` output item.
fn function_call_item(c: &ToolCall) -> Value {
    json!({"type": "function_call", "id": format!("fc_{}", c.id), "call_id": c.id, "name": c.name,
           "arguments": c.arguments.to_string(), "status": "completed"})
}

/// `POST /v1/responses`.
pub async fn create(state: &Arc<State>, worker: &Worker, req: Request<Incoming>) -> Response<ReplyBody> {
    let body = match crate::exchange::read_body(&state.config, req).await {
        Ok(b) => b,
        Err(e) => return crate::exchange::body_error(&e),
    };
    let parsed = match parse(&body, &state.config.served_name) {
        Ok(p) => p,
        Err(e) => return error_reply(&e),
    };
    // The stored conversation first, then the new input.
    let mut history = match &parsed.previous_response_id {
        None => Vec::new(),
        Some(prev) => match state.responses.get(prev) {
            Some(stored) => stored.turns,
            None => {
                return error_reply(&ApiError::invalid(
                    "previous_response_id",
                    format!("Previous response with id '{prev}' not found (this server keeps the latest {STORE_RESPONSES} stored responses, in memory)."),
                ))
            }
        },
    };
    history.extend(parsed.conversation.turns.iter().cloned());
    let mut conversation = parsed.conversation.clone();
    conversation.turns = parsed.instructions.iter().map(|i| Turn::System(i.clone())).collect();
    conversation.turns.extend(history.iter().cloned());
    let request = match agent::to_request(&conversation, "tools", "input") {
        Ok(r) => r,
        Err(e) => return error_reply(&e),
    };
    let (prompt_tokens, mut rx) = match crate::exchange::admit(&state.abort, worker, &request).await {
        Ok(started) => started,
        Err(e) => return error_reply(&e),
    };
    let n = state.ids.fetch_add(1, Ordering::Relaxed);
    let meta = Meta {
        id: agent::fresh_id("resp_", n),
        item_id: agent::fresh_id("msg_", n),
        model: state.config.served_name.clone(),
        created_at: crate::exchange::now(),
        parsed: Arc::new(parsed),
    };
    let mut abort = state.abort.clone();
    if request.stream {
        let (out, body) = mpsc::unbounded_channel::<Bytes>();
        let shape = Stream {
            meta,
            state: state.clone(),
            history,
            seq: 0,
        };
        let parallel = request.tools.as_ref().is_none_or(|t| t.parallel);
        tokio::spawn(agent::drive(shape, prompt_tokens, rx, parallel, out, abort));
        return crate::exchange::sse_reply(body);
    }
    match agent::collect(prompt_tokens, &mut rx, &mut abort).await {
        Ok((text, finish)) => {
            let parallel = request.tools.as_ref().is_none_or(|t| t.parallel);
            let output = agent::split_output(rx.reader.as_ref(), text, parallel, &state.ids);
            json_reply(200, &meta.finish(state, history, output, &finish))
        }
        Err(e) => error_reply(&e),
    }
}

/// `GET /v1/responses/{id}`: a stored response, or a 404.
pub fn get(state: &State, id: &str) -> Response<ReplyBody> {
    match state.responses.get(id) {
        Some(stored) => json_reply(200, &stored.response),
        None => error_reply(&ApiError {
            status: 404,
            ..ApiError::invalid("response_id", format!("No response with id '{id}' is stored on this server."))
        }),
    }
}

/// A Responses stream: numbered events for one message item.
struct Stream {
    meta: Meta,
    state: Arc<State>,
    history: Vec<Turn>,
    seq: u64,
}

impl Stream {
    fn event(&mut self, kind: &str, mut data: Value) -> Bytes {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        agent::sse(kind, &data)
    }

    /// The ids a content event names.
    fn at(&self) -> Value {
        json!({"item_id": self.meta.item_id, "output_index": 0, "content_index": 0})
    }
}

impl StreamShape for Stream {
    fn started(&mut self) -> Vec<Bytes> {
        let response = self.meta.response("in_progress", Vec::new(), None);
        let item = self.meta.message("", "in_progress");
        let mut part = self.at();
        part["part"] = json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
        vec![
            self.event("response.created", json!({"response": response})),
            self.event("response.in_progress", json!({"response": response})),
            self.event("response.output_item.added", json!({"output_index": 0, "item": item})),
            self.event("response.content_part.added", part),
        ]
    }

    fn text(&mut self, text: &str) -> Vec<Bytes> {
        let mut delta = self.at();
        delta["delta"] = json!(text);
        delta["logprobs"] = json!([]);
        vec![self.event("response.output_text.delta", delta)]
    }

    fn done(&mut self, finish: Finish, output: agent::Output) -> Vec<Bytes> {
        let history = std::mem::take(&mut self.history);
        let response = self.meta.finish(&self.state, history, output, &finish);
        let item = response["output"][0].clone();
        let text = item["content"][0]["text"].as_str().unwrap_or_default().to_string();
        let mut text_done = self.at();
        text_done["text"] = json!(text);
        text_done["logprobs"] = json!([]);
        let mut part_done = self.at();
        part_done["part"] = item["content"][0].clone();
        let last = if finish.reason == "length" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        let mut events = vec![
            self.event("response.output_text.done", text_done),
            self.event("response.content_part.done", part_done),
            self.event("response.output_item.done", json!({"output_index": 0, "item": item})),
        ];
        // The calls (and the reasoning item), each whole.
        let items: Vec<Value> = response["output"].as_array().map(|a| a[1..].to_vec()).unwrap_or_default();
        for (i, item) in items.into_iter().enumerate() {
            let index = i + 1;
            let mut added = item.clone();
            if item["type"] == "function_call" {
                added["arguments"] = json!("");
                added["status"] = json!("in_progress");
            }
            events.push(self.event("response.output_item.added", json!({"output_index": index, "item": added})));
            if item["type"] == "function_call" {
                let at = json!({"item_id": item["id"], "output_index": index});
                let mut delta = at.clone();
                delta["delta"] = item["arguments"].clone();
                events.push(self.event("response.function_call_arguments.delta", delta));
                let mut done = at;
                done["arguments"] = item["arguments"].clone();
                events.push(self.event("response.function_call_arguments.done", done));
            }
            events.push(self.event("response.output_item.done", json!({"output_index": index, "item": item})));
        }
        events.push(self.event(last, json!({"response": response})));
        events
    }

    fn failed(&mut self, error: &ApiError) -> Vec<Bytes> {
        let data = json!({"code": error.code, "message": error.message, "param": error.param});
        let mut failed = self.meta.response("failed", Vec::new(), None);
        failed["error"] = json!({"code": error.code.unwrap_or("server_error"), "message": error.message});
        vec![
            self.event("error", data),
            self.event("response.failed", json!({"response": failed})),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::response_store::Store;

    fn parse_json(v: Value) -> Result<Parsed, ApiError> {
        parse(v.to_string().as_bytes(), "m")
    }

    #[test]
    fn accepts_strings_items_and_tool_items() {
        let p = parse_json(json!({"model": "m", "input": "hi", "instructions": "be brief", "store": false,
            "text": {"format": {"type": "text"}}, "truncation": "disabled", "max_output_tokens": 7}))
        .unwrap();
        assert_eq!(p.conversation.turns, vec![Turn::User("hi".into())]);
        assert_eq!(
            (p.instructions.as_deref(), p.store, p.conversation.limits.max_tokens),
            (Some("be brief"), false, Some(7))
        );
        let p = parse_json(
            json!({"model": "m", "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "input": [{"role": "developer", "content": "sys"},
                      {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                      {"type": "message", "role": "assistant", "id": "m1", "status": "completed",
                       "content": [{"type": "output_text", "text": "yo", "annotations": []}]},
                      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"a\":1}"},
                      {"type": "function_call_output", "call_id": "c1", "output": "42"}]}),
        )
        .unwrap();
        assert_eq!(p.conversation.turns.len(), 4);
        assert!(
            matches!(&p.conversation.turns[2], Turn::Assistant { text, tool_calls } if text == "yo" && tool_calls[0].arguments["a"] == 1)
        );
        assert_eq!(p.conversation.tools[0].name, "f");
        let p = parse_json(json!({"model": "m", "input": "hi", "reasoning": {"effort": "low"}, "tool_choice": "required"})).unwrap();
        assert_eq!(p.conversation.template_kwargs["reasoning_effort"], "low");
        assert_eq!(p.conversation.tool_choice, Some(agent::ToolChoice::Required));
    }

    #[test]
    fn refuses_what_it_cannot_honour() {
        let with = |k: &str, v: Value| {
            let mut b = json!({"model": "m", "input": "hi"});
            b[k] = v;
            parse_json(b).unwrap_err()
        };
        assert_eq!(
            with("reasoning", json!({"effort": "max"})).param.as_deref(),
            Some("reasoning.effort")
        );
        assert_eq!(with("reasoning", json!({"mode": "x"})).param.as_deref(), Some("reasoning"));
        assert_eq!(with("tool_choice", json!("sometimes")).param.as_deref(), Some("tool_choice"));
        assert_eq!(
            with("text", json!({"format": {"type": "json_object"}})).param.as_deref(),
            Some("text")
        );
        assert_eq!(
            with("input", json!([{"role": "user", "content": [{"type": "input_image"}]}]))
                .param
                .as_deref(),
            Some("input[0].content[0]")
        );
        assert_eq!(with("tools", json!([{"type": "web_search"}])).param.as_deref(), Some("tools[0]"));
        assert_eq!(with("bogus", json!(1)).param.as_deref(), Some("bogus"));
        assert_eq!(with("model", json!("x")).status, 404);
        let bad_args = json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "not json"}]);
        assert_eq!(with("input", bad_args).param.as_deref(), Some("input[0].arguments"));
    }

    #[test]
    fn the_store_is_bounded_and_forgets_the_oldest_first() {
        let store = Store::default();
        for i in 0..STORE_RESPONSES + 2 {
            store.put(format!("r{i}"), vec![Turn::User("x".into())], json!({}));
        }
        assert!(store.get("r0").is_none() && store.get("r1").is_none());
        assert!(store.get(&format!("r{}", STORE_RESPONSES + 1)).is_some());
        store.put("big".into(), vec![Turn::User("x".repeat(STORE_BYTES - 10))], json!({}));
        assert!(store.get("big").is_some() && store.get("r2").is_none());
    }
}
