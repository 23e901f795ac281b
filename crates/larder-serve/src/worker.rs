//! The engine thread: generation runs on one dedicated thread that owns the
//! engine, taking jobs FIFO from a bounded queue, so HTTP handling (and every
//! endpoint that does not generate) stays responsive while it works. Each job
//! streams [`Event`]s back; a client that goes away (its receiver dropped) or
//! a matched stop string cancels generation at the next step.
//!
//! Without a drafter the thread runs the engine's [`Scheduler`]: up to
//! `max_batch` requests decode together in one batched forward pass per step
//! (each bit-identical to running alone), jobs that arrive are admitted
//! between steps, more wait in the scheduler's queue, and the KV budget
//! refuses a request that could never fit (400 on `max_tokens`, before
//! generation); under the budget the scheduler preempts and recomputes
//! sequences, which changes no output. With a
//! drafter every request runs alone through [`Conversation::run`]
//! (speculative verification is not batched). Either way the engine does the
//! context check, stop strings and prefix reuse (with the scheduler, of
//! several finished conversations; with a drafter, of the last request's);
//! this module turns its events into [`Event`]s.
//!
//! Jobs arrive prepared ([`crate::prepare`]: template, tokenization, prompt
//! checks and sampling happen in the HTTP handler, off this thread), so a
//! large prompt never stalls the requests already running. A job holds its
//! place in the queue ([`QueueSlot`]) from the moment its request is
//! accepted, preparation included, until it ends. Engine errors are logged
//! in full here and reach the client without server file paths.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use larder_engine::{
    Conversation, DiskTierConfig, DiskTierStats, Drafting, Engine, FinishReason, Outcome, Phase, Request, RequestEvent, RouteLog,
    RouteTrace, RowTag, Scheduler, SchedulerConfig, StoreStats,
};
use tokio::sync::mpsc::UnboundedSender;

use crate::api::{ApiError, GenerationRequest};
use crate::prepare::{request_error, Prepared, Preparer};
use crate::trace::{TraceConfig, TraceFile};

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

/// A prepared request on its way to the engine thread.
struct Job {
    prepared: Prepared,
    events: UnboundedSender<Event>,
    slot: QueueSlot,
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
    /// Sequences in the batch now (decoding or prefilling).
    pub running: AtomicUsize,
    /// Requests waiting for a place in the batch.
    pub waiting: AtomicUsize,
    /// Bytes of sequence state (KV) held by running sequences.
    pub kv_bytes: AtomicUsize,
    /// Bytes of the conversations kept for prefix reuse.
    pub kv_kept_bytes: AtomicUsize,
    /// Conversations kept for prefix reuse.
    pub kept_conversations: AtomicUsize,
    /// Sequences preempted so far (state dropped to fit the KV budget, to be
    /// recomputed; their output is unchanged).
    pub preemptions: AtomicU64,
    /// Sequences in the last step's batch.
    pub last_batch: AtomicUsize,
    /// The disk tier's counters (`None` until a step ran with one).
    pub disk: std::sync::Mutex<Option<DiskTierStats>>,
}

/// A handle to the engine thread.
pub struct Worker {
    jobs: mpsc::SyncSender<Job>,
    /// Requests preparing, queued or running.
    in_system: Arc<AtomicUsize>,
    depth: usize,
    pub metrics: Arc<Metrics>,
    pub context_len: usize,
    /// Prepares requests off the engine thread, sharing its tokenizer and template.
    preparer: Preparer,
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
        Self::start_batched(engine, depth, drafting, SchedulerConfig::default())
    }

    /// [`start_with`](Self::start_with), batching as `batching` says
    /// (`max_batch`, `kv_budget`) when there is no drafter.
    pub fn start_batched(engine: Engine, depth: usize, drafting: Drafting, batching: SchedulerConfig) -> Worker {
        Self::start_batched_with(engine, depth, drafting, batching, None, None)
    }

    /// [`start_batched`](Self::start_batched), keeping finished
    /// conversations on disk too when `disk` is given (the scheduler's disk
    /// tier; a folder that fails to open is logged and the server runs
    /// without it: `larder serve` checks it before loading), and recording
    /// every pass's routes into a trace file when `trace` is given
    /// ([`crate::trace`]).
    pub fn start_batched_with(
        engine: Engine,
        depth: usize,
        drafting: Drafting,
        batching: SchedulerConfig,
        disk: Option<DiskTierConfig>,
        trace: Option<TraceConfig>,
    ) -> Worker {
        let depth = depth.max(1);
        let (tx, rx) = mpsc::sync_channel::<Job>(depth);
        let in_system = Arc::new(AtomicUsize::new(0));
        let metrics = Arc::new(Metrics::default());
        let context_len = engine.model().spec().max_position_embeddings;
        let defaults = engine.generation_config().sampling_defaults();
        let engine = Arc::new(engine);
        let preparer =
            Preparer::new(engine.clone(), defaults, crate::prepare::concurrency()).expect("spawn the request preparation threads");
        let stats_engine = engine.clone();
        let engine_stats = Arc::new(move || stats_engine.store().map(|s| s.stats()));
        let (count, m) = (in_system.clone(), metrics.clone());
        std::thread::Builder::new()
            .name("larder-engine".into())
            .spawn(move || {
                let mut routes = trace.and_then(|t| TraceFile::open(t, &engine));
                if drafting.is_off() {
                    let setup = Setup { batching, disk, routes };
                    batched_loop(&engine, &rx, &m, setup);
                    return;
                }
                // The last request's conversation, kept for prefix reuse.
                let mut conversation = Conversation::new(&engine);
                for (seq, job) in rx.iter().enumerate() {
                    let recorded = run_job(&engine, job, &m, &drafting, &mut conversation, routes.as_ref().map(|(_, log)| log));
                    if let (Some((file, log)), Some((rt, cached, prompt))) = (routes.as_mut(), recorded) {
                        log.append(&rt, |row| RowTag {
                            seq,
                            pos: cached + row,
                            phase: if cached + row < prompt { Phase::Prompt } else { Phase::Decode },
                        });
                        file.maybe_write(log, count.load(Ordering::SeqCst) == 0);
                    }
                }
                if let Some((file, log)) = &mut routes {
                    file.write(log);
                }
            })
            .expect("spawn the engine thread");
        Worker {
            jobs: tx,
            in_system,
            depth,
            metrics,
            context_len,
            preparer,
            engine_stats,
        }
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

    /// Hands a prepared request to the engine thread; its events go to `events`.
    pub fn submit(&self, slot: QueueSlot, prepared: Prepared, events: UnboundedSender<Event>) -> Result<(), ApiError> {
        self.jobs
            .try_send(Job { prepared, events, slot })
            .map_err(|_| ApiError::plain(503, "server_error", None, "the engine thread is not running"))
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

/// What a finished request reports: counters, then `Done`.
fn done(outcome: &Outcome, metrics: &Metrics, events: &UnboundedSender<Event>) {
    metrics.completion_tokens.fetch_add(outcome.ids.len() as u64, Ordering::Relaxed);
    metrics
        .last_decode_tok_per_s
        .store(outcome.stats.decode_tok_per_s.to_bits(), Ordering::Relaxed);
    let finish_reason = match outcome.finish_reason {
        FinishReason::Length => "length",
        _ => "stop",
    };
    let _ = events.send(Event::Done {
        finish_reason,
        completion_tokens: outcome.ids.len(),
        cached_tokens: outcome.cached_tokens,
    });
}

/// Runs one request alone (with the drafter); with `routes`, returns what
/// it recorded (its routes, the prompt positions it reused, the prompt's
/// length).
fn run_job(
    engine: &Engine,
    job: Job,
    metrics: &Metrics,
    drafting: &Drafting,
    conversation: &mut Conversation,
    routes: Option<&RouteLog>,
) -> Option<(RouteTrace, usize, usize)> {
    // The slot is given back when this returns.
    let Job {
        prepared: Prepared { prompt, options, stop },
        events,
        slot: _slot,
    } = job;
    let _ = events.send(Event::Started {
        prompt_tokens: prompt.len(),
    });
    metrics.prompt_tokens.fetch_add(prompt.len() as u64, Ordering::Relaxed);
    let run = Request {
        prompt: &prompt,
        options: &options,
        stop: &stop,
        drafting,
        cancel: None,
    };
    let mut sink = |event: RequestEvent<'_>| match event {
        // Sent even when empty: a streaming reply then writes to the socket
        // every token, which is how a vanished client is noticed.
        RequestEvent::Token { text, .. } => events.send(Event::Text(text.to_string())).is_ok() && !events.is_closed(),
        RequestEvent::Text(text) => events.send(Event::Text(text.to_string())).is_ok(),
        RequestEvent::Finished(_) => true,
    };
    let mut recorder = routes.map(RouteLog::recorder);
    // The prompt positions reused from the last request (the first recorded row's position).
    let mut reused = 0;
    match conversation.run_traced(engine, &run, &mut sink, recorder.as_mut()) {
        Ok(g) => {
            reused = g.cached_tokens;
            done(&g, metrics, &events);
        }
        Err(e) => {
            let _ = events.send(Event::Failed(ApiError::generating(&e)));
        }
    }
    for w in engine.take_warnings() {
        tracing::warn!("{w}");
    }
    recorder.map(|rt| (rt, reused, prompt.len()))
}

/// A request in the scheduler: where its events go, its cancel flag and
/// its place in the queue (given back when it is dropped).
struct Live {
    events: UnboundedSender<Event>,
    cancel: Arc<AtomicBool>,
    _slot: QueueSlot,
}

/// What the batched loop starts its scheduler with.
struct Setup {
    batching: SchedulerConfig,
    disk: Option<DiskTierConfig>,
    routes: Option<(TraceFile, RouteLog)>,
}

/// The engine thread without a drafter: admits jobs between scheduler
/// steps, cancels requests whose client left, reports failures.
fn batched_loop(engine: &Engine, rx: &mpsc::Receiver<Job>, metrics: &Arc<Metrics>, setup: Setup) {
    let Setup {
        batching: config,
        disk,
        routes,
    } = setup;
    let config = SchedulerConfig {
        max_batch: config.max_batch.max(1),
        prefill_chunk: config.prefill_chunk.max(1),
        ..config
    };
    let Ok(mut sched) = Scheduler::new(engine, config) else { return };
    if let Some(disk) = disk {
        let dir = disk.dir.clone();
        match sched.attach_disk_tier(disk) {
            Ok(()) => {
                if let Ok(mut d) = metrics.disk.lock() {
                    *d = sched.disk_stats();
                }
            }
            Err(e) => tracing::error!("state dir {}: {e}; conversations are kept in RAM only", dir.display()),
        }
    }
    for w in sched.take_disk_warnings() {
        tracing::warn!("{w}");
    }
    let mut file = routes.map(|(file, log)| {
        sched.record_routes(log);
        file
    });
    let mut live: HashMap<u64, Live> = HashMap::new();
    loop {
        if let (Some(f), Some(log)) = (file.as_mut(), sched.routes()) {
            f.maybe_write(log, sched.is_idle());
        }
        if sched.is_idle() {
            // Nothing to do: block until a job arrives (or the server stops).
            match rx.recv() {
                Ok(job) => admit(&mut sched, &mut live, job, metrics),
                Err(_) => {
                    if let (Some(f), Some(log)) = (file.as_mut(), sched.routes()) {
                        f.write(log);
                    }
                    return;
                }
            }
        }
        while let Ok(job) = rx.try_recv() {
            admit(&mut sched, &mut live, job, metrics);
        }
        for l in live.values() {
            if l.events.is_closed() {
                l.cancel.store(true, Ordering::Relaxed);
            }
        }
        let report = sched.step();
        for id in report.finished {
            live.remove(&id);
        }
        for f in report.failed {
            if let Some(l) = live.remove(&f.id) {
                let _ = l.events.send(Event::Failed(ApiError::generating(&f.error)));
            }
        }
        metrics.last_batch.store(report.batch, Ordering::Relaxed);
        metrics.running.store(sched.running(), Ordering::Relaxed);
        metrics.waiting.store(sched.queued(), Ordering::Relaxed);
        metrics.kv_bytes.store(sched.state_bytes(), Ordering::Relaxed);
        metrics.kv_kept_bytes.store(sched.kept_bytes(), Ordering::Relaxed);
        metrics.kept_conversations.store(sched.kept_conversations(), Ordering::Relaxed);
        metrics.preemptions.store(sched.preemptions(), Ordering::Relaxed);
        for w in sched.take_disk_warnings().into_iter().chain(engine.take_warnings()) {
            tracing::warn!("{w}");
        }
        if let (Some(stats), Ok(mut d)) = (sched.disk_stats(), metrics.disk.lock()) {
            *d = Some(stats);
        }
    }
}

/// Hands `job` to the scheduler, or answers it at once when it is refused
/// (its slot is then given back).
fn admit(sched: &mut Scheduler<'_>, live: &mut HashMap<u64, Live>, job: Job, metrics: &Arc<Metrics>) {
    let Job {
        prepared: Prepared { prompt, options, stop },
        events,
        slot,
    } = job;
    let prompt_tokens = prompt.len();
    let cancel = Arc::new(AtomicBool::new(false));
    let (tx, m) = (events.clone(), metrics.clone());
    let sink = move |event: RequestEvent<'_>| match event {
        // Sent even when empty: a streaming reply then writes to the socket
        // every token, which is how a vanished client is noticed.
        RequestEvent::Token { text, .. } => tx.send(Event::Text(text.to_string())).is_ok() && !tx.is_closed(),
        RequestEvent::Text(text) => tx.send(Event::Text(text.to_string())).is_ok(),
        RequestEvent::Finished(outcome) => {
            done(outcome, &m, &tx);
            true
        }
    };
    let job = larder_engine::Job {
        prompt,
        options,
        stop,
        cancel: Some(cancel.clone()),
        sink: Box::new(sink),
    };
    // Started goes first: the scheduler may finish the request in its next step.
    match sched.submit(job) {
        Ok(id) => {
            let _ = events.send(Event::Started { prompt_tokens });
            metrics.prompt_tokens.fetch_add(prompt_tokens as u64, Ordering::Relaxed);
            live.insert(
                id,
                Live {
                    events,
                    cancel,
                    _slot: slot,
                },
            );
        }
        Err(e) => {
            let _ = events.send(Event::Failed(request_error(&e)));
        }
    }
}
