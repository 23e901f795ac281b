//! The [`Scheduler`]: the one generation path. Many sequences decode
//! together, each bit-identical to running alone; `larder run`,
//! [`Engine::generate`], [`Engine::run`] and the server (through the
//! [`EngineHandle`](crate::EngineHandle)) all go through it.
//!
//! It owns every admitted sequence (its model state, its seeded [`Sampler`],
//! stop filter, token budget, drafter and event sink) and advances them in
//! steps. Each [`step`](Scheduler::step) runs one `forward_batch` over every
//! running sequence: for a decoding sequence its last token, plus, when it
//! drafts (speculative decoding, `speculation` module), its guesses for the
//! pass to verify; for a sequence still prefilling, the next of the equal
//! passes of at most `prefill_chunk` tokens its prompt is cut into, so a
//! long new prompt never stalls the running streams for more than one
//! chunk. The model's batch invariance makes each sequence's logits
//! identical to running it alone, and each sequence samples (and accepts
//! drafts) with its own generator in the order a solo run does, so its
//! tokens are identical too, in any arrival order and at any batch size.
//!
//! **Queue.** At most `max_batch` sequences run; more wait in a FIFO queue.
//!
//! **KV budget** (`kv_budget`): the bytes of every sequence's state plus the
//! prefix cache's never exceed it (per position: every layer's keys and
//! values, f32; per sequence: recurrent layers' fixed-size states, and the
//! snapshots kept to return to, below; the allocator's slack is not
//! counted).
//! - A request whose worst case alone, `fixed + (prompt + max_new) x bytes
//!   per position`, exceeds the budget is refused at [`submit`](Scheduler::submit)
//!   with [`EngineError::KvBudget`], before anything runs. So any one
//!   sequence always fits alone (drafts never run past `max_new`).
//! - Admission is optimistic (as vLLM's): the queue's front is admitted when
//!   what the running sequences will hold after this step (each one's
//!   positions plus its rows this step) plus the newcomer's first chunk fit;
//!   prefix-cache entries are evicted (least recently used first) to make
//!   that room. It never preempts to admit.
//! - Preemption (recompute mode): before each forward pass, while the step's
//!   need exceeds the budget, the prefix cache is evicted first, then the
//!   most recently admitted running sequence (LIFO) is preempted: its state
//!   is dropped and it goes back to the **front** of the queue. Readmitted,
//!   it feeds `prompt ++ generated ids` again in chunks (a drafting sequence
//!   all but its pending token, which it then verifies as it would have) and
//!   goes on with its own untouched sampler and drafter: exactly what its
//!   next step would have computed, so its output stays bit-identical and
//!   its sink sees no token twice. The last running sequence is never
//!   preempted, so the oldest admitted one always advances and finishes: no
//!   livelock. [`preemptions`](Scheduler::preemptions) counts them; a step's
//!   [`StepReport::preempted`] names them.
//!
//! **Prefix cache** (`prefix_cache`, the `prefix_cache` module): finished and
//! cancelled conversations are kept, at most `prefix_cache` of them, LRU.
//! On admission a sequence reuses the entry sharing the longest prefix with
//! what it must feed (always feeding at least its last token again), taking
//! the entry over when it reuses all of it and getting a copy rolled back to
//! the shared length when it reuses a part (so a shared system prompt stays
//! for the next conversation). The result is bit-identical to a fresh
//! prefill; `Outcome::cached_tokens` says how many prompt tokens were
//! reused. Cached states count against the KV budget and are evicted before
//! any sequence is preempted.
//!
//! **Snapshots** (models whose state cannot roll back: a recurrent layer,
//! Kimi Linear's KDA; `crate::return_points`). A KV-only sequence goes back
//! to any earlier length by truncation and keeps none. A recurrent one
//! snapshots its prompt minus the last token inside the pass that crosses
//! it (`SequenceState::mark_after`), the point a later request sharing the
//! prompt returns to from the prefix cache. The end of a sequence needs no
//! snapshot: the cached entry is that state. A snapshot is taken only when
//! it fits the budget with everything else; under pressure, running
//! sequences' snapshots are dropped after the prefix cache is evicted and
//! before any preemption. A verification pass's own snapshot (to rewind
//! rejected drafts) lives for that step only.
//!
//! **Disk tier** ([`attach_disk_tier`](Scheduler::attach_disk_tier),
//! `disk_tier` module): finished conversations are also written to a folder
//! under a byte quota; a request whose feed shares a longer prefix with a
//! file than with anything in RAM loads it (same reuse rules, bit-identical
//! logits), also after a restart. Loaded states count against the KV budget
//! like any other.
//!
//! **Routes** ([`record_routes`](Scheduler::record_routes), `serve --trace`):
//! every successful pass appends its rows' routes to a [`RouteLog`], each
//! row tagged with its request's id and position; a failed pass adds
//! nothing. A request may also record its own ([`Job::record_routes`]).
//!
//! Cancelled sequences (their sink says so, or refuses an event) are retired
//! at the next step in any phase (queued, prefilling, decoding, preempted
//! and queued); when nothing runs or waits, [`state_bytes`](Scheduler::state_bytes) is 0.
//!
//! Files: `admission` (queue, budget, preemption, snapshots, retiring),
//! `pass` (the forward pass and its failures), `sequence`, `speculation`, `verify`,
//! `prefix_cache`, `disk_tier`, `identity`.

mod admission;
mod disk_tier;
mod identity;
mod pass;
mod prefix_cache;
mod sequence;
mod speculation;
mod verify;

use std::collections::VecDeque;

use larder_model::LayerState;

use crate::engine::{Engine, FinishReason};
use crate::error::EngineError;
use crate::request::{Job, RequestSink, StopFilter};
use crate::route_log::RouteLog;
use crate::sampling::Sampler;
use disk_tier::DiskTier;
pub use disk_tier::{check_state_dir, default_state_quota, DiskTierConfig, DiskTierStats};
use pass::PassOut;
use prefix_cache::PrefixCache;
use sequence::{sample_one, Seq};

/// Limits of a [`Scheduler`].
#[derive(Debug, Clone, Copy)]
pub struct SchedulerConfig {
    /// Most sequences running (decoding or prefilling) at once.
    pub max_batch: usize,
    /// Most prompt tokens one sequence prefills per step; never more than
    /// the engine's [`prefill_rows`](crate::Engine::prefill_rows) (its
    /// activation bound). Default: as many as that allows, so a prompt is
    /// read-once ([`crate::prefill`]); smaller values let running streams
    /// advance between chunks of a long prompt.
    pub prefill_chunk: usize,
    /// Bytes of all sequence states and the prefix cache together (`None`: unbounded).
    pub kv_budget: Option<usize>,
    /// Most finished conversations kept for prefix reuse (0: none).
    pub prefix_cache: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_batch: 8,
            prefill_chunk: usize::MAX,
            kv_budget: None,
            prefix_cache: 8,
        }
    }
}

/// A request that failed during a step (it has been removed).
#[derive(Debug)]
pub struct Failure {
    pub id: u64,
    pub error: EngineError,
}

/// What one step did.
#[derive(Debug, Default)]
pub struct StepReport {
    /// Sequences in the step's forward pass.
    pub batch: usize,
    /// Tokens chosen this step (over every sequence).
    pub tokens: usize,
    /// Requests that ended this step (finished or cancelled), by id.
    pub finished: Vec<u64>,
    /// Requests that failed this step; their sinks got no `Finished` event.
    pub failed: Vec<Failure>,
    /// Requests preempted this step (state dropped, queued again), by id.
    pub preempted: Vec<u64>,
}

/// Bytes of sequence state a model's requests take: per position and per
/// sequence whatever its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCosts {
    /// Bytes of model state one position takes in every layer.
    pub bytes_per_token: usize,
    /// Bytes every sequence holds whatever its length (recurrent layers'
    /// fixed-size states, both buffers; 0 for a KV-only model).
    pub bytes_per_sequence: usize,
}

impl KvCosts {
    /// What `engine`'s model's sequences cost.
    pub fn of(engine: &Engine) -> KvCosts {
        let fresh = engine.model().new_state();
        KvCosts {
            bytes_per_token: (0..fresh.num_layers())
                .filter_map(|l| fresh.layer(l))
                .map(LayerState::bytes_per_position)
                .sum(),
            bytes_per_sequence: fresh.bytes(),
        }
    }

    /// Checks `job` against `engine` and a KV budget before it is queued:
    /// the prompt (non-empty, ids in the vocabulary), `max_new` within the
    /// context, sampling, stop strings, and its worst case within the
    /// budget ([`EngineError::KvBudget`]). Returns the new tokens it may make.
    pub fn check(&self, engine: &Engine, job: &Job, kv_budget: Option<usize>) -> Result<usize, EngineError> {
        if job.prompt.is_empty() {
            return Err(EngineError::Invalid {
                field: "prompt",
                message: "is empty: at least one token is needed".into(),
            });
        }
        let max_new = engine.check_prompt(&job.prompt, Some(job.options.max_new))?;
        job.options.sampling.validate()?;
        job.adjust.validate(engine.model().spec().vocab_size)?;
        if let Some(top) = job.logprobs.filter(|&n| n > crate::MAX_TOP_LOGPROBS) {
            return Err(EngineError::Invalid {
                field: "top_logprobs",
                message: format!("{top} is over the most, {}", crate::MAX_TOP_LOGPROBS),
            });
        }
        StopFilter::new(&job.stop)?;
        let needed = self.bytes_per_sequence + (job.prompt.len() + max_new) * self.bytes_per_token;
        if let Some(budget) = kv_budget.filter(|&b| needed > b) {
            return Err(EngineError::KvBudget {
                needed,
                budget,
                prompt_tokens: job.prompt.len(),
                max_new,
            });
        }
        Ok(max_new)
    }
}

/// Admits, batches, preempts and retires sequences; see the module docs.
/// `'e` bounds the engine and the requests' sinks.
pub struct Scheduler<'e> {
    engine: &'e Engine,
    config: SchedulerConfig,
    costs: KvCosts,
    queue: VecDeque<Seq<'e>>,
    running: Vec<Seq<'e>>,
    next_id: u64,
    /// Admissions so far (a sequence's `admitted` is its place in them).
    admissions: u64,
    preemptions: u64,
    cache: PrefixCache,
    disk: Option<DiskTier>,
    /// Every successful pass's routes, when recording (`serve --trace`).
    routes: Option<RouteLog>,
}

impl<'e> Scheduler<'e> {
    /// A scheduler over `engine`'s model; `max_batch` and `prefill_chunk` must be at least 1.
    pub fn new(engine: &'e Engine, config: SchedulerConfig) -> Result<Self, EngineError> {
        for (field, v) in [("max_batch", config.max_batch), ("prefill_chunk", config.prefill_chunk)] {
            if v == 0 {
                return Err(EngineError::Invalid {
                    field,
                    message: "must be at least 1".into(),
                });
            }
        }
        let config = SchedulerConfig {
            prefill_chunk: config.prefill_chunk.min(engine.prefill_rows()),
            ..config
        };
        Ok(Scheduler {
            engine,
            config,
            costs: KvCosts::of(engine),
            queue: VecDeque::new(),
            running: Vec::new(),
            next_id: 0,
            admissions: 0,
            preemptions: 0,
            cache: PrefixCache::new(config.prefix_cache),
            disk: None,
            routes: None,
        })
    }

    /// Keeps finished conversations in `config.dir` too and reuses them from
    /// there (see the module docs); an error when the folder cannot be
    /// created or written, or the model's files cannot be read for its identity.
    pub fn attach_disk_tier(&mut self, config: DiskTierConfig) -> Result<(), EngineError> {
        self.disk = Some(DiskTier::open(config, self.engine.dir(), self.engine.model())?);
        Ok(())
    }

    /// Records the routes of every pass from now on into `log` (appended
    /// after its tokens): each row tagged with its request's id, its
    /// position, and `prompt` below the prompt's length, else `decode`.
    pub fn record_routes(&mut self, log: RouteLog) {
        self.routes = Some(log);
    }

    /// The routes recorded so far (`None` unless [`record_routes`](Self::record_routes)).
    pub fn routes(&self) -> Option<&RouteLog> {
        self.routes.as_ref()
    }

    /// The disk tier's counters (`None` without one).
    pub fn disk_stats(&self) -> Option<DiskTierStats> {
        self.disk.as_ref().map(DiskTier::stats)
    }

    /// The disk tier's warnings since the last call (bad files, failed saves).
    pub fn take_disk_warnings(&mut self) -> Vec<String> {
        self.disk.as_mut().map(DiskTier::take_warnings).unwrap_or_default()
    }

    /// Bytes of model state one position takes in every layer.
    pub fn bytes_per_token(&self) -> usize {
        self.costs.bytes_per_token
    }

    /// Bytes every sequence's state holds whatever its length (recurrent
    /// layers' fixed-size states, both buffers; 0 for a KV-only model).
    pub fn bytes_per_sequence(&self) -> usize {
        self.costs.bytes_per_sequence
    }

    /// Checks `job` ([`KvCosts::check`]: prompt, context, sampling, stop
    /// strings, KV budget) and queues it, its events going to `sink`;
    /// returns its id. Nothing is generated on an error.
    pub fn submit(&mut self, job: Job, sink: Box<dyn RequestSink + 'e>) -> Result<u64, EngineError> {
        let max_new = self.costs.check(self.engine, &job, self.config.kv_budget)?;
        let sampler = Sampler::new(job.options.sampling)?;
        let stops = StopFilter::new(&job.stop)?;
        let id = self.next_id;
        self.next_id += 1;
        self.queue.push_back(Seq::new(id, job, sink, max_new, sampler, stops));
        Ok(id)
    }

    /// Sequences running (decoding or prefilling).
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Requests waiting for a place in the batch (preempted ones included).
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Whether nothing runs or waits.
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.queue.is_empty()
    }

    /// Bytes of model state all sequences hold now, their snapshots
    /// included (the prefix cache's are [`kept_bytes`](Self::kept_bytes)).
    pub fn state_bytes(&self) -> usize {
        self.running
            .iter()
            .chain(&self.queue)
            .map(|s| s.state.bytes() + s.points.bytes())
            .sum()
    }

    /// Sequences preempted so far (each time counts).
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// Bytes of the conversations kept for prefix reuse (0 when none).
    pub fn kept_bytes(&self) -> usize {
        self.cache.bytes()
    }

    /// Conversations kept for prefix reuse.
    pub fn kept_conversations(&self) -> usize {
        self.cache.len()
    }

    /// Partial prefix-cache hits served by copying a kept state so far.
    pub fn prefix_copies(&self) -> u64 {
        self.cache.copies()
    }

    /// Drops every conversation kept for prefix reuse.
    pub fn clear_kept(&mut self) {
        self.cache.clear();
    }

    /// One step: retires cancelled sequences, admits queued ones, lets the
    /// drafting ones guess, makes room in the KV budget (evicting, then
    /// preempting), runs one batched forward pass, and samples (or verifies
    /// the drafts of) each sequence's next tokens.
    pub fn step(&mut self) -> StepReport {
        let mut report = StepReport::default();
        self.retire_cancelled(&mut report);
        self.admit();
        self.propose_drafts(&mut report);
        self.make_room(&mut report);
        self.take_snapshots();
        if self.running.is_empty() {
            return report;
        }
        let Some(outputs) = self.forward_or_fail(&mut report) else {
            return report;
        };
        report.batch = self.running.len();
        let mut keep = Vec::with_capacity(self.running.len());
        let mut ended = Vec::new();
        for (mut s, out) in std::mem::take(&mut self.running).into_iter().zip(outputs) {
            let before = s.ids.len();
            let done = match out {
                PassOut::Fed => Ok(None),
                PassOut::Last(_) if s.max_new == 0 => Ok(Some(FinishReason::Length)),
                PassOut::Last(_) if s.resume_pending() => Ok(None),
                PassOut::Last(l) => sample_one(self.engine, &mut s, &l),
                PassOut::Verify(m) => verify::verify(self.engine, &mut s, &m),
            };
            report.tokens += s.ids.len() - before;
            match done {
                Ok(Some(reason)) => ended.push((s, reason)),
                Ok(None) => keep.push(s),
                Err(error) => report.failed.push(Failure { id: s.id, error }),
            }
        }
        self.running = keep;
        for (s, reason) in ended {
            report.finished.push(s.id);
            self.end(s, reason);
        }
        report
    }

    /// Each running sequence that drafts and decodes guesses the tokens its
    /// pass will verify; one whose drafter fails is removed with its error.
    fn propose_drafts(&mut self, report: &mut StepReport) {
        let engine = self.engine;
        let mut i = 0;
        while i < self.running.len() {
            let s = &mut self.running[i];
            let room = verify::room(engine, s);
            let proposed = match (&mut s.spec, s.next) {
                (Some(spec), Some(_)) => {
                    let context: Vec<u32> = s.prompt.iter().chain(&s.ids).copied().collect();
                    spec.propose(&context, room)
                }
                _ => Ok(()),
            };
            match proposed {
                Ok(()) => i += 1,
                Err(error) => {
                    let s = self.running.remove(i);
                    report.failed.push(Failure { id: s.id, error });
                }
            }
        }
    }
}
