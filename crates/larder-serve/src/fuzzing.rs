//! Entry points for the cargo-fuzz targets in `fuzz/` (docs/fuzzing.md); not
//! API. Drives the server's private SSE writer (`http::stream_events`) with
//! made-up engine events, and checks that what it writes is well-formed
//! server-sent events: every chunk one complete `data: ...\n\n` frame (or a
//! `: \n\n` keep-alive comment), no line break inside a payload, JSON
//! payloads, the streamed text equal to the text the engine produced, and
//! every stream ending with `[DONE]` (only last): right after an error
//! event when generation did not finish (it failed, or the engine's events
//! stopped without an end).

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::api::{parse_request, ApiError, Endpoint};
use crate::worker::Event;

/// An engine event, as the fuzzer makes them.
#[derive(Debug, Clone, PartialEq)]
pub enum FuzzEvent {
    Started(usize),
    Text(String),
    Done {
        finish_reason: u8,
        completion_tokens: usize,
        cached_tokens: usize,
    },
    Failed {
        status: u16,
        message: String,
    },
}

const FINISH_REASONS: [&str; 3] = ["stop", "length", "cancelled"];

fn event(e: FuzzEvent) -> Event {
    match e {
        FuzzEvent::Started(prompt_tokens) => Event::Started { prompt_tokens },
        FuzzEvent::Text(t) => Event::Text(t),
        FuzzEvent::Done {
            finish_reason,
            completion_tokens,
            cached_tokens,
        } => Event::Done {
            finish_reason: FINISH_REASONS[usize::from(finish_reason) % FINISH_REASONS.len()],
            completion_tokens,
            cached_tokens,
            stop_sequence: None,
        },
        FuzzEvent::Failed { status, message } => Event::Failed(ApiError::plain(status, "server_error", None, message)),
    }
}

/// The chunks the SSE writer sends for `events`, on a streaming request to
/// the chat (`chat`) or completions endpoint.
pub fn sse_chunks(chat: bool, include_usage: bool, prompt_tokens: usize, events: Vec<FuzzEvent>) -> Result<Vec<Bytes>, String> {
    let (endpoint, prompt) = if chat {
        (Endpoint::Chat, r#""messages": [{"role": "user", "content": "hi"}]"#)
    } else {
        (Endpoint::Completion, r#""prompt": "hi""#)
    };
    let body = format!(r#"{{"model": "larder", {prompt}, "stream": true, "stream_options": {{"include_usage": {include_usage}}}}}"#);
    let request = parse_request(endpoint, body.as_bytes(), "larder").map_err(|e| e.message)?;
    let (tx, rx) = mpsc::unbounded_channel();
    for e in events {
        tx.send(event(e)).map_err(|e| e.to_string())?;
    }
    drop(tx);
    let (out, mut sent) = mpsc::unbounded_channel();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let id = if chat { "chatcmpl-0" } else { "cmpl-0" };
    runtime.block_on(crate::http::stream_events(
        request,
        id.into(),
        "larder".into(),
        prompt_tokens,
        rx,
        None,
        out,
        tokio::sync::watch::channel(false).1,
    ));
    let mut chunks = Vec::new();
    while let Ok(b) = sent.try_recv() {
        chunks.push(b);
    }
    Ok(chunks)
}

/// Checks `chunks` (from [`sse_chunks`]) are well-formed SSE for `events`;
/// the error says which chunk is wrong and why.
pub fn check_sse(chat: bool, events: &[FuzzEvent], chunks: &[Bytes]) -> Result<(), String> {
    let mut text = String::new();
    for (i, chunk) in chunks.iter().enumerate() {
        let bad = |why: &str| Err(format!("chunk {i} {why}: {:?}", String::from_utf8_lossy(chunk)));
        let Some(frame) = chunk.strip_suffix(b"\n\n") else {
            return bad("does not end a frame with a blank line");
        };
        if frame == b": " {
            continue;
        }
        let Some(payload) = frame.strip_prefix(b"data: ") else {
            return bad("is neither `data: ` nor a comment");
        };
        if payload.contains(&b'\n') || payload.contains(&b'\r') {
            return bad("has a line break inside its payload");
        }
        if payload == b"[DONE]" {
            if i + 1 != chunks.len() {
                return bad("is `[DONE]` before the end of the stream");
            }
            continue;
        }
        let Ok(v) = serde_json::from_slice::<Value>(payload) else {
            return bad("is not JSON");
        };
        if chat && i == 0 && v["choices"][0]["delta"]["role"] != "assistant" {
            return bad("opens a chat stream without the assistant role");
        }
        let piece = if chat {
            &v["choices"][0]["delta"]["content"]
        } else {
            &v["choices"][0]["text"]
        };
        text.push_str(piece.as_str().unwrap_or(""));
    }
    check_end(chunks, events)?;
    let expected: String = events
        .iter()
        .take_while(|e| !matches!(e, FuzzEvent::Done { .. } | FuzzEvent::Failed { .. }))
        .filter_map(|e| match e {
            FuzzEvent::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    if text != expected {
        return Err(format!("the stream carries {text:?}, the engine produced {expected:?}"));
    }
    Ok(())
}

/// However the engine's events end, the stream ends with `[DONE]`; when
/// they do not end with `Done` (a failure, or none at all: the engine
/// thread went away), an error event comes right before it.
fn check_end(chunks: &[Bytes], events: &[FuzzEvent]) -> Result<(), String> {
    if chunks.last().map(Bytes::as_ref) != Some(b"data: [DONE]\n\n".as_slice()) {
        return Err(format!("the stream does not end with `data: [DONE]`: {:?}", chunks.last()));
    }
    let finished = events
        .iter()
        .find(|e| matches!(e, FuzzEvent::Done { .. } | FuzzEvent::Failed { .. }));
    if matches!(finished, Some(FuzzEvent::Done { .. })) {
        return Ok(());
    }
    let before = chunks.len().checked_sub(2).map(|i| &chunks[i]);
    let error = before
        .and_then(|c| c.strip_prefix(b"data: "))
        .and_then(|c| c.strip_suffix(b"\n\n"))
        .and_then(|payload| serde_json::from_slice::<Value>(payload).ok());
    match error {
        Some(v) if v["error"]["message"].is_string() => Ok(()),
        _ => Err(format!(
            "generation did not finish but the frame before `[DONE]` is no error event: {:?}",
            before.map(|c| String::from_utf8_lossy(c))
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(chat: bool, events: Vec<FuzzEvent>) -> Vec<Bytes> {
        let chunks = sse_chunks(chat, true, 3, events.clone()).unwrap();
        check_sse(chat, &events, &chunks).unwrap();
        chunks
    }

    #[test]
    fn line_breaks_and_frame_markers_in_text_stay_inside_one_frame() {
        for chat in [true, false] {
            let chunks = roundtrip(
                chat,
                vec![
                    FuzzEvent::Started(3),
                    FuzzEvent::Text("a\n\ndata: [DONE]\n\n".into()),
                    FuzzEvent::Text(String::new()),
                    FuzzEvent::Text("\r\n\u{2028}\0\"}".into()),
                    FuzzEvent::Done {
                        finish_reason: 0,
                        completion_tokens: 2,
                        cached_tokens: 0,
                    },
                ],
            );
            assert_eq!(chunks.last().unwrap().as_ref(), b"data: [DONE]\n\n");
        }
    }

    #[test]
    fn an_error_ends_the_stream_with_a_json_error_frame_then_done() {
        let chunks = roundtrip(
            true,
            vec![
                FuzzEvent::Text("x".into()),
                FuzzEvent::Failed {
                    status: 500,
                    message: "boom\n\ndata: x".into(),
                },
                FuzzEvent::Text("after".into()),
            ],
        );
        assert_eq!(chunks.last().unwrap().as_ref(), b"data: [DONE]\n\n");
        let error = &chunks[chunks.len() - 2];
        let v: Value = serde_json::from_slice(&error[6..error.len() - 2]).unwrap();
        assert_eq!(v["error"]["message"], "boom\n\ndata: x");
    }

    #[test]
    fn events_that_stop_without_an_end_give_an_error_event_then_done() {
        for chat in [true, false] {
            for events in [vec![], vec![FuzzEvent::Started(2), FuzzEvent::Text("half".into())]] {
                let chunks = roundtrip(chat, events);
                let error = &chunks[chunks.len() - 2];
                let v: Value = serde_json::from_slice(&error[6..error.len() - 2]).unwrap();
                assert_eq!(v["error"]["type"], "server_error", "{v}");
            }
        }
    }

    #[test]
    fn the_checker_wants_done_after_an_error() {
        let failed = [FuzzEvent::Failed {
            status: 500,
            message: "boom".into(),
        }];
        let error = Bytes::from_static(b"data: {\"error\": {\"message\": \"boom\"}}\n\n");
        let done = Bytes::from_static(b"data: [DONE]\n\n");
        assert_eq!(check_sse(false, &failed, &[error.clone(), done.clone()]), Ok(()));
        assert!(check_sse(false, &failed, std::slice::from_ref(&error)).is_err(), "no [DONE]");
        assert!(check_sse(false, &failed, std::slice::from_ref(&done)).is_err(), "no error event");
        let text = Bytes::from_static(b"data: {\"choices\": [{\"text\": \"\"}]}\n\n");
        assert!(
            check_sse(false, &[], &[text, done]).is_err(),
            "events ended without an end, and no error event"
        );
    }

    #[test]
    fn the_checker_refuses_broken_frames() {
        let done = Bytes::from_static(b"data: [DONE]\n\n");
        let finished = [FuzzEvent::Done {
            finish_reason: 0,
            completion_tokens: 0,
            cached_tokens: 0,
        }];
        let good = [Bytes::from_static(b"data: {}\n\n"), Bytes::from_static(b": \n\n"), done.clone()];
        assert_eq!(check_sse(false, &finished, &good), Ok(()));
        let bad: [&[u8]; 4] = [b"data: {}\n", b"data: a\nb\n\n", b"data: [DONE]\n\n", b"event: x\n\n"];
        for chunk in bad {
            let chunks = [Bytes::from_static(chunk), done.clone()];
            assert!(check_sse(false, &finished, &chunks).is_err(), "{chunk:?}");
        }
    }
}
