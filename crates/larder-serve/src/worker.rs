//! The server's side of the engine: the engine runs on larder-engine's
//! [`EngineHandle`] (its own thread and scheduler: batching, the KV budget,
//! prefix reuse, the disk tier, speculative decoding, route traces,
//! cancellation, warnings); this module maps a prepared request to a
//! [`Job`] and the job's events to [`Event`]s for the HTTP side, and bounds
//! the requests in the system ([`QueueSlot`]: 429 beyond `--queue-depth`).
//!
//! Jobs arrive prepared ([`crate::prepare`]: template, tokenization, prompt
//! checks and sampling happen in the HTTP handler, off the engine thread),
//! so a large prompt never stalls the requests already running. A request
//! holds its place in the queue from the moment it is accepted,
//! preparation included, until its [`JobEvents`] are dropped (it ended, or
//! its client left: dropping them also cancels the job at the engine's
//! next step). Engine errors reach the client without server file paths
//! (the server log has them, [`ApiError::generating`]).
//!
//! A request with `n` > 1 is `n` jobs decoded in the same batches
//! ([`Choices`]: their events merged, tagged by choice index), holding one
//! place in the queue; choice `i` samples with the request's seed plus `i`
//! (wrapping), so a seeded request is reproducible choice by choice, and
//! greedy choices are identical.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use larder_engine::{Drafting, Engine, EngineError, EngineHandle, Events, FinishReason, HandleConfig, Job};

use crate::api::{ApiError, GenerationRequest};
pub use crate::logprobs::Logprob;
use crate::prepare::{request_error, Prepared, Preparer};
use crate::tools::ChatReader;

/// What a request reports to the HTTP side.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Prompt accepted: its token count (always first).
    Started {
        prompt_tokens: usize,
    },
    /// New text (stop strings already removed; empty for a token that adds
    /// no text yet, so a streaming reply still writes to its socket).
    Text(String),
    /// A token's text (as `Text`) and its logprob, for a request that asked
    /// for logprobs.
    Scored {
        text: String,
        logprob: Logprob,
    },
    Done {
        finish_reason: &'static str,
        completion_tokens: usize,
        /// Prompt tokens whose KV state was reused from a kept conversation.
        cached_tokens: usize,
        /// The stop string that ended generation, if one did (Anthropic's
        /// `stop_sequence`).
        stop_sequence: Option<String>,
    },
    Failed(ApiError),
}

/// A place among the `depth` requests queued, preparing or running; given
/// back when dropped (the request ended, failed or its client left).
pub struct QueueSlot {
    in_system: Arc<AtomicUsize>,
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        self.in_system.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Counters only the server keeps (the engine's are [`EngineHandle::metrics`]).
#[derive(Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub rejected_full: AtomicU64,
}

/// How the engine side of the server runs.
#[derive(Clone, Default)]
pub struct WorkerConfig {
    /// Requests queued, preparing or running before 429 (at least 1).
    pub depth: usize,
    /// The drafter every request decodes speculatively with (off by default).
    pub drafting: Drafting,
    /// The engine thread's scheduler, disk tier and trace file.
    pub handle: HandleConfig,
}

/// The engine thread and the queue in front of it.
pub struct Worker {
    handle: EngineHandle,
    /// Requests preparing, queued or running.
    in_system: Arc<AtomicUsize>,
    depth: usize,
    pub metrics: Arc<Metrics>,
    pub context_len: usize,
    /// Prepares requests off the engine thread, sharing its tokenizer and template.
    preparer: Preparer,
    drafting: Drafting,
}

/// Where a reply reads its request's events from: a request's [`Choices`],
/// a job's [`JobEvents`], or any channel of [`Event`]s (the SSE fuzz target
/// feeds one).
pub trait EventSource: Send {
    /// The next event; `None` when no more will come.
    fn recv(&mut self) -> impl std::future::Future<Output = Option<Event>> + Send;

    /// The next event and the index of the choice it belongs to (always 0
    /// for a source of one choice).
    fn recv_choice(&mut self) -> impl std::future::Future<Output = Option<(usize, Event)>> + Send {
        async move { self.recv().await.map(|e| (0, e)) }
    }
}

/// The events of a request's `n` jobs, merged as they come, each tagged by
/// its choice index; dropping them cancels every job.
pub struct Choices {
    events: tokio::sync::mpsc::UnboundedReceiver<(usize, Event)>,
    /// A chat's output reader (reasoning, content, tool calls), shared by
    /// its choices.
    pub reader: Option<ChatReader>,
}

impl Choices {
    /// Forwards each job's events (a task per job, which drops the job,
    /// cancelling it, once these are dropped).
    fn merge(jobs: Vec<JobEvents>, reader: Option<ChatReader>) -> Choices {
        let (sender, events) = tokio::sync::mpsc::unbounded_channel();
        for (index, mut job) in jobs.into_iter().enumerate() {
            let sender = sender.clone();
            tokio::spawn(async move {
                loop {
                    let ev = tokio::select! {
                        ev = job.next_event() => ev,
                        _ = sender.closed() => return,
                    };
                    let Some(ev) = ev else { return };
                    let last = matches!(ev, Event::Done { .. } | Event::Failed(_));
                    if sender.send((index, ev)).is_err() || last {
                        return;
                    }
                }
            });
        }
        Choices { events, reader }
    }
}

impl EventSource for Choices {
    async fn recv(&mut self) -> Option<Event> {
        self.events.recv().await.map(|(_, e)| e)
    }

    async fn recv_choice(&mut self) -> Option<(usize, Event)> {
        self.events.recv().await
    }
}

impl EventSource for tokio::sync::mpsc::UnboundedReceiver<Event> {
    fn recv(&mut self) -> impl std::future::Future<Output = Option<Event>> + Send {
        tokio::sync::mpsc::UnboundedReceiver::recv(self)
    }
}

/// A job's events as the HTTP side reads them; dropping them cancels the
/// job and gives its queue slot back.
pub struct JobEvents {
    events: Events,
    /// The engine, whose tokenizer spells the tokens of logprobs.
    engine: Arc<Engine>,
    started: bool,
    /// The request's place in the queue (shared by its choices).
    _slot: Arc<QueueSlot>,
}

impl EventSource for JobEvents {
    fn recv(&mut self) -> impl std::future::Future<Output = Option<Event>> + Send {
        self.next_event()
    }
}

impl JobEvents {
    /// The next event: `Started` first, then text, then `Done` or `Failed`;
    /// `None` when the engine thread stopped without ending the request.
    async fn next_event(&mut self) -> Option<Event> {
        if !self.started {
            self.started = true;
            return Some(Event::Started {
                prompt_tokens: self.events.prompt_tokens(),
            });
        }
        Some(match self.events.recv().await? {
            larder_engine::Event::Token {
                text,
                logprob: Some(logprob),
                ..
            } => Event::Scored {
                text,
                logprob: Logprob::spelled(&self.engine, &logprob),
            },
            larder_engine::Event::Token { text, .. } | larder_engine::Event::Text(text) => Event::Text(text),
            larder_engine::Event::Done(outcome) => Event::Done {
                finish_reason: match outcome.finish_reason {
                    FinishReason::Length => "length",
                    _ => "stop",
                },
                completion_tokens: outcome.ids.len(),
                cached_tokens: outcome.cached_tokens,
                stop_sequence: outcome.stop_string,
            },
            larder_engine::Event::Failed(e) => Event::Failed(ApiError::generating(&e)),
        })
    }
}

impl Worker {
    /// Moves `engine` to its own thread as `config` says; an error when the
    /// engine thread or the preparation threads cannot start.
    pub fn start(engine: Engine, config: WorkerConfig) -> Result<Worker, EngineError> {
        let context_len = engine.model().spec().max_position_embeddings;
        let defaults = engine.generation_config().sampling_defaults();
        let handle = EngineHandle::start(engine, config.handle)?;
        let preparer = Preparer::new(handle.engine().clone(), defaults, crate::prepare::concurrency())
            .map_err(|e| EngineError::EngineThread(format!("cannot start its request preparation threads: {e}")))?;
        Ok(Worker {
            handle,
            in_system: Arc::new(AtomicUsize::new(0)),
            depth: config.depth.max(1),
            metrics: Arc::new(Metrics::default()),
            context_len,
            preparer,
            drafting: config.drafting,
        })
    }

    /// A place in the queue for a new request, or a 429 when the queue is full.
    pub fn reserve(&self) -> Result<QueueSlot, ApiError> {
        let before = self.in_system.fetch_add(1, Ordering::SeqCst);
        let slot = QueueSlot {
            in_system: self.in_system.clone(),
        };
        if before >= self.depth {
            drop(slot);
            self.metrics.rejected_full.fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::plain(
                429,
                "rate_limit_error",
                Some("queue_full"),
                format!("the server is busy ({} requests queued or running); retry shortly", self.depth),
            ));
        }
        self.metrics.requests.fetch_add(1, Ordering::Relaxed);
        Ok(slot)
    }

    /// Prepares `request` off the engine thread ([`crate::prepare`]); its
    /// errors are the client's answer.
    pub async fn prepare(&self, request: &GenerationRequest) -> Result<Prepared, ApiError> {
        self.preparer.prepare(request).await
    }

    /// Hands a prepared request to the engine as `n` jobs (choice `i`
    /// seeded with the seed plus `i`); a request the engine refuses (the
    /// KV budget, say) is a 400 before generation.
    pub fn submit(&self, slot: QueueSlot, prepared: Prepared, n: usize) -> Result<Choices, ApiError> {
        let slot = Arc::new(slot);
        let reader = prepared.reader.clone();
        let mut jobs = Vec::with_capacity(n);
        for i in 0..n {
            let mut p = prepared.clone();
            p.options.sampling.seed = p.options.sampling.seed.wrapping_add(i as u64);
            jobs.push(self.submit_one(slot.clone(), p)?);
        }
        Ok(Choices::merge(jobs, reader))
    }

    /// Hands one job to the engine (with a fresh drafter when drafting).
    fn submit_one(&self, slot: Arc<QueueSlot>, prepared: Prepared) -> Result<JobEvents, ApiError> {
        let Prepared {
            prompt,
            options,
            stop,
            adjust,
            logprobs,
            constraint,
            keep_special_tokens,
            ..
        } = prepared;
        let drafter = self
            .drafting
            .drafter()
            .map_err(|e| ApiError::internal("making the request's drafter", &e))?;
        let job = Job {
            prompt,
            options,
            stop,
            drafter,
            adjust,
            logprobs,
            constraint: constraint.map(|c| c.boxed()),
            keep_special_tokens,
            ..Job::default()
        };
        let events = self.handle.submit(job).map_err(|e| match e {
            EngineError::EngineThread(_) => ApiError::plain(503, "server_error", None, "the engine thread is not running"),
            e => request_error(&e),
        })?;
        Ok(JobEvents {
            events,
            engine: self.handle.engine().clone(),
            started: false,
            _slot: slot,
        })
    }

    /// Requests preparing, queued or running.
    pub fn queue_depth(&self) -> usize {
        self.in_system.load(Ordering::SeqCst)
    }

    /// What the engine thread is doing (sequences, KV bytes, tokens, the
    /// expert store's and the disk tier's counters).
    pub fn engine_metrics(&self) -> larder_engine::Metrics {
        self.handle.metrics()
    }

    /// Lets the jobs still in the engine end (a job whose client left is
    /// cancelled), then stops the engine thread; the trace file's last
    /// write failing is logged.
    pub fn stop(self) {
        if let Err(e) = self.handle.stop() {
            tracing::error!("{e}");
        }
    }
}
