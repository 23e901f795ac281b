//! HTTP: routing (HEAD and OPTIONS on every route), limits (413 before a
//! body is read), auth (`Authorization: Bearer KEY`, the scheme matched
//! case-insensitively as RFC 7235 says), the "loading" state, and the
//! OpenAI response shapes (JSON and server-sent events) over hyper 1 on
//! tokio. A generation request is prepared (template, tokenization, prompt
//! checks) in its handler, off the engine thread ([`crate::prepare`]).
//!
//! Every stream ends with `data: [DONE]`: after the final chunk, or after
//! an error event when generation fails midway (an expert read fails, the
//! engine thread stops) or the shutdown grace period ends.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

use crate::api::{parse_request, ApiError, Endpoint, GenerationRequest};
pub use crate::exchange::ReplyBody;
use crate::exchange::{
    admit, body_error, engine_stopped, error_reply, json_reply, next_choice_event, now, read_body, shutting_down, sse_reply,
};
pub use crate::state::{ConnectionGuard, State};
use crate::tools::{ChatReader, ChatStream};
use crate::worker::{Event, EventSource, Logprob, Worker};
use crate::ServerConfig;

const GET_ROUTE: &str = "GET, HEAD, OPTIONS";
const POST_ROUTE: &str = "POST, OPTIONS";

/// The methods a path answers (its `Allow` header), or None: no such route.
fn route_methods(path: &str) -> Option<&'static str> {
    match path {
        "/health" | "/metrics" | "/v1/models" => Some(GET_ROUTE),
        "/v1/chat/completions" | "/v1/completions" | "/v1/messages" | "/v1/messages/count_tokens" | "/v1/responses" => Some(POST_ROUTE),
        p if p.strip_prefix("/v1/models/").is_some_and(|id| !id.is_empty()) => Some(GET_ROUTE),
        p if p
            .strip_prefix("/v1/responses/")
            .is_some_and(|id| !id.is_empty() && !id.contains('/')) =>
        {
            Some(GET_ROUTE)
        }
        _ => None,
    }
}

/// Answers one request (CORS headers added when configured).
pub async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Response<ReplyBody>, Infallible> {
    let request_headers = req.headers().clone();
    let methods = route_methods(req.uri().path());
    let mut reply = route(&state, methods, req).await;
    crate::cors::decorate(&state.config.cors_origins, &request_headers, methods, reply.headers_mut());
    Ok(reply)
}

fn with_allow(mut r: Response<ReplyBody>, methods: &'static str) -> Response<ReplyBody> {
    r.headers_mut().insert("allow", HeaderValue::from_static(methods));
    r
}

async fn route(state: &Arc<State>, methods: Option<&'static str>, req: Request<Incoming>) -> Response<ReplyBody> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    // Anthropic's clients read Anthropic-shaped errors.
    let error_reply = |e: &ApiError| {
        if path.starts_with("/v1/messages") {
            crate::messages::error_reply(e)
        } else {
            error_reply(e)
        }
    };
    let Some(methods) = methods else {
        return error_reply(&ApiError::plain(404, "invalid_request_error", None, format!("no route for {path}")));
    };
    if method == Method::OPTIONS {
        let r = Response::builder().status(204).body(ReplyBody::Full(Full::new(Bytes::new())));
        return with_allow(
            r.unwrap_or_else(|_| Response::new(ReplyBody::Full(Full::new(Bytes::new())))),
            methods,
        );
    }
    if !methods.split(", ").any(|m| m == method.as_str()) {
        let e = ApiError::plain(
            405,
            "invalid_request_error",
            None,
            format!("method {method} not allowed on {path} (allowed: {methods})"),
        );
        return with_allow(error_reply(&e), methods);
    }
    if path.starts_with("/v1/") && !authorized(&state.config, &req) {
        return error_reply(&ApiError::plain(
            401,
            "invalid_request_error",
            Some("invalid_api_key"),
            "missing or wrong API key: send `Authorization: Bearer <key>`",
        ));
    }
    let worker = state.worker.get();
    match (path.as_str(), worker) {
        ("/health", Some(_)) => json_reply(200, &json!({"status": "ok"})),
        ("/health", None) => json_reply(503, &json!({"status": "loading"})),
        ("/metrics", _) => metrics(worker),
        (_, None) => error_reply(&ApiError::plain(
            503,
            "server_error",
            Some("model_loading"),
            "the model is still loading; retry when GET /health answers 200",
        )),
        ("/v1/models", Some(_)) => json_reply(200, &json!({"object": "list", "data": [model_card(state)]})),
        ("/v1/chat/completions", Some(w)) => generate(state, w, Endpoint::Chat, req).await,
        ("/v1/completions", Some(w)) => generate(state, w, Endpoint::Completion, req).await,
        ("/v1/messages", Some(w)) => crate::messages::create(state, w, req).await,
        ("/v1/messages/count_tokens", Some(w)) => crate::messages::count_tokens(state, w, req).await,
        ("/v1/responses", Some(w)) => crate::responses::create(state, w, req).await,
        (p, Some(_)) if p.starts_with("/v1/responses/") => {
            crate::responses::get(state, p.strip_prefix("/v1/responses/").unwrap_or_default())
        }
        (p, Some(_)) => model_by_id(state, p.strip_prefix("/v1/models/").unwrap_or_default()),
    }
}

fn model_card(state: &State) -> Value {
    json!({"id": state.config.served_name, "object": "model", "created": now(), "owned_by": "larder"})
}

/// `GET /v1/models/{id}`: the model, or an OpenAI-shaped 404.
fn model_by_id(state: &State, raw_id: &str) -> Response<ReplyBody> {
    let id = percent_decode(raw_id);
    if id == state.config.served_name {
        return json_reply(200, &model_card(state));
    }
    error_reply(&ApiError {
        status: 404,
        message: format!("The model `{id}` does not exist; this server serves `{}`", state.config.served_name),
        kind: "invalid_request_error",
        param: Some("model".into()),
        code: Some("model_not_found"),
        detail: None,
        retry_after_s: None,
    })
}

/// Decodes `%XX` escapes (a model id like `org/name` arrives as `org%2Fname`
/// or unescaped); invalid escapes stay as they are.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (b[i], b.get(i + 1).copied().and_then(hex), b.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether the request carries the API key: `Authorization: Bearer KEY`,
/// or `x-api-key: KEY` (how Anthropic's clients send it).
fn authorized(config: &ServerConfig, req: &Request<Incoming>) -> bool {
    let Some(key) = &config.api_key else { return true };
    let bearer = req.headers().get("authorization").and_then(|v| bearer_token(v.as_bytes()));
    let x_api_key = req.headers().get("x-api-key").map(|v| v.as_bytes().trim_ascii());
    bearer.or(x_api_key).is_some_and(|got| constant_time_eq(got, key.as_bytes()))
}

/// The credentials of an `Authorization: Bearer <token>` header value: the
/// scheme in any case (`bearer`, `BEARER`; RFC 7235), then one or more
/// spaces or tabs, then the token (trailing whitespace ignored). `None` for
/// another scheme or an empty token.
pub fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer";
    let (scheme, rest) = value.split_at_checked(SCHEME.len())?;
    if !scheme.eq_ignore_ascii_case(SCHEME) || !rest.first().is_some_and(|b| *b == b' ' || *b == b'\t') {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// Whether `a == b`, in a time that depends on their lengths only (a key
/// compared byte by byte and stopping at the first difference tells a
/// timing attacker how much of it they guessed).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

async fn generate(state: &Arc<State>, worker: &Worker, endpoint: Endpoint, req: Request<Incoming>) -> Response<ReplyBody> {
    let body = match read_body(&state.config, req).await {
        Ok(b) => b,
        Err(e) => return body_error(&e),
    };
    let request = match parse_request(endpoint, &body, &state.config.served_name) {
        Ok(r) => r,
        Err(e) => return error_reply(&e),
    };
    let (prompt_tokens, mut rx) = match admit(&state.abort, worker, &request).await {
        Ok(started) => started,
        Err(e) => return error_reply(&e),
    };
    let mut abort = state.abort.clone();
    let id = format!(
        "{}-{}",
        if endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" },
        state.ids.fetch_add(1, Ordering::Relaxed)
    );
    let model = state.config.served_name.clone();
    let reader = rx.reader.take();
    if request.stream {
        let (out, body) = mpsc::unbounded_channel::<Bytes>();
        tokio::spawn(stream_events(request, id, model, prompt_tokens, rx, reader, out, abort));
        return sse_reply(body);
    }
    let parallel = request.tools.as_ref().is_none_or(|t| t.parallel);
    let mut new_id = || crate::agent::fresh_id("call_", state.ids.fetch_add(1, Ordering::Relaxed));
    let n = request.n;
    let mut texts = vec![String::new(); n];
    let mut scored: Vec<Vec<Logprob>> = vec![Vec::new(); n];
    let mut choices: Vec<Value> = vec![Value::Null; n];
    let (mut done, mut completion, mut cached) = (0, 0, 0);
    loop {
        let ev = match next_choice_event(&mut rx, &mut abort).await {
            Ok(ev) => ev,
            Err(()) => return error_reply(&shutting_down()),
        };
        match ev {
            Some((i, Event::Text(t))) => texts[i].push_str(&t),
            Some((i, Event::Scored { text: t, logprob })) => {
                texts[i].push_str(&t);
                scored[i].push(logprob);
            }
            Some((
                i,
                Event::Done {
                    finish_reason,
                    completion_tokens,
                    cached_tokens,
                    ..
                },
            )) => {
                completion += completion_tokens;
                cached = cached.max(cached_tokens);
                let logprobs = match (request.logprobs, endpoint) {
                    (None, _) => Value::Null,
                    (Some(_), Endpoint::Chat) => crate::logprobs::chat(&scored[i]),
                    (Some(_), Endpoint::Completion) => crate::logprobs::completion(&scored[i], 0),
                };
                let text = std::mem::take(&mut texts[i]);
                choices[i] = match endpoint {
                    Endpoint::Chat => {
                        let (message, finish_reason) = match &reader {
                            Some(r) => crate::tools::whole_message(r, &text, finish_reason, parallel, &mut new_id),
                            None => (json!({"role": "assistant", "content": text}), finish_reason),
                        };
                        json!({"index": i, "message": message, "logprobs": logprobs, "finish_reason": finish_reason})
                    }
                    Endpoint::Completion => json!({"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}),
                };
                done += 1;
                if done < n {
                    continue;
                }
                let object = if endpoint == Endpoint::Chat {
                    "chat.completion"
                } else {
                    "text_completion"
                };
                let usage = usage(prompt_tokens, completion, cached);
                return json_reply(
                    200,
                    &json!({"id": id, "object": object, "created": now(), "model": model, "choices": choices, "usage": usage}),
                );
            }
            Some((_, Event::Failed(e))) => return error_reply(&e),
            Some((_, Event::Started { .. })) => {}
            None => return error_reply(&engine_stopped()),
        }
    }
}

fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": cached}})
}

/// Turns engine events into SSE chunks; stops (dropping `rx`, which cancels
/// generation) when the client goes away. However generation ends (done,
/// failed, the engine thread gone, the shutdown grace period over), the
/// last chunk is `data: [DONE]`, after an error event when it did not
/// finish. A chat's text is read by its `reader` (reasoning, content and
/// tool calls as deltas; text it holds back is sent once certain).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn stream_events(
    request: GenerationRequest,
    id: String,
    model: String,
    prompt_tokens: usize,
    mut rx: impl EventSource,
    reader: Option<ChatReader>,
    out: mpsc::UnboundedSender<Bytes>,
    mut abort: watch::Receiver<bool>,
) {
    let chat = request.endpoint == Endpoint::Chat;
    let created = now();
    let object = if chat { "chat.completion.chunk" } else { "text_completion" };
    let chunk = |choice: Value| json!({"id": id, "object": object, "created": created, "model": model, "choices": [choice]});
    let send = |v: &Value| out.send(Bytes::from(format!("data: {v}\n\n"))).is_ok();
    let n = request.n.max(1);
    for i in 0..n {
        let role = json!({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null});
        if chat && !send(&chunk(role)) {
            return;
        }
    }
    // Completions' `text_offset` per choice: characters of the tokens streamed so far.
    let mut offsets = vec![0; n];
    let parallel = request.tools.as_ref().is_none_or(|t| t.parallel);
    let mut readers: Vec<Option<ChatStream>> = (0..n).map(|_| reader.clone().map(|r| ChatStream::new(r, parallel))).collect();
    let mut call_ids = 0u64;
    let mut new_id = || {
        call_ids += 1;
        crate::agent::fresh_id("call_", call_ids)
    };

    let (mut done, mut completion, mut cached) = (0, 0, 0);
    loop {
        let ev = tokio::select! {
            ev = rx.recv_choice() => ev,
            // The client went away: dropping `rx` cancels the job.
            _ = out.closed() => return,
            // The shutdown grace period is over: end the stream cleanly.
            Ok(_) = abort.wait_for(|a| *a) => return end_with_error(&out, &shutting_down()),
        };
        let Some((i, ev)) = ev else {
            return end_with_error(&out, &engine_stopped());
        };
        let ok = match ev {
            // A token with its logprob: a chunk even when it shows no text yet.
            Event::Scored { text: t, logprob } => {
                let tokens = std::slice::from_ref(&logprob);
                let choice = if chat {
                    let mut delta = json!({"content": ""});
                    for d in deltas(&mut readers[i], &t, &mut new_id) {
                        merge(&mut delta, d);
                    }
                    json!({"index": i, "delta": delta, "logprobs": crate::logprobs::chat(tokens), "finish_reason": null})
                } else {
                    json!({"index": i, "text": t, "logprobs": crate::logprobs::completion(tokens, offsets[i]), "finish_reason": null})
                };
                offsets[i] += logprob.token.chars().count();
                send(&chunk(choice))
            }
            // Nothing to show for this token: an SSE comment keeps the
            // socket written to, so a vanished client is noticed.
            Event::Text(t) if chat => {
                let pieces = deltas(&mut readers[i], &t, &mut new_id);
                if pieces.is_empty() {
                    out.send(Bytes::from_static(b": \n\n")).is_ok()
                } else {
                    pieces
                        .into_iter()
                        .all(|d| send(&chunk(json!({"index": i, "delta": d, "logprobs": null, "finish_reason": null}))))
                }
            }
            Event::Text(t) if t.is_empty() => out.send(Bytes::from_static(b": \n\n")).is_ok(),
            Event::Text(t) => send(&chunk(json!({"index": i, "text": t, "logprobs": null, "finish_reason": null}))),
            Event::Done {
                finish_reason,
                completion_tokens,
                cached_tokens,
                ..
            } => {
                let mut finish_reason = finish_reason;
                if let Some(r) = readers[i].take() {
                    let (rest, reason) = r.finish(finish_reason, &mut new_id);
                    finish_reason = reason;
                    for d in rest {
                        if !send(&chunk(json!({"index": i, "delta": d, "logprobs": null, "finish_reason": null}))) {
                            return;
                        }
                    }
                }
                let last = if chat {
                    json!({"index": i, "delta": {}, "logprobs": null, "finish_reason": finish_reason})
                } else {
                    json!({"index": i, "text": "", "logprobs": null, "finish_reason": finish_reason})
                };
                completion += completion_tokens;
                cached = cached.max(cached_tokens);
                done += 1;
                if !send(&chunk(last)) {
                    return;
                }
                if done < n {
                    continue;
                }
                if request.include_usage {
                    send(
                        &json!({"id": id, "object": object, "created": created, "model": model, "choices": [],
                                 "usage": usage(prompt_tokens, completion, cached)}),
                    );
                }
                let _ = out.send(Bytes::from_static(b"data: [DONE]\n\n"));
                return;
            }
            Event::Failed(e) => return end_with_error(&out, &e),
            Event::Started { .. } => true,
        };
        if !ok {
            return; // client disconnected: dropping `rx` cancels the job
        }
    }
}

/// A chat choice's deltas for a piece of text: read by its reader, or the
/// text as content.
fn deltas(reader: &mut Option<ChatStream>, t: &str, new_id: &mut dyn FnMut() -> String) -> Vec<Value> {
    match reader {
        Some(r) => r.push(t, new_id),
        None if t.is_empty() => Vec::new(),
        None => vec![json!({"content": t})],
    }
}

/// Adds a delta's fields to `into` (text fields joined, lists of calls
/// concatenated).
fn merge(into: &mut Value, delta: Value) {
    let Value::Object(fields) = delta else { return };
    for (k, v) in fields {
        match (into.get_mut(&k), v) {
            (Some(Value::String(have)), Value::String(more)) => have.push_str(&more),
            (Some(Value::Array(have)), Value::Array(more)) => have.extend(more),
            (_, v) => into[&k] = v,
        }
    }
}

#[cfg(test)]
mod merge_tests {
    use super::merge;
    use serde_json::json;

    #[test]
    fn deltas_of_one_token_merge_into_one() {
        let mut d = json!({"content": ""});
        merge(&mut d, json!({"content": "a"}));
        merge(&mut d, json!({"tool_calls": [{"index": 0}]}));
        merge(&mut d, json!({"tool_calls": [{"index": 1}]}));
        merge(&mut d, json!({"reasoning_content": "r"}));
        assert_eq!(
            d,
            json!({"content": "a", "tool_calls": [{"index": 0}, {"index": 1}], "reasoning_content": "r"})
        );
    }
}

/// Ends a stream that did not finish: the error (logged when a 5xx) as an
/// event, then `[DONE]`, so clients see a clean end of stream.
fn end_with_error(out: &mpsc::UnboundedSender<Bytes>, e: &ApiError) {
    e.log();
    let _ = out.send(Bytes::from(format!("data: {}\n\n", e.body())));
    let _ = out.send(Bytes::from_static(b"data: [DONE]\n\n"));
}

/// The engine thread dropped a request without ending it (it stopped).
fn metrics(worker: Option<&Worker>) -> Response<ReplyBody> {
    let Some(worker) = worker else {
        let text = "# TYPE larder_model_loaded gauge\nlarder_model_loaded 0\n";
        return plain_text(text.to_string());
    };
    let engine = worker.engine_metrics();
    let mut text = format!(
        "# TYPE larder_model_loaded gauge\nlarder_model_loaded 1\n{}",
        worker_metrics(worker, &engine)
    );
    if let Some(d) = &engine.disk_tier {
        text.push_str(&format!(
            "# TYPE larder_state_disk_hits_total counter\nlarder_state_disk_hits_total {}\n\
             # TYPE larder_state_disk_misses_total counter\nlarder_state_disk_misses_total {}\n\
             # TYPE larder_state_disk_bytes_written_total counter\nlarder_state_disk_bytes_written_total {}\n\
             # TYPE larder_state_disk_bytes_read_total counter\nlarder_state_disk_bytes_read_total {}\n\
             # TYPE larder_state_disk_load_seconds_total counter\nlarder_state_disk_load_seconds_total {}\n\
             # TYPE larder_state_disk_save_failures_total counter\nlarder_state_disk_save_failures_total {}\n\
             # TYPE larder_state_disk_bad_files_total counter\nlarder_state_disk_bad_files_total {}\n\
             # TYPE larder_state_disk_files gauge\nlarder_state_disk_files {}\n\
             # TYPE larder_state_disk_bytes gauge\nlarder_state_disk_bytes {}\n",
            d.hits, d.misses, d.bytes_written, d.bytes_read, d.load_s, d.save_failures, d.bad_files, d.files, d.bytes_on_disk
        ));
    }
    if let Some(s) = &engine.store {
        text.push_str(&format!(
            "# TYPE larder_expert_cache_hits_total counter\nlarder_expert_cache_hits_total {}\n\
             # TYPE larder_expert_cache_misses_total counter\nlarder_expert_cache_misses_total {}\n\
             # TYPE larder_expert_bytes_read_total counter\nlarder_expert_bytes_read_total {}\n",
            s.hits, s.misses, s.bytes_read
        ));
    }
    plain_text(text)
}

fn plain_text(text: String) -> Response<ReplyBody> {
    Response::builder()
        .status(200)
        .header("content-type", "text/plain; version=0.0.4")
        .body(ReplyBody::Full(Full::new(Bytes::from(text))))
        .unwrap_or_else(|_| error_reply(&ApiError::plain(500, "server_error", None, "metrics")))
}

fn worker_metrics(worker: &Worker, engine: &larder_engine::Metrics) -> String {
    let m = &worker.metrics;
    format!(
        "# TYPE larder_requests_total counter\nlarder_requests_total {}\n\
         # TYPE larder_requests_rejected_total counter\nlarder_requests_rejected_total {}\n\
         # TYPE larder_prompt_tokens_total counter\nlarder_prompt_tokens_total {}\n\
         # TYPE larder_completion_tokens_total counter\nlarder_completion_tokens_total {}\n\
         # TYPE larder_queue_depth gauge\nlarder_queue_depth {}\n\
         # TYPE larder_decode_tokens_per_second gauge\nlarder_decode_tokens_per_second {}\n\
         # TYPE larder_running_sequences gauge\nlarder_running_sequences {}\n\
         # TYPE larder_queued_sequences gauge\nlarder_queued_sequences {}\n\
         # TYPE larder_batch_size gauge\nlarder_batch_size {}\n\
         # TYPE larder_kv_bytes_in_use gauge\nlarder_kv_bytes_in_use {}\n\
         # TYPE larder_kv_bytes_kept gauge\nlarder_kv_bytes_kept {}\n\
         # TYPE larder_kept_conversations gauge\nlarder_kept_conversations {}\n\
         # TYPE larder_preemptions_total counter\nlarder_preemptions_total {}\n",
        m.requests.load(Ordering::Relaxed),
        m.rejected_full.load(Ordering::Relaxed),
        engine.prompt_tokens,
        engine.completion_tokens,
        worker.queue_depth(),
        engine.last_decode_tok_per_s,
        engine.running,
        engine.waiting,
        engine.last_batch,
        engine.kv_bytes_in_use,
        engine.kv_bytes_kept,
        engine.kept_conversations,
        engine.preemptions,
    )
}

#[cfg(test)]
mod tests {
    use super::{bearer_token, constant_time_eq};

    #[test]
    fn the_bearer_scheme_is_matched_in_any_case_with_any_whitespace_after_it() {
        for header in [
            "Bearer k3y",
            "bearer k3y",
            "BEARER k3y",
            "bEaReR k3y",
            "Bearer   k3y",
            "Bearer\tk3y",
            "Bearer \t k3y  ",
        ] {
            assert_eq!(bearer_token(header.as_bytes()), Some(b"k3y".as_slice()), "{header:?}");
        }
    }

    #[test]
    fn other_schemes_and_empty_tokens_are_not_bearer_tokens() {
        for header in [
            "",
            "Bearer",
            "Bearer ",
            "Bearer   ",
            "Bearerk3y",
            "Basic k3y",
            "Token k3y",
            "Bear k3y",
            " Bearer k3y",
        ] {
            assert_eq!(bearer_token(header.as_bytes()), None, "{header:?}");
        }
    }

    #[test]
    fn keys_compare_whole() {
        assert!(constant_time_eq(b"k3y", b"k3y"));
        assert!(!constant_time_eq(b"k3y", b"k3z"));
        assert!(!constant_time_eq(b"k3y", b"k3y4"));
        assert!(!constant_time_eq(b"", b"k"));
    }
}
