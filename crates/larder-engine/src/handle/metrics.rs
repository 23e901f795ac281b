//! What the engine thread is doing, for metrics endpoints and embedders:
//! counters it updates after every step ([`Shared`]) and the snapshot a
//! caller takes ([`Metrics`]).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use larder_store::StoreStats;

use crate::engine::Engine;
use crate::request::Outcome;
use crate::scheduler::{DiskTierStats, Scheduler, StepReport};

/// A snapshot of the engine thread's work.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    /// Sequences running (decoding or prefilling).
    pub running: usize,
    /// Jobs waiting for a place in the batch (preempted ones included).
    pub waiting: usize,
    /// Sequences in the last step's batch.
    pub last_batch: usize,
    /// Bytes of sequence state (KV, snapshots) held by running and queued sequences.
    pub kv_bytes_in_use: usize,
    /// Bytes of the conversations kept for prefix reuse.
    pub kv_bytes_kept: usize,
    /// Conversations kept for prefix reuse.
    pub kept_conversations: usize,
    /// Sequences preempted so far (their output is unchanged).
    pub preemptions: u64,
    /// Jobs accepted so far, and their prompt tokens.
    pub jobs: u64,
    pub prompt_tokens: u64,
    /// Tokens generated so far, over every job.
    pub completion_tokens: u64,
    /// Tokens generated per second over the last second or so of steps (0 when idle).
    pub tok_per_s: f64,
    /// The decode rate of the last job that ended.
    pub last_decode_tok_per_s: f64,
    /// The expert store's counters (`None` when every expert is in RAM).
    pub store: Option<StoreStats>,
    /// The disk tier's counters (`None` without one).
    pub disk_tier: Option<DiskTierStats>,
}

/// How long the window of [`Metrics::tok_per_s`] lasts.
const RATE_WINDOW: Duration = Duration::from_secs(1);

/// Tokens generated in the current window, and the last window's rate.
#[derive(Debug)]
struct Rate {
    since: Instant,
    tokens: u64,
    per_s: f64,
}

impl Default for Rate {
    fn default() -> Self {
        Rate {
            since: Instant::now(),
            tokens: 0,
            per_s: 0.0,
        }
    }
}

/// The counters the engine thread updates and callers read.
#[derive(Debug, Default)]
pub(super) struct Shared {
    /// Set when the handle is dropped: every job is cancelled.
    pub cancel_all: AtomicBool,
    running: AtomicUsize,
    waiting: AtomicUsize,
    last_batch: AtomicUsize,
    kv_bytes: AtomicUsize,
    kv_kept_bytes: AtomicUsize,
    kept_conversations: AtomicUsize,
    preemptions: AtomicU64,
    jobs: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    last_decode_tok_per_s: AtomicU64,
    rate: Mutex<Rate>,
    disk: Mutex<Option<DiskTierStats>>,
}

impl Shared {
    /// A job of `prompt_tokens` was accepted.
    pub(super) fn accepted(&self, prompt_tokens: usize) {
        self.jobs.fetch_add(1, Ordering::Relaxed);
        self.prompt_tokens.fetch_add(prompt_tokens as u64, Ordering::Relaxed);
    }

    /// A job ended with `outcome`.
    pub(super) fn ended(&self, outcome: &Outcome) {
        self.completion_tokens.fetch_add(outcome.ids.len() as u64, Ordering::Relaxed);
        self.last_decode_tok_per_s
            .store(outcome.stats.decode_tok_per_s.to_bits(), Ordering::Relaxed);
    }

    /// After a step: what the scheduler holds now and what the step made.
    pub(super) fn stepped(&self, sched: &Scheduler<'_>, report: &StepReport) {
        self.last_batch.store(report.batch, Ordering::Relaxed);
        self.running.store(sched.running(), Ordering::Relaxed);
        self.waiting.store(sched.queued(), Ordering::Relaxed);
        self.kv_bytes.store(sched.state_bytes(), Ordering::Relaxed);
        self.kv_kept_bytes.store(sched.kept_bytes(), Ordering::Relaxed);
        self.kept_conversations.store(sched.kept_conversations(), Ordering::Relaxed);
        self.preemptions.store(sched.preemptions(), Ordering::Relaxed);
        if let Ok(mut rate) = self.rate.lock() {
            rate.tokens += report.tokens as u64;
            let window = rate.since.elapsed();
            if sched.is_idle() || window >= RATE_WINDOW {
                rate.per_s = if sched.is_idle() {
                    0.0
                } else {
                    rate.tokens as f64 / window.as_secs_f64()
                };
                rate.since = Instant::now();
                rate.tokens = 0;
            }
        }
        self.set_disk(sched.disk_stats());
    }

    pub(super) fn set_disk(&self, stats: Option<DiskTierStats>) {
        if let Ok(mut d) = self.disk.lock() {
            *d = stats;
        }
    }

    /// The counters now, with `engine`'s store counters.
    pub(super) fn snapshot(&self, engine: &Engine) -> Metrics {
        Metrics {
            running: self.running.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Relaxed),
            last_batch: self.last_batch.load(Ordering::Relaxed),
            kv_bytes_in_use: self.kv_bytes.load(Ordering::Relaxed),
            kv_bytes_kept: self.kv_kept_bytes.load(Ordering::Relaxed),
            kept_conversations: self.kept_conversations.load(Ordering::Relaxed),
            preemptions: self.preemptions.load(Ordering::Relaxed),
            jobs: self.jobs.load(Ordering::Relaxed),
            prompt_tokens: self.prompt_tokens.load(Ordering::Relaxed),
            completion_tokens: self.completion_tokens.load(Ordering::Relaxed),
            tok_per_s: self.rate.lock().map_or(0.0, |r| r.per_s),
            last_decode_tok_per_s: f64::from_bits(self.last_decode_tok_per_s.load(Ordering::Relaxed)),
            store: engine.store().map(|s| s.stats()),
            disk_tier: self.disk.lock().ok().and_then(|d| d.clone()),
        }
    }
}
