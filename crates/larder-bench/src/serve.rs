//! `larder bench serve`: the real server, in-process on a loopback port,
//! driven over HTTP by C concurrent streaming completion clients per
//! `--clients` value (text prompts, or token ids when the model has no
//! tokenizer, as synthetic checkpoints do). Reports aggregate and per-client decode tok/s, time to
//! first token, expert bytes read per generated token (from `/metrics`, when
//! experts stream), and a second client's TTFT while a first one generates.
//!
//! With `--repeats R` the client counts run R rounds, in alternating order
//! (1,2,4,8 then 8,4,2,1, ...), so a drift of the machine's speed lands on
//! every arm alike; each row reports the median over its rounds and the
//! spread. Each row also gives the union-of-experts expectation for uniform
//! routing: C sequences choosing k of E experts independently need
//! E·(1 − (1 − k/E)^C) distinct experts per MoE layer step, i.e. that many
//! reads per C·k routes, against k per token for one client.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use larder_serve::{bind, RunningServer, ServerConfig};
use serde_json::{json, Value};

use crate::{BenchError, BoxError, Observer, Result, Unit};

/// A refused option value.
fn invalid(message: String) -> BenchError {
    BenchError::Invalid(message)
}

/// `--clients`: a comma-separated list of counts in 1..=256.
fn parse_clients(s: &str) -> Result<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(invalid(format!("--clients: an empty count in `{s}`; give counts like 1,2,4,8")));
        }
        let n: usize = part
            .parse()
            .map_err(|_| invalid(format!("--clients: `{part}` is not a number; give counts like 1,2,4,8")))?;
        if !(1..=256).contains(&n) {
            return Err(invalid(format!("--clients: {n} is not in 1..=256; give counts like 1,2,4,8")));
        }
        out.push(n);
    }
    Ok(out)
}

/// One streamed request, as the client saw it.
struct Sample {
    ttft: Duration,
    total: Duration,
    tokens: u64,
}

impl Sample {
    /// Decode tok/s after the first token.
    fn decode_rate(&self) -> f64 {
        let span = (self.total - self.ttft).as_secs_f64();
        if self.tokens > 1 && span > 0.0 {
            (self.tokens - 1) as f64 / span
        } else {
            0.0
        }
    }
}

/// Sends a streaming completion request and reads it to its end. `first`
/// is called once when the first token event arrives.
fn stream(addr: SocketAddr, prompt: &Value, max_new: usize, first: &mut dyn FnMut()) -> Result<Sample> {
    let body = json!({"model": "bench", "prompt": prompt, "max_tokens": max_new, "temperature": 0,
        "stream": true, "stream_options": {"include_usage": true}})
    .to_string();
    let start = Instant::now();
    let io = |e| BenchError::io(format!("cannot connect to the server at {addr}"), e);
    let mut s = TcpStream::connect(addr).map_err(io)?;
    s.set_read_timeout(Some(Duration::from_secs(3600))).map_err(io)?;
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    let io = |e| BenchError::io(format!("a request to the server at {addr}"), e);
    s.write_all(req.as_bytes()).map_err(io)?;
    let (mut raw, mut buf, mut ttft) = (Vec::new(), [0u8; 8192], None);
    loop {
        let n = s.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        // A token's event: its text, or the SSE comment the server sends
        // for a token that adds no text yet (or when the model has no tokenizer).
        if ttft.is_none() && (contains(&raw, b"\"text\"") || contains(&raw, b": \n\n")) {
            ttft = Some(start.elapsed());
            first();
        }
    }
    let total = start.elapsed();
    let text = String::from_utf8_lossy(&raw);
    if !text.starts_with("HTTP/1.1 200") {
        let status = text.lines().next().unwrap_or("");
        return Err(BenchError::Failed(format!("the server refused a request: {status}")));
    }
    let tokens = text
        .split("data: ")
        .filter_map(|e| serde_json::from_str::<Value>(e.split("\r\n").next()?.trim()).ok())
        .filter_map(|v| v.pointer("/usage/completion_tokens").and_then(Value::as_u64))
        .last()
        .ok_or_else(|| BenchError::Failed("the stream ended without usage (completion_tokens)".into()))?;
    Ok(Sample {
        ttft: ttft.unwrap_or(total),
        total,
        tokens,
    })
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// `larder_expert_bytes_read_total` from `/metrics` (None when experts are in RAM).
fn expert_bytes(addr: SocketAddr) -> Result<Option<u64>> {
    let io = |e| BenchError::io(format!("GET /metrics from the server at {addr}"), e);
    let mut s = TcpStream::connect(addr).map_err(io)?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .map_err(io)?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).map_err(io)?;
    Ok(raw
        .lines()
        .find_map(|l| l.strip_prefix("larder_expert_bytes_read_total "))
        .and_then(|v| v.trim().parse().ok()))
}

/// What the clients send: text when the model has a tokenizer, else token
/// ids (a synthetic checkpoint has none).
#[derive(Clone, Copy)]
enum Prompts {
    Text,
    Ids { vocab: u32 },
}

impl Prompts {
    /// Client `i`'s prompt: a different one per client, about 16 tokens.
    fn get(self, i: usize) -> Value {
        const TOPICS: [&str; 8] = ["the sea", "a city", "bread", "winter", "a library", "rivers", "the moon", "trains"];
        match self {
            Prompts::Text => json!(format!(
                "Client {i} writes a long story about {}. Once upon a time",
                TOPICS[i % TOPICS.len()]
            )),
            Prompts::Ids { vocab } => {
                let ids: Vec<u32> = (0..16u64)
                    .map(|j| ((i as u64 * 7919 + j * 104_729 + 13) % u64::from(vocab.max(1))) as u32)
                    .collect();
                json!(ids)
            }
        }
    }
}

/// The median (the mean of the middle two for an even count; 0 when empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// C clients at once: one JSON row.
fn run_clients(addr: SocketAddr, prompts: Prompts, c: usize, max_new: usize) -> Result<Value> {
    let before = expert_bytes(addr)?;
    let start = Instant::now();
    let samples = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..c)
            .map(|i| sc.spawn(move || stream(addr, &prompts.get(i), max_new, &mut || {})))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| BenchError::Failed("a client thread panicked".into()))?)
            .collect::<Result<Vec<_>>>()
    })?;
    let wall = start.elapsed().as_secs_f64();
    let after = expert_bytes(addr)?;
    let tokens: u64 = samples.iter().map(|s| s.tokens).sum();
    // Aggregate decode rate: tokens after each client's first, over the span from the first TTFT to the end.
    let first = samples.iter().map(|s| s.ttft).min().unwrap_or_default().as_secs_f64();
    let decoded = tokens.saturating_sub(c as u64) as f64;
    let ttfts: Vec<f64> = samples.iter().map(|s| s.ttft.as_secs_f64() * 1e3).collect();
    let bytes = before.zip(after).map(|(b, a)| a.saturating_sub(b));
    Ok(json!({
        "clients": c,
        "tokens": tokens,
        "wall_s": wall,
        "aggregate_tok_s": if wall > first { decoded / (wall - first) } else { 0.0 },
        "per_client_tok_s_median": median(samples.iter().map(Sample::decode_rate).collect()),
        "ttft_ms_median": median(ttfts.clone()),
        "ttft_ms_max": ttfts.iter().copied().fold(0.0, f64::max),
        "expert_bytes_per_token": bytes.map(|b| b as f64 / tokens.max(1) as f64),
    }))
}

/// Client B's TTFT alone, then B started once A (asking for 4x as many tokens) has its first token.
fn second_client(addr: SocketAddr, prompts: Prompts, max_new: usize) -> Result<Value> {
    let alone = stream(addr, &prompts.get(101), max_new, &mut || {})?.ttft;
    let (tx, rx) = std::sync::mpsc::channel();
    let beside = std::thread::scope(|sc| -> Result<Duration> {
        let a = sc.spawn(move || {
            stream(addr, &prompts.get(100), max_new * 4, &mut || {
                let _ = tx.send(());
            })
        });
        rx.recv()
            .map_err(|_| BenchError::Failed("client A ended before its first token".into()))?;
        let b = stream(addr, &prompts.get(101), max_new, &mut || {})?.ttft;
        a.join().map_err(|_| BenchError::Failed("client A's thread panicked".into()))??;
        Ok(b)
    })?;
    Ok(json!({"ttft_alone_ms": alone.as_secs_f64() * 1e3, "ttft_beside_ms": beside.as_secs_f64() * 1e3}))
}

/// The experts and top-k of the model's first MoE layer (None: dense).
type RoutingShape = Option<(usize, usize)>;

/// The server with the model attached, the model's routing shape, and the
/// prompts its clients send.
fn start_server(opts: &ServeOptions, load: &EngineLoader) -> Result<(RunningServer, RoutingShape, Prompts)> {
    let config = ServerConfig {
        port: 0,
        served_name: "bench".into(),
        queue_depth: 1024,
        max_batch: opts.max_batch,
        ..ServerConfig::default()
    };
    let engine = load().map_err(BenchError::Load)?;
    let shape = routing_shape(&engine);
    let prompts = match engine.tokenizer() {
        Ok(_) => Prompts::Text,
        Err(_) => Prompts::Ids {
            vocab: u32::try_from(engine.model().spec().vocab_size).unwrap_or(u32::MAX),
        },
    };
    let server = bind(config).map_err(|e| BenchError::from(e).during("cannot start the server on a loopback port"))?;
    server.attach(engine);
    Ok((server, shape, prompts))
}

/// The routed experts' count and top-k of the model's first MoE layer.
fn routing_shape(engine: &larder_engine::Engine) -> RoutingShape {
    engine.model().spec().layers.iter().find_map(|l| match &l.ffn {
        larder_model::FfnSpec::Moe(m) => Some((m.num_experts, m.top_k)),
        larder_model::FfnSpec::Dense { .. } => None,
    })
}

/// Expert reads per route when `c` sequences route uniformly and
/// independently, `k` of `e` experts each, in one batched step.
fn uniform_reads_per_route(e: usize, k: usize, c: usize) -> f64 {
    let (e, k) = (e as f64, k as f64);
    e * (1.0 - (1.0 - k / e).powi(c as i32)) / (c as f64 * k)
}

/// One row per client count from its rounds: medians, the spread, the rounds.
fn summarise(c: usize, rounds: Vec<Value>, shape: RoutingShape) -> Value {
    let field = |k: &str| -> Vec<f64> { rounds.iter().filter_map(|r| r[k].as_f64()).collect() };
    let agg = field("aggregate_tok_s");
    let bytes = field("expert_bytes_per_token");
    json!({
        "clients": c,
        "tokens": rounds.iter().filter_map(|r| r["tokens"].as_u64()).sum::<u64>(),
        "wall_s": field("wall_s").iter().sum::<f64>(),
        "aggregate_tok_s": median(agg.clone()),
        "aggregate_tok_s_min": agg.iter().copied().fold(f64::INFINITY, f64::min),
        "aggregate_tok_s_max": agg.iter().copied().fold(0.0, f64::max),
        "per_client_tok_s_median": median(field("per_client_tok_s_median")),
        "ttft_ms_median": median(field("ttft_ms_median")),
        "ttft_ms_max": field("ttft_ms_max").into_iter().fold(0.0, f64::max),
        "expert_bytes_per_token": (!bytes.is_empty()).then(|| median(bytes)),
        "uniform_reads_per_route": shape.map(|(e, k)| uniform_reads_per_route(e, k, c)),
        "rounds": rounds,
    })
}

/// Loads the model the server serves (the CLI's loader: progress, errors naming the model).
pub type EngineLoader<'a> = dyn Fn() -> Result<larder_engine::Engine, BoxError> + 'a;

/// What `bench serve` measures.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The model, as named in the report.
    pub model: String,
    /// Concurrent client counts, comma-separated, each 1..=256.
    pub clients: String,
    /// Tokens each client asks for (greedy).
    pub max_new: usize,
    /// The server's --max-batch.
    pub max_batch: usize,
    /// Rounds over the client counts, in alternating order.
    pub repeats: usize,
}

/// Runs `bench serve`; its JSON document (`{"model", "max_new", "max_batch", "repeats", "runs", "second_client"}`).
pub fn run(opts: &ServeOptions, load: &EngineLoader, observer: &dyn Observer) -> Result<Value> {
    let counts = parse_clients(&opts.clients)?;
    let (server, shape, prompts) = start_server(opts, load)?;
    let addr = server.addr;
    // Warm-up: one short request (first-touch allocations, the expert cache's first fill).
    stream(addr, &prompts.get(0), 2, &mut || {})?;
    let arms = (counts.len() * opts.repeats) as u64;
    let progress = observer.task("bench serve", arms + 1, Unit::Count);
    let mut rounds: Vec<Vec<Value>> = vec![Vec::new(); counts.len()];
    for round in 0..opts.repeats {
        let order: Vec<usize> = if round % 2 == 0 {
            (0..counts.len()).collect()
        } else {
            (0..counts.len()).rev().collect()
        };
        for i in order {
            progress.set_message(&format!("{} clients (round {})", counts[i], round + 1));
            rounds[i].push(run_clients(addr, prompts, counts[i], opts.max_new)?);
            progress.inc(1);
        }
    }
    let runs: Vec<Value> = counts.iter().zip(rounds).map(|(&c, r)| summarise(c, r, shape)).collect();
    progress.set_message("second client's TTFT");
    let second = second_client(addr, prompts, opts.max_new)?;
    progress.finish();
    server.shutdown(Duration::from_secs(5));
    Ok(json!({"model": opts.model, "max_new": opts.max_new,
        "max_batch": opts.max_batch, "repeats": opts.repeats, "runs": runs, "second_client": second}))
}
