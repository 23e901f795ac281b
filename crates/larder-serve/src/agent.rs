//! What the agent-facing APIs share (Anthropic Messages, [`crate::messages`];
//! OpenAI Responses, [`crate::responses`]): the internal conversation each
//! parses its body into ([`Turn`]s, [`ToolSpec`]s, [`ToolCall`]s), the one
//! function mapping it onto the server's [`GenerationRequest`]
//! ([`to_request`], the seam where tool definitions and tool turns will be
//! rendered once the engine's tool calling lands), the one function turning
//! generated text into an answer's parts ([`split_output`], the seam where
//! the engine's tool-call parser plugs in), and the stream driver both
//! APIs' SSE replies run on ([`drive`]).
//!
//! Until the engine renders and parses tool calls, requests carrying tool
//! definitions or tool turns (`tool_use` / `tool_result` blocks,
//! `function_call` / `function_call_output` items) are parsed and checked in
//! full, then refused with a 400 saying tools are not wired yet, before
//! generation starts.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use larder_engine::tool_calls::{Delta, OutputParser, StreamParser};
use larder_engine::{ChatMessage, ToolSchema};
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, watch};

use crate::api::{ApiError, Endpoint, GenerationRequest, Prompt};
pub use crate::tools::ToolChoice;
use crate::tools::{ChatReader, Tools};
use crate::worker::{Event, EventSource};

/// A tool the client offers the model: Anthropic's `{name, description,
/// input_schema}` or a Responses function tool `{type: "function", name,
/// description, parameters}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: Option<String>,
    /// The JSON Schema of the tool's arguments (an object).
    pub parameters: Value,
}

/// A call of a tool by the model: Anthropic's `tool_use` block, a Responses
/// `function_call` item.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// `tool_use.id` / `function_call.call_id`: what the result refers to.
    pub id: String,
    pub name: String,
    /// The arguments, a JSON object.
    pub arguments: Value,
}

/// One turn of a conversation, in the order the model sees them.
#[derive(Debug, Clone, PartialEq)]
pub enum Turn {
    System(String),
    User(String),
    /// The model's earlier answer: its text and the tools it called.
    Assistant {
        text: String,
        tool_calls: Vec<ToolCall>,
    },
    /// A tool's answer to the call `call_id`.
    ToolResult {
        call_id: String,
        content: String,
        is_error: bool,
    },
}

impl Turn {
    /// Bytes of text this turn holds (the conversation store's bound).
    pub fn bytes(&self) -> usize {
        match self {
            Turn::System(t) | Turn::User(t) => t.len(),
            Turn::Assistant { text, tool_calls } => {
                text.len()
                    + tool_calls
                        .iter()
                        .map(|c| c.id.len() + c.name.len() + c.arguments.to_string().len())
                        .sum::<usize>()
            }
            Turn::ToolResult { call_id, content, .. } => call_id.len() + content.len(),
        }
    }
}

/// The sampling and limits of an agent request, in the server's terms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Limits {
    /// `None`: up to the context length.
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub stop: Vec<String>,
    pub stream: bool,
}

/// A parsed agent request: the conversation, the tools offered, the limits.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    pub turns: Vec<Turn>,
    pub tools: Vec<ToolSpec>,
    /// What the model may call (`None`: no calls, the tools are not shown).
    pub tool_choice: Option<ToolChoice>,
    /// More than one call may be returned.
    pub parallel_tool_calls: bool,
    /// Chat template variables the request's switches set (thinking,
    /// reasoning effort).
    pub template_kwargs: Map<String, Value>,
    /// A reasoning budget (Anthropic's `thinking.budget_tokens`).
    pub max_reasoning_tokens: Option<usize>,
    pub limits: Limits,
}

impl Conversation {
    /// A conversation of `turns` offering `tools` (`tool_choice` auto,
    /// parallel calls allowed, no template variables).
    pub fn new(turns: Vec<Turn>, tools: Vec<ToolSpec>, limits: Limits) -> Self {
        Conversation {
            turns,
            tools,
            tool_choice: Some(ToolChoice::Auto),
            parallel_tool_calls: true,
            template_kwargs: Map::new(),
            max_reasoning_tokens: None,
            limits,
        }
    }
}

/// The server's request for `conversation`, rendered with the model's chat
/// template by [`crate::prepare`]: tool calls and results become the
/// OpenAI-shaped messages templates read, the tools OpenAI function
/// declarations. `turns_param` names the request field an error points at
/// (`messages` or `input`).
pub fn to_request(conversation: &Conversation, tools_param: &str, turns_param: &str) -> Result<GenerationRequest, ApiError> {
    let mut messages = Vec::with_capacity(conversation.turns.len());
    for turn in &conversation.turns {
        messages.push(match turn {
            Turn::System(t) => ChatMessage::new("system", t),
            Turn::User(t) => ChatMessage::new("user", t),
            Turn::Assistant { text, tool_calls } if tool_calls.is_empty() => ChatMessage::new("assistant", text),
            Turn::Assistant { text, tool_calls } => {
                let calls = tool_calls
                    .iter()
                    .map(|c| larder_engine::ToolCall {
                        id: c.id.clone(),
                        kind: "function".into(),
                        function: larder_engine::FunctionCall {
                            name: c.name.clone(),
                            arguments: c.arguments.to_string(),
                        },
                    })
                    .collect();
                // An empty text is "", not absent (see crate::chat_messages).
                ChatMessage::assistant_tool_calls(Some(text), calls)
            }
            Turn::ToolResult { call_id, content, .. } => {
                let name = conversation.turns.iter().find_map(|t| match t {
                    Turn::Assistant { tool_calls, .. } => tool_calls.iter().find(|c| &c.id == call_id).map(|c| c.name.as_str()),
                    _ => None,
                });
                if name.is_none() {
                    return Err(ApiError::invalid(
                        turns_param,
                        format!("a tool result answers call {call_id:?}, which no earlier assistant turn makes"),
                    ));
                }
                ChatMessage::tool_result(call_id, name, content)
            }
        });
    }
    if !messages.iter().any(|m| m.role != "system") {
        return Err(ApiError::invalid(
            turns_param,
            format!("{turns_param} must hold at least one user or assistant turn"),
        ));
    }
    let tools = match (&conversation.tool_choice, conversation.tools.is_empty()) {
        (Some(choice), false) => Some(tools(conversation, choice.clone(), tools_param)?),
        (Some(ToolChoice::Required | ToolChoice::Function(_)), true) => {
            return Err(ApiError::invalid(
                "tool_choice",
                "tool_choice asks for a call, but no tools were given",
            ))
        }
        _ => None,
    };
    let l = &conversation.limits;
    Ok(GenerationRequest {
        endpoint: Endpoint::Chat,
        prompt: Prompt::Chat(messages),
        max_tokens: l.max_tokens,
        temperature: l.temperature,
        top_p: l.top_p,
        top_k: l.top_k,
        seed: None,
        stop: l.stop.clone(),
        stream: l.stream,
        include_usage: false,
        ignore_eos: false,
        logit_bias: Default::default(),
        frequency_penalty: 0.0,
        presence_penalty: 0.0,
        logprobs: None,
        response_format: None,
        n: 1,
        tools,
        template_kwargs: conversation.template_kwargs.clone(),
        max_reasoning_tokens: conversation.max_reasoning_tokens,
    })
}

/// The conversation's tools as a chat request's (OpenAI function
/// declarations); a named choice must name one of them.
fn tools(conversation: &Conversation, choice: ToolChoice, param: &str) -> Result<Tools, ApiError> {
    if let ToolChoice::Function(name) = &choice {
        if !conversation.tools.iter().any(|t| &t.name == name) {
            return Err(ApiError::invalid(
                "tool_choice",
                format!("tool_choice names the tool {name:?}, which is not among the tools"),
            ));
        }
    }
    let mut declarations = Vec::with_capacity(conversation.tools.len());
    let mut schemas: Vec<ToolSchema> = Vec::with_capacity(conversation.tools.len());
    for (i, t) in conversation.tools.iter().enumerate() {
        if schemas.iter().any(|s| s.name == t.name) {
            return Err(ApiError::invalid(
                &format!("{param}[{i}]"),
                format!("two tools are named {:?}", t.name),
            ));
        }
        crate::tools::check_schema_size(&t.parameters, &format!("{param}[{i}]"), "the tool's schema")?;
        let mut function = json!({"name": t.name});
        if let Some(d) = &t.description {
            function["description"] = json!(d);
        }
        function["parameters"] = t.parameters.clone();
        declarations.push(json!({"type": "function", "function": function}));
        schemas.push(ToolSchema {
            name: t.name.clone(),
            parameters: Some(t.parameters.clone()),
        });
    }
    Ok(Tools {
        declarations,
        strict: vec![false; schemas.len()],
        schemas,
        choice,
        parallel: conversation.parallel_tool_calls,
    })
}

/// What a finished generation answers: its reasoning, its text and the
/// tools it called.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Output {
    pub reasoning: String,
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
}

/// The answer in `text`, the generated text (stop strings removed), read
/// by the model's own parser when there is one (`reader`): reasoning,
/// content and the tools it called (each with a fresh id where the model's
/// format has none; only the first unless `parallel`). Without a reader,
/// all of it is text.
pub fn split_output(reader: Option<&ChatReader>, text: String, parallel: bool, ids: &AtomicU64) -> Output {
    let Some(reader) = reader else {
        return Output { text, ..Output::default() };
    };
    let parsed = reader.parse(&text);
    let mut tool_calls: Vec<ToolCall> = parsed
        .tool_calls
        .into_iter()
        .map(|c| ToolCall {
            id: c.id.unwrap_or_else(|| fresh_id("call_", ids.fetch_add(1, Ordering::Relaxed))),
            name: c.name,
            // The parser checked the arguments are JSON.
            arguments: serde_json::from_str(&c.arguments).unwrap_or(Value::Null),
        })
        .collect();
    if !parallel {
        tool_calls.truncate(1);
    }
    Output {
        reasoning: parsed.reasoning,
        text: parsed.content,
        tool_calls,
    }
}

/// How generation ended, in the server's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    /// `stop` (an EOS or a stop string) or `length`.
    pub reason: &'static str,
    /// The stop string that ended it, if one did.
    pub stop_sequence: Option<String>,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
}

/// Reads events to the end of generation: the whole text and how it ended.
pub async fn collect(
    prompt_tokens: usize,
    rx: &mut impl EventSource,
    abort: &mut watch::Receiver<bool>,
) -> Result<(String, Finish), ApiError> {
    let mut text = String::new();
    loop {
        match crate::exchange::next_event(rx, abort).await {
            Err(()) => return Err(crate::exchange::shutting_down()),
            Ok(None) => return Err(crate::exchange::engine_stopped()),
            // (These APIs ask for no logprobs: a scored token is its text.)
            Ok(Some(Event::Text(t) | Event::Scored { text: t, .. })) => text.push_str(&t),
            Ok(Some(Event::Started { .. })) => {}
            Ok(Some(Event::Failed(e))) => return Err(e),
            Ok(Some(Event::Done {
                finish_reason,
                completion_tokens,
                cached_tokens,
                stop_sequence,
            })) => {
                let finish = Finish {
                    reason: finish_reason,
                    stop_sequence,
                    prompt_tokens,
                    completion_tokens,
                    cached_tokens,
                };
                return Ok((text, finish));
            }
        }
    }
}

/// One API's server-sent events: what each step of generation sends.
pub trait StreamShape: Send + 'static {
    /// Sent first, once generation has started.
    fn started(&mut self) -> Vec<Bytes>;
    /// A new piece of the answer's text (never empty).
    fn text(&mut self, text: &str) -> Vec<Bytes>;
    /// A new piece of reasoning (never empty); dropped unless the API
    /// streams reasoning.
    fn reasoning(&mut self, _text: &str) -> Vec<Bytes> {
        Vec::new()
    }
    /// Generation ended; the last events. `output` is the whole answer
    /// (its text already streamed; its tool calls not yet).
    fn done(&mut self, finish: Finish, output: Output) -> Vec<Bytes>;
    /// Generation failed midway (or the shutdown grace period ended it).
    fn failed(&mut self, error: &ApiError) -> Vec<Bytes>;
}

/// One server-sent event: `event: NAME` and its JSON `data`.
pub fn sse(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// Reads a stream's text through the model's parser (when there is one):
/// content and reasoning as they become certain, the whole answer at the end.
struct Reading {
    stream: Option<StreamParser<ChatReader>>,
    reader: Option<ChatReader>,
    text: String,
    parallel: bool,
}

impl Reading {
    /// The shape's events for a piece of generated text.
    fn push(&mut self, shape: &mut impl StreamShape, piece: &str) -> Vec<Bytes> {
        self.text.push_str(piece);
        match &mut self.stream {
            None => shape.text(piece),
            Some(p) => {
                let deltas = p.push(piece);
                shape_deltas(shape, deltas)
            }
        }
    }

    /// The last events: the rest of the text, then `done` with the answer.
    fn finish(mut self, shape: &mut impl StreamShape, finish: Finish) -> Vec<Bytes> {
        let mut out = match self.stream.take() {
            Some(p) => shape_deltas(shape, p.finish().0),
            None => Vec::new(),
        };
        let output = split_output(self.reader.as_ref(), self.text, self.parallel, &AtomicU64::new(0));
        out.extend(shape.done(finish, output));
        out
    }
}

/// Content and reasoning deltas as the shape's events (calls come whole at the end).
fn shape_deltas(shape: &mut impl StreamShape, deltas: Vec<Delta>) -> Vec<Bytes> {
    let mut out = Vec::new();
    for d in deltas {
        match d {
            Delta::Content(t) if !t.is_empty() => out.extend(shape.text(&t)),
            Delta::Reasoning(t) if !t.is_empty() => out.extend(shape.reasoning(&t)),
            _ => {}
        }
    }
    out
}

/// Runs a stream: `shape`'s events for each engine event into `out`, until
/// generation ends, fails, the shutdown grace period ends it, or the client
/// leaves (dropping `rx`, which cancels the job). The text is read by the
/// request's parser (`rx`'s reader), only the first call kept unless
/// `parallel`.
pub async fn drive<S: StreamShape>(
    mut shape: S,
    prompt_tokens: usize,
    mut rx: crate::worker::Choices,
    parallel: bool,
    out: mpsc::UnboundedSender<Bytes>,
    mut abort: watch::Receiver<bool>,
) {
    let send = |chunks: Vec<Bytes>| chunks.into_iter().all(|c| out.send(c).is_ok());
    if !send(shape.started()) {
        return;
    }
    let reader = rx.reader.take();
    let mut reading = Reading {
        stream: reader.clone().map(StreamParser::new),
        reader,
        text: String::new(),
        parallel,
    };
    loop {
        let ev = tokio::select! {
            ev = rx.recv() => ev,
            _ = out.closed() => return,
            Ok(_) = abort.wait_for(|a| *a) => {
                let e = crate::exchange::shutting_down();
                e.log();
                send(shape.failed(&e));
                return;
            }
        };
        let ok = match ev {
            None => {
                let e = crate::exchange::engine_stopped();
                e.log();
                send(shape.failed(&e));
                return;
            }
            // Nothing to show for this token: an SSE comment keeps the
            // socket written to, so a vanished client is noticed.
            Some(Event::Text(t) | Event::Scored { text: t, .. }) if t.is_empty() => out.send(Bytes::from_static(b": \n\n")).is_ok(),
            Some(Event::Text(t) | Event::Scored { text: t, .. }) => {
                let events = reading.push(&mut shape, &t);
                // Text held back by the parser: keep the socket written to.
                match events.is_empty() {
                    true => out.send(Bytes::from_static(b": \n\n")).is_ok(),
                    false => send(events),
                }
            }
            Some(Event::Started { .. }) => true,
            Some(Event::Failed(e)) => {
                e.log();
                send(shape.failed(&e));
                return;
            }
            Some(Event::Done {
                finish_reason,
                completion_tokens,
                cached_tokens,
                stop_sequence,
            }) => {
                let finish = Finish {
                    reason: finish_reason,
                    stop_sequence,
                    prompt_tokens,
                    completion_tokens,
                    cached_tokens,
                };
                send(reading.finish(&mut shape, finish));
                return;
            }
        };
        if !ok {
            return;
        }
    }
}

/// A fresh id: `prefix`, then 24 hex digits unique to this process's run.
pub fn fresh_id(prefix: &str, counter: u64) -> String {
    use std::hash::BuildHasher;
    let salt = std::collections::hash_map::RandomState::new().hash_one(counter);
    format!("{prefix}{salt:016x}{counter:08x}")
}

/// The JSON type of `v`, for error messages.
pub fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Refuses a field of `obj` not in `known` (`param` names `obj`).
pub fn only_fields(obj: &Map<String, Value>, known: &[&str], param: &str) -> Result<(), ApiError> {
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) if param.is_empty() => Err(ApiError::invalid(k, format!("unsupported field `{k}`"))),
        Some(k) => Err(ApiError::invalid(
            &format!("{param}.{k}"),
            format!("unsupported field `{k}` in {param}"),
        )),
        None => Ok(()),
    }
}

/// A string field of `obj` (`None` when absent or null).
pub fn opt_str<'a>(obj: &'a Map<String, Value>, k: &str, param: &str) -> Result<Option<&'a str>, ApiError> {
    match obj.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(ApiError::invalid(
            &join(param, k),
            format!("{} must be a string, not {}", join(param, k), kind_of(v)),
        )),
    }
}

/// A required string field of `obj`.
pub fn req_str<'a>(obj: &'a Map<String, Value>, k: &str, param: &str) -> Result<&'a str, ApiError> {
    opt_str(obj, k, param)?.ok_or_else(|| ApiError::invalid(&join(param, k), format!("{} is required (a string)", join(param, k))))
}

/// `param.k`, or `k` at the top level.
pub fn join(param: &str, k: &str) -> String {
    if param.is_empty() {
        k.to_string()
    } else {
        format!("{param}.{k}")
    }
}

/// The body as a JSON object, or a 400 naming what is wrong with it.
pub fn body_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let text = std::str::from_utf8(body).map_err(|_| ApiError::invalid("body", "the request body is not valid UTF-8"))?;
    match serde_json::from_str(text) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::invalid("body", "the request body must be a JSON object")),
        Err(e) => Err(ApiError::invalid("body", format!("invalid JSON in the request body: {e}"))),
    }
}

/// Checks `model` against the served id: a 404 `model_not_found` otherwise.
pub fn check_model(obj: &Map<String, Value>, model_id: &str) -> Result<(), ApiError> {
    let model = req_str(obj, "model", "")?;
    if model == model_id {
        return Ok(());
    }
    Err(ApiError {
        status: 404,
        code: Some("model_not_found"),
        param: Some("model".into()),
        ..ApiError::plain(
            404,
            "invalid_request_error",
            None,
            format!("The model `{model}` does not exist; this server serves `{model_id}`"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(turns: Vec<Turn>, tools: Vec<ToolSpec>) -> Conversation {
        Conversation::new(turns, tools, Limits::default())
    }

    #[test]
    fn turns_and_tools_become_a_chat_request() {
        let r = to_request(
            &conv(vec![Turn::System("s".into()), Turn::User("hi".into())], vec![]),
            "tools",
            "messages",
        )
        .unwrap();
        assert_eq!(
            r.prompt,
            Prompt::Chat(vec![ChatMessage::new("system", "s"), ChatMessage::new("user", "hi")])
        );
        assert!(r.tools.is_none());
        let tool = ToolSpec {
            name: "f".into(),
            description: Some("does f".into()),
            parameters: json!({"type": "object"}),
        };
        let r = to_request(&conv(vec![Turn::User("hi".into())], vec![tool.clone()]), "tools", "messages").unwrap();
        let tools = r.tools.unwrap();
        assert_eq!(
            tools.declarations,
            vec![json!({"type": "function", "function": {"name": "f", "description": "does f", "parameters": {"type": "object"}}})]
        );
        let mut named = conv(vec![Turn::User("hi".into())], vec![tool]);
        named.tool_choice = Some(ToolChoice::Function("g".into()));
        assert_eq!(
            to_request(&named, "tools", "messages").unwrap_err().param.as_deref(),
            Some("tool_choice")
        );
        let result = Turn::ToolResult {
            call_id: "c".into(),
            content: "x".into(),
            is_error: false,
        };
        let e = to_request(&conv(vec![Turn::User("hi".into()), result], vec![]), "tools", "input").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input"));
        assert!(to_request(&conv(vec![Turn::System("s".into())], vec![]), "tools", "input").is_err());
    }

    #[test]
    fn output_is_read_by_the_models_parser() {
        let reader = ChatReader(std::sync::Arc::from(larder_engine::tool_calls::ToolFamily::Hermes.parser()));
        let text = "ok<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>".to_string();
        let out = split_output(Some(&reader), text.clone(), true, &AtomicU64::new(0));
        assert_eq!(out.text, "ok");
        assert_eq!(
            (out.tool_calls[0].name.as_str(), &out.tool_calls[0].arguments),
            ("f", &json!({"a": 1}))
        );
        assert!(out.tool_calls[0].id.starts_with("call_"));
        assert_eq!(split_output(None, text.clone(), true, &AtomicU64::new(0)).text, text);
    }
}
