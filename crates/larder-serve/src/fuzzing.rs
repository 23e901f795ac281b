//! Entry points for the cargo-fuzz targets in `fuzz/` (docs/fuzzing.md); not
//! API. Drives the server's private SSE writer (`http::stream_events`) with
//! made-up engine events, and checks that what it writes is well-formed
//! server-sent events: every chunk one complete `data: ...\n\n` frame (or a
//! `: \n\n` keep-alive comment), no line break inside a payload, JSON
//! payloads, `[DONE]` only last, and the streamed text equal to the text the
//! engine produced.

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
    fn an_error_ends_the_stream_with_a_json_error_frame() {
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
        let last = chunks.last().unwrap();
        let v: Value = serde_json::from_slice(&last[6..last.len() - 2]).unwrap();
        assert_eq!(v["error"]["message"], "boom\n\ndata: x");
    }

    #[test]
    fn the_checker_refuses_broken_frames() {
        let done = Bytes::from_static(b"data: [DONE]\n\n");
        let good = [Bytes::from_static(b"data: {}\n\n"), Bytes::from_static(b": \n\n"), done.clone()];
        assert_eq!(check_sse(false, &[], &good), Ok(()));
        let bad: [&[u8]; 4] = [b"data: {}\n", b"data: a\nb\n\n", b"data: [DONE]\n\n", b"event: x\n\n"];
        for chunk in bad {
            let chunks = [Bytes::from_static(chunk), done.clone()];
            assert!(check_sse(false, &[], &chunks).is_err(), "{chunk:?}");
        }
    }
}
