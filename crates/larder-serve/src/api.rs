//! The OpenAI request surface: parsing and validating `/v1/chat/completions`
//! and `/v1/completions` bodies into a [`GenerationRequest`], and the
//! OpenAI-shaped error body (`{"error": {"message", "type", "param", "code"}}`).
//!
//! Everything is checked **before** generation starts: fields the server
//! cannot honour exactly (images, unknown fields) are refused, harmless
//! defaults clients send are accepted. Messages are parsed by
//! [`crate::chat_messages`], `tools` and `tool_choice` by [`crate::tools`]. `logit_bias`,
//! `frequency_penalty`, `presence_penalty` and `logprobs` (chat: with
//! `top_logprobs`) are checked as OpenAI checks them; `response_format`
//! (chat) is parsed here and compiled while the request is prepared.

use std::collections::BTreeMap;

use larder_engine::ChatMessage;
use serde_json::{json, Map, Value};

use crate::fields::{opt_flag, opt_number, positive};
use crate::tools::Tools;

pub use crate::error::ApiError;

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// The prompt of a request, before tokenization.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Chat(Vec<ChatMessage>),
    Text(String),
    Ids(Vec<u32>),
}

/// A validated request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    pub endpoint: Endpoint,
    pub prompt: Prompt,
    /// `None`: up to the context length.
    pub max_tokens: Option<usize>,
    /// `None`: the model's default (generation_config.json; OpenAI's 1.0 if none).
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    /// `None`: a fresh random seed per request.
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// Extension: do not stop at EOS tokens.
    pub ignore_eos: bool,
    /// Token id to a bias in [-100, 100] (`logit_bias`).
    pub logit_bias: BTreeMap<u32, f32>,
    /// In [-2, 2] (default 0).
    pub frequency_penalty: f32,
    /// In [-2, 2] (default 0).
    pub presence_penalty: f32,
    /// Report logprobs with this many alternatives per token (chat:
    /// `logprobs: true` and `top_logprobs`; completions: `logprobs: N`);
    /// `None`: no logprobs.
    pub logprobs: Option<usize>,
    /// Choices to generate, 1..=[`MAX_CHOICES`] (decoded as a batch).
    /// `response_format`: JSON output enforced by a grammar (`None`: text).
    pub response_format: Option<ResponseFormat>,
    pub n: usize,
    /// `tools` with `tool_choice` and `parallel_tool_calls` (`None`: no
    /// tools, or `tool_choice: "none"`).
    pub tools: Option<Tools>,
    /// Extra chat template variables: `chat_template_kwargs`, and
    /// `reasoning_effort` (as the template variable of that name).
    pub template_kwargs: Map<String, Value>,
    /// Most reasoning tokens before the close of the reasoning is forced
    /// (`max_reasoning_tokens`; `None`: no budget).
    pub max_reasoning_tokens: Option<usize>,
}

/// Most choices (`n`) one request may ask for.
pub const MAX_CHOICES: u64 = 16;

/// Most `top_logprobs` of a chat request (OpenAI's bound).
pub const MAX_CHAT_TOP_LOGPROBS: u64 = 20;
/// Most `logprobs` of a completions request (OpenAI's bound).
pub const MAX_COMPLETION_LOGPROBS: u64 = 5;

const COMMON: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "n",
    "stream",
    "stream_options",
    "user",
    "metadata",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "logprobs",
    "store",
    // Extension (as vLLM): keep generating past EOS tokens.
    "ignore_eos",
];
const CHAT_ONLY: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "top_logprobs",
    "chat_template_kwargs",
    "reasoning_effort",
    "max_reasoning_tokens",
];
const COMPLETION_ONLY: &[&str] = &["prompt", "echo", "best_of", "suffix"];

/// Parses and validates a request body for `endpoint`, served as `model_id`.
pub fn parse_request(endpoint: Endpoint, body: &[u8], model_id: &str) -> Result<GenerationRequest, ApiError> {
    let text = std::str::from_utf8(body).map_err(|_| ApiError::invalid("body", "the request body is not valid UTF-8"))?;
    let value: Value =
        serde_json::from_str(text).map_err(|e| ApiError::invalid("body", format!("invalid JSON in the request body: {e}")))?;
    let obj = value
        .as_object()
        .ok_or_else(|| ApiError::invalid("body", "the request body must be a JSON object"))?;
    let own = if endpoint == Endpoint::Chat { CHAT_ONLY } else { COMPLETION_ONLY };
    if let Some(k) = obj.keys().find(|k| !COMMON.contains(&k.as_str()) && !own.contains(&k.as_str())) {
        return Err(ApiError::invalid(k, format!("Unrecognized request argument supplied: {k}")));
    }
    let model = obj
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid("model", "you must provide a model parameter (a string)"))?;
    if model != model_id {
        return Err(ApiError {
            status: 404,
            message: format!("The model `{model}` does not exist; this server serves `{model_id}`"),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
            detail: None,
            retry_after_s: None,
        });
    }
    refuse_unsupported(obj)?;
    let prompt = match endpoint {
        Endpoint::Chat => Prompt::Chat(crate::chat_messages::parse_messages(obj.get("messages"))?),
        Endpoint::Completion => completion_prompt(obj.get("prompt"))?,
    };
    let max_tokens = match (obj.get("max_completion_tokens"), obj.get("max_tokens")) {
        (Some(v), _) if !v.is_null() => Some(positive(v, "max_completion_tokens")?),
        (_, Some(v)) if !v.is_null() => Some(positive(v, "max_tokens")?),
        _ => None,
    };
    let temperature = opt_number(obj, "temperature", 0.0, 2.0)?;
    let top_p = crate::fields::top_p(obj)?;
    let top_k = crate::fields::top_k(obj)?;
    let seed = match obj.get("seed") {
        None | Some(Value::Null) => None,
        Some(v) => match (v.as_u64(), v.as_i64()) {
            (Some(s), _) => Some(s),
            (None, Some(s)) => Some(s as u64),
            _ => return Err(ApiError::invalid("seed", "seed must be an integer")),
        },
    };
    let stop = match obj.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| s.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::invalid("stop", "stop must be a string or a list of strings"))?,
        Some(_) => return Err(ApiError::invalid("stop", "stop must be a string or a list of strings")),
    };
    if stop.len() > 4 || stop.iter().any(|s| s.is_empty()) {
        return Err(ApiError::invalid("stop", "stop takes up to 4 non-empty strings"));
    }
    let stream = opt_flag(obj, "stream")?;
    let ignore_eos = opt_flag(obj, "ignore_eos")?;
    let include_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => {
            if let Some(k) = o.keys().find(|k| k.as_str() != "include_usage") {
                return Err(ApiError::invalid("stream_options", format!("unsupported stream option {k}")));
            }
            match o.get("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(ApiError::invalid("stream_options", "include_usage must be a boolean")),
            }
        }
        Some(_) => return Err(ApiError::invalid("stream_options", "stream_options must be an object")),
    };
    let logit_bias = logit_bias(obj.get("logit_bias"))?;
    let frequency_penalty = opt_number(obj, "frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0);
    let presence_penalty = opt_number(obj, "presence_penalty", -2.0, 2.0)?.unwrap_or(0.0);
    let logprobs = match endpoint {
        Endpoint::Chat => chat_logprobs(obj)?,
        Endpoint::Completion => match obj.get("logprobs") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_u64().filter(|&n| n <= MAX_COMPLETION_LOGPROBS).ok_or_else(|| {
                ApiError::invalid(
                    "logprobs",
                    format!("logprobs must be an integer between 0 and {MAX_COMPLETION_LOGPROBS}"),
                )
            })? as usize),
        },
    };
    let response_format = response_format(obj.get("response_format"))?;
    let n = match obj.get("n") {
        None | Some(Value::Null) => 1,
        Some(v) => {
            v.as_u64()
                .filter(|n| (1..=MAX_CHOICES).contains(n))
                .ok_or_else(|| ApiError::invalid("n", format!("n must be an integer between 1 and {MAX_CHOICES}")))? as usize
        }
    };
    let tools = match endpoint {
        Endpoint::Chat => crate::tools::parse_tools(obj)?,
        Endpoint::Completion => None,
    };
    let template_kwargs = template_kwargs(obj)?;
    let max_reasoning_tokens = match obj.get("max_reasoning_tokens") {
        None | Some(Value::Null) => None,
        Some(v) => Some(positive(v, "max_reasoning_tokens")?),
    };
    if include_usage && !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "stream_options is only allowed with stream: true",
        ));
    }
    Ok(GenerationRequest {
        endpoint,
        prompt,
        max_tokens,
        temperature,
        top_p,
        top_k,
        seed,
        stop,
        stream,
        include_usage,
        ignore_eos,
        logit_bias,
        frequency_penalty,
        presence_penalty,
        response_format,
        logprobs,
        n,
        tools,
        template_kwargs,
        max_reasoning_tokens,
    })
}

/// `chat_template_kwargs` (an object of template variables, e.g.
/// `enable_thinking`) and `reasoning_effort` (`low`, `medium` or `high`,
/// the template variable of that name unless the kwargs set it).
fn template_kwargs(obj: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let mut kwargs = match obj.get("chat_template_kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(_) => return Err(ApiError::invalid("chat_template_kwargs", "chat_template_kwargs must be an object")),
    };
    match obj.get("reasoning_effort") {
        None | Some(Value::Null) => {}
        Some(Value::String(e)) if ["minimal", "low", "medium", "high"].contains(&e.as_str()) => {
            kwargs.entry("reasoning_effort").or_insert_with(|| Value::String(e.clone()));
        }
        Some(v) => {
            return Err(ApiError::invalid(
                "reasoning_effort",
                format!("reasoning_effort must be minimal, low, medium or high, not {v}"),
            ))
        }
    }
    Ok(kwargs)
}

/// `logit_bias`: an object from token ids (decimal strings) to numbers in [-100, 100].
fn logit_bias(v: Option<&Value>) -> Result<BTreeMap<u32, f32>, ApiError> {
    let invalid = |m: String| ApiError::invalid("logit_bias", m);
    let map = match v {
        None | Some(Value::Null) => return Ok(BTreeMap::new()),
        Some(Value::Object(map)) => map,
        Some(_) => return Err(invalid("logit_bias must be an object from token ids to biases".into())),
    };
    map.iter()
        .map(|(k, b)| {
            let id = k
                .parse::<u32>()
                .map_err(|_| invalid(format!("logit_bias key {k:?} is not a token id")))?;
            let bias = b
                .as_f64()
                .filter(|b| (-100.0..=100.0).contains(b))
                .ok_or_else(|| invalid(format!("logit_bias of token {k} must be a number between -100 and 100")))?;
            Ok((id, bias as f32))
        })
        .collect()
}

/// A chat request's `logprobs` (a boolean) and `top_logprobs` (0..=20, only with `logprobs: true`).
fn chat_logprobs(obj: &Map<String, Value>) -> Result<Option<usize>, ApiError> {
    let on = opt_flag(obj, "logprobs")?;
    let top = match obj.get("top_logprobs") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().filter(|&n| n <= MAX_CHAT_TOP_LOGPROBS).ok_or_else(|| {
            ApiError::invalid(
                "top_logprobs",
                format!("top_logprobs must be an integer between 0 and {MAX_CHAT_TOP_LOGPROBS}"),
            )
        })? as usize),
    };
    match (on, top) {
        // A zero some clients send by default asks for nothing.
        (false, Some(0)) | (false, None) => Ok(None),
        (false, Some(_)) => Err(ApiError::invalid(
            "top_logprobs",
            "logprobs must be set to true if top_logprobs is used",
        )),
        (true, top) => Ok(Some(top.unwrap_or(0))),
    }
}

/// `response_format` (chat): what the output must be, enforced by masking
/// what may be sampled (larder-engine's grammar engine; docs/server.md).
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseFormat {
    /// `{"type": "json_object"}`: any JSON object.
    JsonObject,
    /// `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`.
    JsonSchema { schema: Value, strict: bool },
}

/// Parses `response_format`; `text` (or none) is `None`.
fn response_format(v: Option<&Value>) -> Result<Option<ResponseFormat>, ApiError> {
    let bad = |m: String| ApiError::invalid("response_format", m);
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let obj = v.as_object().ok_or_else(|| bad("response_format must be an object".into()))?;
    match obj.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(ResponseFormat::JsonObject)),
        Some("json_schema") => {
            let js = obj
                .get("json_schema")
                .and_then(Value::as_object)
                .ok_or_else(|| bad("response_format.json_schema must be an object holding the `schema`".into()))?;
            if let Some(k) = js
                .keys()
                .find(|k| !["name", "schema", "strict", "description"].contains(&k.as_str()))
            {
                return Err(bad(format!("unsupported response_format.json_schema field `{k}`")));
            }
            let strict = match js.get("strict") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(bad("response_format.json_schema.strict must be a boolean".into())),
            };
            // OpenAI's `schema` is optional: without one, any JSON value.
            let schema = js.get("schema").cloned().unwrap_or_else(|| json!({}));
            Ok(Some(ResponseFormat::JsonSchema { schema, strict }))
        }
        _ => Err(bad("response_format.type must be text, json_object or json_schema".into())),
    }
}

/// Refuses every field whose value the server cannot honour exactly.
fn refuse_unsupported(obj: &Map<String, Value>) -> Result<(), ApiError> {
    let is = |k: &str, ok: &dyn Fn(&Value) -> bool| -> Result<(), ApiError> {
        match obj.get(k) {
            Some(v) if !v.is_null() && !ok(v) => Err(ApiError::invalid(k, format!("`{k}` = {v} is not supported by this server"))),
            _ => Ok(()),
        }
    };
    is("echo", &|v| v == &Value::Bool(false))?;
    is("best_of", &|v| v.as_u64() == Some(1))?;
    is("suffix", &|v| v.as_str() == Some(""))?;
    is("user", &|v| v.is_string())?;
    is("metadata", &|v| v.is_object())?;
    is("store", &|v| v == &Value::Bool(false))?;
    Ok(())
}

fn completion_prompt(v: Option<&Value>) -> Result<Prompt, ApiError> {
    match v {
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => Ok(Prompt::Text(a[0].as_str().unwrap_or_default().to_string())),
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_number) => a
            .iter()
            .map(|x| x.as_u64().filter(|&id| id <= u32::MAX as u64).map(|id| id as u32))
            .collect::<Option<Vec<_>>>()
            .map(Prompt::Ids)
            .ok_or_else(|| ApiError::invalid("prompt", "token ids must be non-negative integers")),
        _ => Err(ApiError::invalid(
            "prompt",
            "prompt must be a string, a list of one string, or a list of token ids",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Result<GenerationRequest, ApiError> {
        parse_request(Endpoint::Chat, body.to_string().as_bytes(), "m")
    }

    #[test]
    fn accepts_what_clients_send() {
        let r = chat(json!({"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_tokens": 5, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}, "stop": "x",
            "frequency_penalty": 0, "presence_penalty": 0, "response_format": {"type": "text"}, "tools": [], "n": 1, "user": "u", "metadata": {}}))
        .unwrap();
        assert_eq!(
            r.prompt,
            Prompt::Chat(vec![ChatMessage::new("system", "s"), ChatMessage::new("user", "hi")])
        );
        assert_eq!(
            (r.max_tokens, r.temperature, r.stream, r.include_usage),
            (Some(5), Some(0.0), true, true)
        );
        assert_eq!(r.stop, vec!["x".to_string()]);
        let c = parse_request(Endpoint::Completion, br#"{"model":"m","prompt":[1,2,3]}"#, "m").unwrap();
        assert_eq!(c.prompt, Prompt::Ids(vec![1, 2, 3]));
        assert_eq!(c.logprobs, None);
        let c = parse_request(Endpoint::Completion, br#"{"model":"m","prompt":"x","logprobs":6}"#, "m").unwrap_err();
        assert_eq!(c.param.as_deref(), Some("logprobs"));
        let s = chat(
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 20,
            "logit_bias": {"7": -100, "12": 2.5}, "frequency_penalty": -2, "presence_penalty": 1.5}),
        )
        .unwrap();
        assert_eq!(s.logprobs, Some(20));
        assert_eq!(s.logit_bias, BTreeMap::from([(7, -100.0), (12, 2.5)]));
        assert_eq!((s.frequency_penalty, s.presence_penalty), (-2.0, 1.5));
    }

    #[test]
    fn refuses_what_it_cannot_honour() {
        let base = || json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let with = |k: &str, v: Value| {
            let mut b = base();
            b[k] = v;
            chat(b).unwrap_err()
        };
        assert_eq!(with("n", json!(17)).param.as_deref(), Some("n"));
        assert_eq!(with("n", json!(0)).param.as_deref(), Some("n"));
        assert_eq!(with("logit_bias", json!({"x": 5})).param.as_deref(), Some("logit_bias"));
        assert_eq!(with("logit_bias", json!({"1": 101})).param.as_deref(), Some("logit_bias"));
        assert_eq!(with("logit_bias", json!([1])).param.as_deref(), Some("logit_bias"));
        assert_eq!(
            with("tools", json!([{"type": "function"}])).param.as_deref(),
            Some("tools[0].function")
        );
        assert_eq!(with("tool_choice", json!("required")).param.as_deref(), Some("tool_choice"));
        assert_eq!(with("reasoning_effort", json!("max")).param.as_deref(), Some("reasoning_effort"));
        assert_eq!(with("frequency_penalty", json!(2.5)).param.as_deref(), Some("frequency_penalty"));
        assert_eq!(with("presence_penalty", json!(-3)).param.as_deref(), Some("presence_penalty"));
        assert_eq!(
            with("top_logprobs", json!(3)).message,
            "logprobs must be set to true if top_logprobs is used"
        );
        assert_eq!(with("logprobs", json!(2)).param.as_deref(), Some("logprobs"));
        assert_eq!(with("max_tokens", json!(-1)).param.as_deref(), Some("max_tokens"));
        assert_eq!(with("max_tokens", json!(1e30)).param.as_deref(), Some("max_tokens"));
        assert_eq!(with("temperature", json!("hot")).param.as_deref(), Some("temperature"));
        assert_eq!(with("bogus", json!(1)).message, "Unrecognized request argument supplied: bogus");
        assert_eq!(with("model", json!("other")).status, 404);
        let img = json!([{"type": "image_url", "image_url": {"url": "x"}}]);
        assert!(chat(json!({"model": "m", "messages": [{"role": "user", "content": img}]})).is_err());
        assert!(parse_request(Endpoint::Chat, b"{not json", "m")
            .unwrap_err()
            .message
            .contains("invalid JSON"));
        assert!(parse_request(Endpoint::Chat, &[0xff, 0xfe], "m")
            .unwrap_err()
            .message
            .contains("UTF-8"));
    }
}
