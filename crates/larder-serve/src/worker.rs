//! The engine thread: generation runs on one dedicated thread that owns the
//! engine, taking jobs FIFO from a bounded queue, so HTTP handling (and every
//! endpoint that does not generate) stays responsive while it works. Each job
//! streams [`Event`]s back; a client that goes away (its receiver dropped) or
//! a matched stop string cancels generation at the next token.
//!
//! Sampling a request omits comes from the model's `generation_config.json`
//! ([`larder_engine::GenerationConfig::sampling_defaults`]); an unseeded
//! request draws a fresh seed. Engine errors are logged in full here and
//! reach the client without server file paths.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use larder_engine::{Engine, EngineError, FinishReason, GenerateOptions, SamplingParams, StreamDecoder};
use larder_model::KvCache;
use tokio::sync::mpsc::UnboundedSender;

use crate::api::{ApiError, GenerationRequest, Prompt};

/// What a job reports.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Prompt accepted: its token count.
    Started {
        prompt_tokens: usize,
    },
    /// New text (stop strings already removed).
    Text(String),
    Done {
        finish_reason: &'static str,
        completion_tokens: usize,
        /// Prompt tokens whose KV state was reused from the previous request.
        cached_tokens: usize,
    },
    Failed(ApiError),
}

struct Job {
    request: GenerationRequest,
    events: UnboundedSender<Event>,
}

/// Counters for `/metrics`.
#[derive(Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    pub rejected_full: AtomicU64,
    /// Last request's decode rate, f64 bits.
    pub last_decode_tok_per_s: AtomicU64,
}

/// A handle to the engine thread.
pub struct Worker {
    jobs: mpsc::SyncSender<Job>,
    /// Jobs queued or running.
    in_system: Arc<AtomicUsize>,
    depth: usize,
    pub metrics: Arc<Metrics>,
    pub context_len: usize,
    /// Sampling for the fields a request omits (from generation_config.json).
    pub defaults: SamplingParams,
    engine_stats: Arc<dyn Fn() -> Option<larder_store::StoreStats> + Send + Sync>,
}

impl Worker {
    /// Moves `engine` to its own thread; at most `depth` jobs wait or run.
    pub fn start(engine: Engine, depth: usize) -> Worker {
        let depth = depth.max(1);
        let (tx, rx) = mpsc::sync_channel::<Job>(depth);
        let in_system = Arc::new(AtomicUsize::new(0));
        let metrics = Arc::new(Metrics::default());
        let context_len = engine.model().spec().max_position_embeddings;
        let defaults = engine.generation_config().sampling_defaults();
        let engine = Arc::new(engine);
        let stats_engine = engine.clone();
        let engine_stats = Arc::new(move || stats_engine.store().map(|s| s.stats()));
        let (count, m) = (in_system.clone(), metrics.clone());
        std::thread::Builder::new()
            .name("larder-engine".into())
            .spawn(move || {
                let mut session = None;
                for job in rx {
                    run_job(&engine, job, &m, &defaults, &mut session);
                    count.fetch_sub(1, Ordering::SeqCst);
                }
            })
            .expect("spawn the engine thread");
        Worker {
            jobs: tx,
            in_system,
            depth,
            metrics,
            context_len,
            defaults,
            engine_stats,
        }
    }

    /// Queues a request, or refuses it when the queue is full.
    pub fn submit(&self, request: GenerationRequest, events: UnboundedSender<Event>) -> Result<(), ApiError> {
        let before = self.in_system.fetch_add(1, Ordering::SeqCst);
        if before >= self.depth {
            self.in_system.fetch_sub(1, Ordering::SeqCst);
            self.metrics.rejected_full.fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::plain(
                429,
                "rate_limit_error",
                Some("queue_full"),
                format!("the server is busy ({} requests queued or running); retry shortly", self.depth),
            ));
        }
        self.metrics.requests.fetch_add(1, Ordering::Relaxed);
        self.jobs.try_send(Job { request, events }).map_err(|_| {
            self.in_system.fetch_sub(1, Ordering::SeqCst);
            ApiError::plain(503, "server_error", None, "the engine thread is not running")
        })
    }

    /// Jobs queued or running.
    pub fn queue_depth(&self) -> usize {
        self.in_system.load(Ordering::SeqCst)
    }

    /// Expert store counters, when experts stream.
    pub fn store_stats(&self) -> Option<larder_store::StoreStats> {
        (self.engine_stats)()
    }
}

/// The KV state of the last request (its prompt and output), kept for
/// prefix reuse: a request whose tokens start the same way continues from it.
struct Session {
    tokens: Vec<u32>,
    cache: KvCache,
}

/// The sampling a request runs with: its own fields, else the model's
/// defaults; an unseeded request gets a fresh random seed.
pub fn resolve_sampling(request: &GenerationRequest, defaults: &SamplingParams) -> SamplingParams {
    SamplingParams {
        temperature: request.temperature.unwrap_or(defaults.temperature),
        top_p: request.top_p.unwrap_or(defaults.top_p),
        top_k: request.top_k.unwrap_or(defaults.top_k),
        seed: request.seed.unwrap_or_else(fresh_seed),
    }
}

/// A seed no earlier request used (std's per-instance random hasher keys).
fn fresh_seed() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now())
}

/// An engine error while preparing the prompt, as the client sees it:
/// the request's own faults are 400s; anything about the server's files is
/// a logged 500 whose message names no path.
fn prompt_error(e: &EngineError) -> ApiError {
    match e {
        EngineError::NoTokenizer { .. } => {
            tracing::warn!("refused a text request: {e}");
            ApiError::invalid(
                "prompt",
                "this model has no tokenizer.json, so text prompts and chats cannot be served; \
                 send token ids as `prompt` to /v1/completions",
            )
        }
        EngineError::NoChatTemplate { .. } => {
            tracing::warn!("refused a chat request: {e}");
            ApiError::invalid("messages", "this model has no chat template; use /v1/completions with a prompt")
        }
        EngineError::Tokenizer(_) | EngineError::Template(_) | EngineError::Invalid { .. } => ApiError::invalid("messages", e.to_string()),
        _ => ApiError::internal("preparing the prompt", e),
    }
}

fn run_job(engine: &Engine, job: Job, metrics: &Metrics, defaults: &SamplingParams, session: &mut Option<Session>) {
    let Job { request, events } = job;
    let fail = |e: ApiError| {
        let _ = events.send(Event::Failed(e));
    };
    let prompt = match &request.prompt {
        Prompt::Chat(messages) => {
            let msgs: Vec<larder_engine::ChatMessage> = messages.iter().map(|(r, c)| larder_engine::ChatMessage::new(r, c)).collect();
            engine.encode_chat(&msgs)
        }
        Prompt::Text(t) => engine.encode_prompt(t),
        Prompt::Ids(ids) => Ok(ids.clone()),
    };
    let prompt = match prompt {
        Ok(p) => p,
        Err(e) => return fail(prompt_error(&e)),
    };
    if let Err(e) = engine.model().check_ids(&prompt, 0) {
        return fail(ApiError::invalid("prompt", e.to_string()));
    }
    let room = engine.model().spec().max_position_embeddings.saturating_sub(prompt.len());
    let max_new = match request.max_tokens {
        Some(n) if n > room => {
            return fail(ApiError::invalid(
                "max_tokens",
                format!(
                    "max_tokens {n} plus the prompt's {} tokens exceed the model's context of {} tokens",
                    prompt.len(),
                    prompt.len() + room
                ),
            ))
        }
        Some(n) => n,
        None => room,
    };
    let _ = events.send(Event::Started {
        prompt_tokens: prompt.len(),
    });
    metrics.prompt_tokens.fetch_add(prompt.len() as u64, Ordering::Relaxed);
    let opts = GenerateOptions {
        max_new,
        sampling: resolve_sampling(&request, defaults),
        stop_at_eos: !request.ignore_eos,
        ..GenerateOptions::default()
    };
    let tok = engine.tokenizer().ok();
    let mut decoder = StreamDecoder::new();
    let mut stops = StopFilter::new(&request.stop);
    let stopped = AtomicBool::new(false);
    let (mut cache, cached) = match session.take() {
        Some(s) => {
            let common = s.tokens.iter().zip(&prompt).take_while(|(a, b)| a == b).count();
            (s.cache, common)
        }
        None => (engine.model().new_cache(), 0),
    };
    let result = engine.generate_cached(&prompt, &mut cache, cached, &opts, &mut |id| {
        let piece = match tok {
            Some(t) => decoder.push(t, id).ok().flatten().unwrap_or_default(),
            None => String::new(),
        };
        let (text, hit) = stops.push(&piece);
        // Sent even when empty: a streaming reply then writes to the socket
        // every token, which is how a vanished client is noticed.
        if events.send(Event::Text(text)).is_err() {
            return false; // the client is gone
        }
        if hit {
            stopped.store(true, Ordering::Relaxed);
            return false;
        }
        !events.is_closed()
    });
    match result {
        Ok(g) => {
            let fed: Vec<u32> = prompt.iter().chain(&g.ids).copied().take(cache.len()).collect();
            *session = Some(Session { tokens: fed, cache });
            let tail = stops.finish();
            if !tail.is_empty() {
                let _ = events.send(Event::Text(tail));
            }
            metrics.completion_tokens.fetch_add(g.ids.len() as u64, Ordering::Relaxed);
            metrics
                .last_decode_tok_per_s
                .store(g.stats.decode_tok_per_s.to_bits(), Ordering::Relaxed);
            let finish_reason = match g.finish_reason {
                FinishReason::Length => "length",
                _ => "stop",
            };
            let _ = events.send(Event::Done {
                finish_reason,
                completion_tokens: g.ids.len(),
                cached_tokens: g.stats.cached_tokens,
            });
        }
        Err(e) => fail(ApiError::internal("generating", &e)),
    }
}

/// Removes stop strings from streamed text: text that could still be the
/// start of a stop string is held back until it cannot.
pub struct StopFilter {
    stops: Vec<String>,
    held: String,
    done: bool,
}

impl StopFilter {
    pub fn new(stops: &[String]) -> Self {
        StopFilter {
            stops: stops.to_vec(),
            held: String::new(),
            done: false,
        }
    }

    /// Adds generated text; returns the text safe to emit, and whether a stop string matched.
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        if self.done {
            return (String::new(), true);
        }
        self.held.push_str(piece);
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            self.done = true;
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, true);
        }
        // Hold back the longest suffix that is a prefix of a stop string.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| (1..s.len()).filter(|&n| s.is_char_boundary(n)).map(move |n| &s[..n]))
            .filter(|p| self.held.ends_with(p))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, false)
    }

    /// Text held back at the end of generation (no stop string followed).
    pub fn finish(&mut self) -> String {
        if self.done {
            String::new()
        } else {
            std::mem::take(&mut self.held)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_are_cut_across_pieces() {
        let mut f = StopFilter::new(&["END".to_string()]);
        assert_eq!(f.push("hello E"), ("hello ".to_string(), false));
        assert_eq!(f.push("N"), (String::new(), false));
        assert_eq!(f.push("D more"), (String::new(), true));
        let mut f = StopFilter::new(&["END".to_string()]);
        assert_eq!(f.push("hello EN"), ("hello ".to_string(), false));
        assert_eq!(f.push("x"), ("ENx".to_string(), false));
        assert_eq!(f.finish(), "");
        let mut f = StopFilter::new(&[]);
        assert_eq!(f.push("abc"), ("abc".to_string(), false));
    }
}
