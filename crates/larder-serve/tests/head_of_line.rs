//! Black-box tests of head-of-line blocking (issue 37): the real server on a
//! random loopback port, a running stream, and a flood of 16 requests whose
//! prompts are about 1 MiB of text each. Preparing a request (chat template,
//! tokenization, prompt checks) runs off the engine thread, so the running
//! stream keeps its pace while the flood is tokenized, and a small request
//! sent behind the flood is answered before the flood is through.
//!
//! Both tests share one lock: a flood on a 2-core machine is the load each
//! one measures under, so two at once would measure each other. Neither
//! asserts a count that depends on timing: one bounds the longest gap of a
//! stream (best of a few floods, see [`STALL_BOUND`]), the other the order
//! in which replies arrive.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use larder_engine::Engine;
use larder_serve::{start, RunningServer, ServerConfig};
use serde_json::{json, Value};

mod common;
use common::*;

/// One flood at a time (see the module doc).
static FLOOD: Mutex<()> = Mutex::new(());

/// Requests in a flood.
const FLOOD_REQUESTS: usize = 16;
/// Bytes of prompt text per flooding request (the body stays under the
/// default 1 MiB `--max-request-bytes`).
const FLOOD_PROMPT_BYTES: usize = 1_000_000;

/// Tokens the running stream asks for: more than it can generate while a
/// flood is prepared, even on a slow, loaded machine (it is cancelled then).
const STREAM_TOKENS: usize = 65536;

/// The longest gap allowed between two chunks of a running stream while a
/// flood is prepared (issue 37). Preparing a 1 MiB prompt takes 0.4-0.8 s
/// of CPU in a debug build; on the engine thread every prompt of the flood
/// stalled running streams that long (5.9 s for the flood, measured), so a
/// stall the server causes shows in every flood. A stall the machine
/// causes does not repeat: on a 2-core machine shared with other builds
/// (load 4-7), other processes preempting the engine thread (or its
/// kernel workers, or the client) gave gaps up to 64 ms with no flood at
/// all, and up to 185 ms in a flood even with preparation at the lowest
/// CPU priority (SCHED_IDLE). So the test takes the best of up to
/// [`FLOOD_ATTEMPTS`] floods, against a bound well above what the machine
/// alone causes (CI runs the emulated AVX-512 tests on one core beside the
/// test suite on the other) and far below the server's own stall. On a
/// quiet machine the longest gap measured 12-22 ms (issue 37's target is
/// 100 ms; docs/server.md).
const STALL_BOUND: Duration = Duration::from_millis(250);

/// Floods the stall test may try (see [`STALL_BOUND`]).
const FLOOD_ATTEMPTS: usize = 3;

/// A copy of the tokenizer fixture with room for a long stream (the
/// fixture's context is 256 tokens).
fn long_tokenizer_model(tag: &str) -> PathBuf {
    let dir = fixture_copy("qwen3_moe_tok", tag);
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["max_position_embeddings"] = json!(STREAM_TOKENS + 64);
    std::fs::write(&path, config.to_string()).unwrap();
    dir
}

fn serve(model: &std::path::Path) -> RunningServer {
    start(
        Engine::load(model).unwrap(),
        ServerConfig {
            port: 0,
            served_name: "tiny".into(),
            // Room for the stream, the flood and the small request: no 429.
            queue_depth: 64,
            ..ServerConfig::default()
        },
    )
    .unwrap()
}

/// About `bytes` of English-looking text: words drawn from a fixed list by
/// a seeded generator, so every prompt differs and none repeats a pattern.
fn big_prompt(seed: u64, bytes: usize) -> String {
    const WORDS: [&str; 24] = [
        "the", "larder", "keeps", "experts", "in", "a", "cache", "while", "streams", "decode", "tokens", "from", "prompts", "that",
        "arrive", "over", "HTTP", "and", "every", "request", "waits", "its", "turn", "quietly",
    ];
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut text = String::with_capacity(bytes + 16);
    while text.len() < bytes {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        text.push_str(WORDS[(state >> 33) as usize % WORDS.len()]);
        text.push(if (state >> 20).is_multiple_of(13) { '.' } else { ' ' });
    }
    text.truncate(bytes);
    text
}

/// The body of flooding request `i`: chats and text completions alternate,
/// so both the chat template and plain tokenization are exercised.
fn flood_body(i: usize) -> Value {
    let prompt = big_prompt(i as u64, FLOOD_PROMPT_BYTES);
    if i.is_multiple_of(2) {
        json!({"model": "tiny", "messages": [{"role": "user", "content": prompt}], "max_tokens": 1})
    } else {
        json!({"model": "tiny", "prompt": prompt, "max_tokens": 1})
    }
}

/// Sends the flood, one thread per request; each thread returns its reply
/// and when it arrived.
fn flood(a: SocketAddr) -> Vec<JoinHandle<(Reply, Instant)>> {
    (0..FLOOD_REQUESTS)
        .map(|i| {
            let body = flood_body(i).to_string();
            std::thread::spawn(move || {
                let path = if i.is_multiple_of(2) {
                    "/v1/chat/completions"
                } else {
                    "/v1/completions"
                };
                let reply = send(a, "POST", path, &[("content-type", "application/json")], &body);
                (reply, Instant::now())
            })
        })
        .collect()
}

/// A flooding request's reply: refused as longer than the context (the
/// same 400 as without a flood), after it was tokenized.
fn assert_refused_as_too_long(reply: &Reply) {
    assert_eq!(reply.status, 400, "{}", reply.body);
    let message = reply.json()["error"]["message"].as_str().unwrap_or_default().to_string();
    assert!(
        message.contains("context") || message.contains("max_position_embeddings"),
        "{message}"
    );
}

/// A running stream: the arrival time of every read that brought bytes.
struct Stream {
    socket: TcpStream,
    arrivals: Arc<Mutex<Vec<Instant>>>,
    text: Arc<Mutex<String>>,
    reader: Option<JoinHandle<()>>,
}

impl Stream {
    /// Starts a long streaming completion and waits for its first bytes.
    fn start(a: SocketAddr, max_tokens: usize) -> Stream {
        let body =
            json!({"model": "tiny", "prompt": [5, 6, 7], "max_tokens": max_tokens, "ignore_eos": true, "stream": true, "temperature": 0})
                .to_string();
        let mut socket = TcpStream::connect(a).unwrap();
        socket.set_nodelay(true).unwrap();
        write!(
            socket,
            "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let text = Arc::new(Mutex::new(String::new()));
        let (mut s, times, all) = (socket.try_clone().unwrap(), arrivals.clone(), text.clone());
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            while let Ok(n @ 1..) = s.read(&mut buf) {
                times.lock().unwrap().push(Instant::now());
                all.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let t = Instant::now();
        while arrivals.lock().unwrap().len() < 4 {
            assert!(t.elapsed() < Duration::from_secs(60), "the stream never started");
            std::thread::sleep(Duration::from_millis(5));
        }
        Stream {
            socket,
            arrivals,
            text,
            reader: Some(reader),
        }
    }

    /// Whether the stream has ended (`[DONE]` seen).
    fn done(&self) -> bool {
        self.text.lock().unwrap().contains("data: [DONE]")
    }

    /// The longest time between two reads that brought bytes, over
    /// `from..=to`: the gaps that end after `from` and start before `to`
    /// (waiting for the first read after `to`, so a stall still going on
    /// at `to` is measured whole).
    fn longest_gap(&self, from: Instant, to: Instant) -> Duration {
        let t = Instant::now();
        while self.arrivals.lock().unwrap().last().is_none_or(|last| *last <= to) {
            assert!(t.elapsed() < Duration::from_secs(120), "the stream stopped");
            std::thread::sleep(Duration::from_millis(5));
        }
        let times = self.arrivals.lock().unwrap();
        times
            .windows(2)
            .filter(|w| w[1] >= from && w[0] <= to)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or_default()
    }

    /// Reads that brought bytes inside `from..=to`.
    fn reads(&self, from: Instant, to: Instant) -> usize {
        self.arrivals.lock().unwrap().iter().filter(|t| **t >= from && **t <= to).count()
    }

    /// Closes the connection (the server cancels the generation).
    fn stop(mut self) {
        let _ = self.socket.shutdown(Shutdown::Both);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// Waits until `n` requests are queued or running (received and parsed by
/// the server), so what is sent next is behind them.
fn wait_in_system(a: SocketAddr, n: u64) {
    let t = Instant::now();
    while metric(a, "larder_queue_depth") < n {
        assert!(t.elapsed() < Duration::from_secs(120), "the flood never reached the server");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Starts a long stream on `a`, floods `a`, checks every flooding request
/// got its 400, and returns the stream's longest gap while the flood was
/// being prepared.
fn stream_gap_under_a_flood(a: SocketAddr) -> Duration {
    let stream = Stream::start(a, STREAM_TOKENS);
    let from = Instant::now();
    let replies: Vec<(Reply, Instant)> = flood(a).into_iter().map(|h| h.join().unwrap()).collect();
    let to = Instant::now();
    assert!(!stream.done(), "the stream ended before the flood was through: lengthen it");
    let gap = stream.longest_gap(from, to);
    eprintln!(
        "a flood of {FLOOD_REQUESTS} prompts of {FLOOD_PROMPT_BYTES} bytes took {:.1?}; the stream's longest gap {gap:.1?} ({} reads)",
        to - from,
        stream.reads(from, to)
    );
    stream.stop();
    for (r, _) in &replies {
        assert_refused_as_too_long(r);
    }
    gap
}

#[test]
fn a_flood_of_large_prompts_does_not_stall_a_running_stream() {
    let _one = FLOOD.lock().unwrap_or_else(|e| e.into_inner());
    let model = long_tokenizer_model("hol-stream");
    let srv = serve(&model);
    let mut gaps = Vec::new();
    while gaps.len() < FLOOD_ATTEMPTS && gaps.last().is_none_or(|g| *g >= STALL_BOUND) {
        gaps.push(stream_gap_under_a_flood(srv.addr));
    }
    assert!(
        gaps.iter().any(|g| *g < STALL_BOUND),
        "a running stream stalled under a flood of large prompts, every time: longest gaps {gaps:?}"
    );
    drop(srv);
    let _ = std::fs::remove_dir_all(&model);
}

#[test]
fn a_small_request_behind_a_flood_of_large_prompts_is_answered_before_the_flood() {
    let _one = FLOOD.lock().unwrap_or_else(|e| e.into_inner());
    let model = long_tokenizer_model("hol-small");
    let srv = serve(&model);
    let a = srv.addr;
    let flooding = flood(a);
    wait_in_system(a, FLOOD_REQUESTS as u64);
    let small = json!({"model": "tiny", "prompt": "Hello there", "max_tokens": 3, "temperature": 0, "ignore_eos": true});
    let small = post(a, "/v1/completions", &small);
    let answered = Instant::now();
    assert_eq!(small.status, 200, "{}", small.body);
    assert_eq!(small.json()["usage"]["completion_tokens"], 3, "{}", small.body);
    let replies: Vec<(Reply, Instant)> = flooding.into_iter().map(|h| h.join().unwrap()).collect();
    for (r, _) in &replies {
        assert_refused_as_too_long(r);
    }
    let later = replies.iter().filter(|(_, at)| *at > answered).count();
    assert!(
        later > 0,
        "the small request was answered only after all {FLOOD_REQUESTS} large prompts: it waited for their tokenization"
    );
    drop(srv);
    let _ = std::fs::remove_dir_all(&model);
}
