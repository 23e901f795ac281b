//! Fuzzes the server's SSE writer: made-up engine event sequences (text with
//! any characters, keep-alives, done, errors, events after the end) through
//! `larder_serve::fuzzing::sse_chunks`, then a structural check
//! (`check_sse`): every chunk one complete `data: <JSON or [DONE]>\n\n`
//! frame or a `: \n\n` comment, no line break inside a payload, `[DONE]`
//! last and always there (right after an error event when generation did
//! not finish), and the streamed text exactly the engine's text.
#![no_main]

use larder_serve::fuzzing::{check_sse, sse_chunks, FuzzEvent};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
enum Ev {
    Started(u32),
    Text(String),
    Done { finish: u8, completion: u32, cached: u32 },
    Failed { status: u16, message: String },
}

#[derive(Debug, Arbitrary)]
struct Input {
    chat: bool,
    include_usage: bool,
    prompt_tokens: u32,
    events: Vec<Ev>,
}

fn event(e: Ev) -> FuzzEvent {
    // Token counts are u32: a real stream never nears usize::MAX.
    match e {
        Ev::Started(n) => FuzzEvent::Started(n as usize),
        Ev::Text(t) => FuzzEvent::Text(t),
        Ev::Done {
            finish,
            completion,
            cached,
        } => FuzzEvent::Done {
            finish_reason: finish,
            completion_tokens: completion as usize,
            cached_tokens: cached as usize,
        },
        Ev::Failed { status, message } => FuzzEvent::Failed { status, message },
    }
}

fuzz_target!(|input: Input| {
    let events: Vec<FuzzEvent> = input.events.into_iter().map(event).collect();
    let chunks = match sse_chunks(input.chat, input.include_usage, input.prompt_tokens as usize, events.clone()) {
        Ok(c) => c,
        Err(e) => panic!("the SSE harness failed: {e}"),
    };
    if let Err(e) = check_sse(input.chat, &events, &chunks) {
        panic!("malformed SSE: {e}");
    }
});
