//! What every generating endpoint shares, below the routes: reply bodies
//! (JSON and server-sent events), reading a body under the limits, waiting
//! for engine events under the shutdown grace period, and admitting a
//! request up to the start of generation (`admit`). `http` routes the
//! OpenAI endpoints; `messages` and `responses` the agent APIs.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::HeaderValue;
use hyper::{Request, Response, StatusCode};
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use crate::api::{ApiError, GenerationRequest};
use crate::worker::{Choices, Event, EventSource, Worker};
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

pub(crate) fn json_reply(status: u16, v: &Value) -> Response<ReplyBody> {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .body(ReplyBody::Full(Full::new(Bytes::from(v.to_string()))))
        .unwrap_or_else(|_| Response::new(ReplyBody::Full(Full::new(Bytes::new()))))
}

/// The client's view of an error; 5xx are logged in full server-side.
pub(crate) fn error_reply(e: &ApiError) -> Response<ReplyBody> {
    e.log();
    let mut r = json_reply(e.status, &e.body());
    if e.status == 429 || e.status == 503 {
        let wait = HeaderValue::from(e.retry_after_s.unwrap_or(1));
        r.headers_mut().insert("retry-after", wait);
    }
    r
}

pub(crate) fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn too_large(limit: usize) -> ApiError {
    ApiError {
        param: Some("body".into()),
        code: Some("request_too_large"),
        ..ApiError::plain(
            413,
            "invalid_request_error",
            None,
            format!("the request body is larger than {limit} bytes (the server's --max-request-bytes)"),
        )
    }
}

/// Reads the body, refusing with 413 before reading when `Content-Length`
/// is over the limit, and while reading when a chunked body grows past it.
pub(crate) async fn read_body(config: &ServerConfig, req: Request<Incoming>) -> Result<Bytes, ApiError> {
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > config.max_request_bytes as u64) {
        return Err(too_large(config.max_request_bytes));
    }
    let limited = Limited::new(req.into_body(), config.max_request_bytes);
    match tokio::time::timeout(config.body_timeout, limited.collect()).await {
        Err(_) => Err(ApiError::plain(
            408,
            "invalid_request_error",
            None,
            "the request body took too long to arrive",
        )),
        Ok(Err(e)) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => Err(too_large(config.max_request_bytes)),
        Ok(Err(e)) => Err(ApiError::invalid("body", format!("cannot read the request body: {e}"))),
        Ok(Ok(c)) => Ok(c.to_bytes()),
    }
}

/// A refused body: the connection closes after the reply, so the client
/// sees it without the server reading what it still sends.
pub(crate) fn body_error(e: &ApiError) -> Response<ReplyBody> {
    let mut r = error_reply(e);
    if e.status == 413 || e.status == 408 {
        r.headers_mut().insert("connection", HeaderValue::from_static("close"));
    }
    r
}

/// The next engine event, or `Err` once the shutdown grace period is over.
pub(crate) async fn next_event(rx: &mut impl EventSource, abort: &mut watch::Receiver<bool>) -> Result<Option<Event>, ()> {
    tokio::select! {
        ev = rx.recv() => Ok(ev),
        Ok(_) = abort.wait_for(|a| *a) => Err(()),
    }
}

/// The next engine event and its choice's index, or `Err` once the
/// shutdown grace period is over.
pub(crate) async fn next_choice_event(rx: &mut impl EventSource, abort: &mut watch::Receiver<bool>) -> Result<Option<(usize, Event)>, ()> {
    tokio::select! {
        ev = rx.recv_choice() => Ok(ev),
        Ok(_) = abort.wait_for(|a| *a) => Err(()),
    }
}

pub(crate) fn shutting_down() -> ApiError {
    ApiError::plain(
        503,
        "server_error",
        Some("server_shutdown"),
        "the server is shutting down and stopped this generation; retry on another server or later",
    )
}

/// Runs a validated request up to the start of generation, as every
/// generating endpoint does: the context check, a place in the queue (429
/// when full), preparation off the engine thread, the engine's own checks
/// (the KV budget); every refusal comes before generation starts. Returns
/// the prompt's token count and the job's events (dropping them cancels it).
pub(crate) async fn admit(
    abort: &watch::Receiver<bool>,
    worker: &Worker,
    request: &GenerationRequest,
) -> Result<(usize, Choices), ApiError> {
    if let Some(n) = request.max_tokens {
        if n >= worker.context_len {
            return Err(ApiError::invalid(
                "max_tokens",
                format!("max_tokens {n} exceeds the model's context of {} tokens", worker.context_len),
            ));
        }
    }
    let slot = worker.reserve()?;
    let mut abort = abort.clone();
    // Template, tokenization and prompt checks, off the engine thread.
    let prepared = tokio::select! {
        prepared = worker.prepare(request) => prepared?,
        Ok(_) = abort.wait_for(|a| *a) => return Err(shutting_down()),
    };
    // The engine checks the job first (the KV budget may refuse it).
    let mut rx = worker.submit(slot, prepared, request.n)?;
    match next_event(&mut rx, &mut abort).await {
        Ok(Some(Event::Started { prompt_tokens })) => Ok((prompt_tokens, rx)),
        Ok(Some(Event::Failed(e))) => Err(e),
        Err(()) => Err(shutting_down()),
        _ => Err(engine_stopped()),
    }
}

/// The token count of a validated request's prompt (rendered with the chat
/// template, as generation would), prepared in its turn like any request
/// (it holds a place in the queue while preparing); nothing is generated.
pub(crate) async fn count_prompt(abort: &watch::Receiver<bool>, worker: &Worker, request: &GenerationRequest) -> Result<usize, ApiError> {
    let _slot = worker.reserve()?;
    let mut abort = abort.clone();
    tokio::select! {
        prepared = worker.prepare(request) => Ok(prepared?.prompt.len()),
        Ok(_) = abort.wait_for(|a| *a) => Err(shutting_down()),
    }
}

/// A server-sent-event reply reading its chunks from `body`.
pub(crate) fn sse_reply(body: mpsc::UnboundedReceiver<Bytes>) -> Response<ReplyBody> {
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(ReplyBody::Events(body))
        .unwrap_or_else(|_| error_reply(&ApiError::plain(500, "server_error", None, "response")))
}

pub(crate) fn engine_stopped() -> ApiError {
    ApiError::plain(500, "server_error", None, "the engine thread stopped")
}
