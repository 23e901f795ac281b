//! HTTP: routing, limits, auth, and the OpenAI response shapes (JSON and
//! server-sent events) over hyper 1 on tokio.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::api::{parse_request, ApiError, Endpoint, GenerationRequest};
use crate::worker::{Event, Worker};
use crate::ServerConfig;

/// A response body: a whole buffer, or server-sent events as they come.
pub enum ReplyBody {
    Full(Full<Bytes>),
    Events(mpsc::UnboundedReceiver<Bytes>),
}

impl Body for ReplyBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            ReplyBody::Full(f) => Pin::new(f).poll_frame(cx),
            ReplyBody::Events(rx) => rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
        }
    }
}

/// What every connection shares.
pub struct State {
    pub config: ServerConfig,
    pub worker: Worker,
    pub ids: std::sync::atomic::AtomicU64,
}

fn json_reply(status: u16, v: &Value) -> Response<ReplyBody> {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .body(ReplyBody::Full(Full::new(Bytes::from(v.to_string()))))
        .unwrap_or_else(|_| Response::new(ReplyBody::Full(Full::new(Bytes::new()))))
}

fn error_reply(e: &ApiError) -> Response<ReplyBody> {
    let mut r = json_reply(e.status, &e.body());
    if e.status == 429 {
        r.headers_mut().insert("retry-after", hyper::header::HeaderValue::from_static("1"));
    }
    r
}

/// Answers one request.
pub async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Response<ReplyBody>, Infallible> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    if path.starts_with("/v1/") && !authorized(&state.config, &req) {
        return Ok(error_reply(&ApiError::plain(
            401,
            "invalid_request_error",
            Some("invalid_api_key"),
            "missing or wrong API key: send `Authorization: Bearer <key>`",
        )));
    }
    let reply = match (method, path.as_str()) {
        (Method::GET, "/health") => json_reply(200, &json!({"status": "ok"})),
        (Method::GET, "/metrics") => metrics(&state),
        (Method::GET, "/v1/models") => json_reply(
            200,
            &json!({"object": "list", "data": [{"id": state.config.served_name, "object": "model", "created": now(), "owned_by": "larder"}]}),
        ),
        (Method::POST, "/v1/chat/completions") => generate(&state, Endpoint::Chat, req).await,
        (Method::POST, "/v1/completions") => generate(&state, Endpoint::Completion, req).await,
        (_, "/health" | "/metrics" | "/v1/models" | "/v1/chat/completions" | "/v1/completions") => {
            error_reply(&ApiError::plain(405, "invalid_request_error", None, "method not allowed"))
        }
        _ => error_reply(&ApiError::plain(404, "invalid_request_error", None, format!("no route for {path}"))),
    };
    Ok(reply)
}

fn authorized(config: &ServerConfig, req: &Request<Incoming>) -> bool {
    let Some(key) = &config.api_key else { return true };
    req.headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|got| got.as_bytes() == key.as_bytes())
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

async fn read_body(config: &ServerConfig, req: Request<Incoming>) -> Result<Bytes, ApiError> {
    let limited = Limited::new(req.into_body(), config.max_request_bytes);
    match tokio::time::timeout(config.body_timeout, limited.collect()).await {
        Err(_) => Err(ApiError::plain(
            408,
            "invalid_request_error",
            None,
            "the request body took too long to arrive",
        )),
        Ok(Err(e)) if e.to_string().contains("length limit") => Err(ApiError::invalid(
            "body",
            format!("the request body is larger than {} bytes", config.max_request_bytes),
        )),
        Ok(Err(e)) => Err(ApiError::invalid("body", format!("cannot read the request body: {e}"))),
        Ok(Ok(c)) => Ok(c.to_bytes()),
    }
}

async fn generate(state: &Arc<State>, endpoint: Endpoint, req: Request<Incoming>) -> Response<ReplyBody> {
    let body = match read_body(&state.config, req).await {
        Ok(b) => b,
        Err(e) => return error_reply(&e),
    };
    let request = match parse_request(endpoint, &body, &state.config.served_name) {
        Ok(r) => r,
        Err(e) => return error_reply(&e),
    };
    if let Some(n) = request.max_tokens {
        if n >= state.worker.context_len {
            return error_reply(&ApiError::invalid(
                "max_tokens",
                format!("max_tokens {n} exceeds the model's context of {} tokens", state.worker.context_len),
            ));
        }
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    if let Err(e) = state.worker.submit(request.clone(), tx) {
        return error_reply(&e);
    }
    // Validation that needs the tokenizer happens on the engine thread; wait for it.
    let prompt_tokens = match rx.recv().await {
        Some(Event::Started { prompt_tokens }) => prompt_tokens,
        Some(Event::Failed(e)) => return error_reply(&e),
        _ => return error_reply(&ApiError::plain(500, "server_error", None, "the engine stopped")),
    };
    let id = format!(
        "{}-{}",
        if endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" },
        state.ids.fetch_add(1, Ordering::Relaxed)
    );
    let model = state.config.served_name.clone();
    if request.stream {
        let (out, body) = mpsc::unbounded_channel::<Bytes>();
        tokio::spawn(stream_events(request, id, model, prompt_tokens, rx, out));
        return Response::builder()
            .status(200)
            .header("content-type", "text/event-stream")
            .header("cache-control", "no-cache")
            .body(ReplyBody::Events(body))
            .unwrap_or_else(|_| error_reply(&ApiError::plain(500, "server_error", None, "response")));
    }
    let mut text = String::new();
    loop {
        match rx.recv().await {
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Done {
                finish_reason,
                completion_tokens,
                cached_tokens,
            }) => {
                let usage = usage(prompt_tokens, completion_tokens, cached_tokens);
                let choice = match endpoint {
                    Endpoint::Chat => {
                        json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": finish_reason})
                    }
                    Endpoint::Completion => json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason}),
                };
                let object = if endpoint == Endpoint::Chat {
                    "chat.completion"
                } else {
                    "text_completion"
                };
                return json_reply(
                    200,
                    &json!({"id": id, "object": object, "created": now(), "model": model, "choices": [choice], "usage": usage}),
                );
            }
            Some(Event::Failed(e)) => return error_reply(&e),
            Some(Event::Started { .. }) => {}
            None => return error_reply(&ApiError::plain(500, "server_error", None, "the engine stopped")),
        }
    }
}

fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": cached}})
}

/// Turns engine events into SSE chunks; stops (dropping `rx`, which cancels
/// generation) when the client goes away.
pub(crate) async fn stream_events(
    request: GenerationRequest,
    id: String,
    model: String,
    prompt_tokens: usize,
    mut rx: mpsc::UnboundedReceiver<Event>,
    out: mpsc::UnboundedSender<Bytes>,
) {
    let chat = request.endpoint == Endpoint::Chat;
    let created = now();
    let object = if chat { "chat.completion.chunk" } else { "text_completion" };
    let chunk = |choice: Value| json!({"id": id, "object": object, "created": created, "model": model, "choices": [choice]});
    let send = |v: &Value| out.send(Bytes::from(format!("data: {v}\n\n"))).is_ok();
    if chat
        && !send(&chunk(
            json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}),
        ))
    {
        return;
    }
    loop {
        let ev = tokio::select! {
            ev = rx.recv() => ev,
            // The client went away: dropping `rx` cancels the job.
            _ = out.closed() => return,
        };
        let Some(ev) = ev else { return };
        let ok = match ev {
            // Nothing to show for this token: an SSE comment keeps the
            // socket written to, so a vanished client is noticed.
            Event::Text(t) if t.is_empty() => out.send(Bytes::from_static(b": \n\n")).is_ok(),
            Event::Text(t) => send(&chunk(if chat {
                json!({"index": 0, "delta": {"content": t}, "logprobs": null, "finish_reason": null})
            } else {
                json!({"index": 0, "text": t, "logprobs": null, "finish_reason": null})
            })),
            Event::Done {
                finish_reason,
                completion_tokens,
                cached_tokens,
            } => {
                let last = if chat {
                    json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": finish_reason})
                } else {
                    json!({"index": 0, "text": "", "logprobs": null, "finish_reason": finish_reason})
                };
                send(&chunk(last));
                if request.include_usage {
                    send(
                        &json!({"id": id, "object": object, "created": created, "model": model, "choices": [],
                                 "usage": usage(prompt_tokens, completion_tokens, cached_tokens)}),
                    );
                }
                let _ = out.send(Bytes::from_static(b"data: [DONE]\n\n"));
                return;
            }
            Event::Failed(e) => {
                send(&e.body());
                return;
            }
            Event::Started { .. } => true,
        };
        if !ok {
            return; // client disconnected: dropping `rx` cancels the job
        }
    }
}

fn metrics(state: &State) -> Response<ReplyBody> {
    let m = &state.worker.metrics;
    let mut text = format!(
        "# TYPE larder_requests_total counter\nlarder_requests_total {}\n\
         # TYPE larder_requests_rejected_total counter\nlarder_requests_rejected_total {}\n\
         # TYPE larder_prompt_tokens_total counter\nlarder_prompt_tokens_total {}\n\
         # TYPE larder_completion_tokens_total counter\nlarder_completion_tokens_total {}\n\
         # TYPE larder_queue_depth gauge\nlarder_queue_depth {}\n\
         # TYPE larder_decode_tokens_per_second gauge\nlarder_decode_tokens_per_second {}\n",
        m.requests.load(Ordering::Relaxed),
        m.rejected_full.load(Ordering::Relaxed),
        m.prompt_tokens.load(Ordering::Relaxed),
        m.completion_tokens.load(Ordering::Relaxed),
        state.worker.queue_depth(),
        f64::from_bits(m.last_decode_tok_per_s.load(Ordering::Relaxed)),
    );
    if let Some(s) = state.worker.store_stats() {
        text.push_str(&format!(
            "# TYPE larder_expert_cache_hits_total counter\nlarder_expert_cache_hits_total {}\n\
             # TYPE larder_expert_cache_misses_total counter\nlarder_expert_cache_misses_total {}\n\
             # TYPE larder_expert_bytes_read_total counter\nlarder_expert_bytes_read_total {}\n",
            s.hits, s.misses, s.bytes_read
        ));
    }
    Response::builder()
        .status(200)
        .header("content-type", "text/plain; version=0.0.4")
        .body(ReplyBody::Full(Full::new(Bytes::from(text))))
        .unwrap_or_else(|_| error_reply(&ApiError::plain(500, "server_error", None, "metrics")))
}
