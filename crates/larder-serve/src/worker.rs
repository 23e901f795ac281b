//! The engine thread: generation runs on one dedicated thread that owns the
//! engine, taking jobs FIFO from a bounded queue, so HTTP handling (and every
//! endpoint that does not generate) stays responsive while it works. Each job
//! streams [`Event`]s back; a client that goes away (its receiver dropped) or
//! a matched stop string cancels generation at the next token.
//!
//! The request loop itself is the engine's ([`larder_engine::Conversation`]):
//! the context-length check, stop strings, prefix reuse of the previous
//! request's state, and the drafter the server was started with; this
//! module turns its events into [`Event`]s.
//!
//! Sampling a request omits comes from the model's `generation_config.json`
//! ([`larder_engine::GenerationConfig::sampling_defaults`]); an unseeded
//! request draws a fresh seed. Engine errors are logged in full here and
//! reach the client without server file paths.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use larder_engine::{
    Conversation, Drafting, Engine, EngineError, FinishReason, GenerateOptions, Request, RequestEvent, SamplingParams, StoreStats,
};
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
    engine_stats: Arc<dyn Fn() -> Option<StoreStats> + Send + Sync>,
}

impl Worker {
    /// Moves `engine` to its own thread; at most `depth` jobs wait or run.
    pub fn start(engine: Engine, depth: usize) -> Worker {
        Self::start_with(engine, depth, Drafting::off())
    }

    /// [`start`](Self::start), every request drafting with `drafting`
    /// (speculative decoding: greedy output is unchanged).
    pub fn start_with(engine: Engine, depth: usize, drafting: Drafting) -> Worker {
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
                let ctx = JobContext { defaults, drafting };
                // The last request's conversation, kept for prefix reuse.
                let mut conversation = Conversation::new(&engine);
                for job in rx {
                    run_job(&engine, job, &m, &ctx, &mut conversation);
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
    pub fn store_stats(&self) -> Option<StoreStats> {
        (self.engine_stats)()
    }
}

/// What every job shares: the model's sampling defaults and the drafter.
struct JobContext {
    defaults: SamplingParams,
    drafting: Drafting,
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

fn run_job(engine: &Engine, job: Job, metrics: &Metrics, ctx: &JobContext, conversation: &mut Conversation) {
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
    let max_new = match engine.check_prompt(&prompt, request.max_tokens) {
        Ok(n) => n,
        Err(EngineError::Invalid { field, message }) => return fail(ApiError::invalid(field, message)),
        Err(e) => return fail(ApiError::invalid("prompt", e.to_string())),
    };
    let _ = events.send(Event::Started {
        prompt_tokens: prompt.len(),
    });
    metrics.prompt_tokens.fetch_add(prompt.len() as u64, Ordering::Relaxed);
    let opts = GenerateOptions {
        max_new,
        sampling: resolve_sampling(&request, &ctx.defaults),
        stop_at_eos: !request.ignore_eos,
        ..GenerateOptions::default()
    };
    let run = Request {
        prompt: &prompt,
        options: &opts,
        stop: &request.stop,
        drafting: &ctx.drafting,
        cancel: None,
    };
    let mut sink = |event: RequestEvent<'_>| match event {
        // Sent even when empty: a streaming reply then writes to the socket
        // every token, which is how a vanished client is noticed.
        RequestEvent::Token { text, .. } => events.send(Event::Text(text.to_string())).is_ok() && !events.is_closed(),
        RequestEvent::Text(text) => events.send(Event::Text(text.to_string())).is_ok(),
        RequestEvent::Finished(_) => true,
    };
    match conversation.run(engine, &run, &mut sink) {
        Ok(g) => {
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
                cached_tokens: g.cached_tokens,
            });
        }
        Err(e) => fail(ApiError::internal("generating", &e)),
    }
}
