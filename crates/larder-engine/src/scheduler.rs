//! The [`Scheduler`]: many sequences decode together, each bit-identical to
//! running alone.
//!
//! It owns every admitted sequence (its model state, its seeded [`Sampler`],
//! stop filter, token budget, cancel flag and event sink) and advances them in
//! steps. Each [`step`](Scheduler::step) runs one `forward_batch` over every
//! running sequence: one row for a decoding sequence (its last token), and at
//! most `prefill_chunk` tokens for a sequence still prefilling, so a long new
//! prompt never stalls the running streams for more than one chunk. The
//! model's batch invariance makes each sequence's logits identical to
//! running it alone, and each sequence samples with its own generator in the
//! same order as [`Engine::generate`], so its tokens are identical too, in
//! any arrival order and at any batch size.
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
//!   sequence always fits alone.
//! - Admission is optimistic (as vLLM's): the queue's front is admitted when
//!   what the running sequences will hold after this step (each one's
//!   positions plus its rows this step) plus the newcomer's first chunk fit;
//!   prefix-cache entries are evicted (least recently used first) to make
//!   that room. It never preempts to admit.
//! - Preemption (recompute mode): before each forward pass, while the step's
//!   need exceeds the budget, the prefix cache is evicted first, then the
//!   most recently admitted running sequence (LIFO) is preempted: its state
//!   is dropped and it goes back to the **front** of the queue. Readmitted,
//!   it feeds `prompt ++ generated ids` again in chunks (the last generated
//!   id, not yet fed, included) and samples from the last row's logits with
//!   its own untouched sampler: exactly what its next decode step would have
//!   computed, so its output stays bit-identical and its sink sees no token
//!   twice. The last running sequence is never preempted, so the oldest
//!   admitted one always advances and finishes: no livelock.
//!   [`preemptions`](Scheduler::preemptions) counts them; a step's
//!   [`StepReport::preempted`] names them.
//!
//! **Prefix cache** (`prefix_cache`, [`prefix_cache`] module): finished and
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
//! to any earlier length by truncation and keeps none. A recurrent one stops
//! its prefill chunk at its prompt minus the last token and, before the next
//! pass, keeps a snapshot there (a copy of the recurrent state), the point a
//! later request sharing the prompt returns to from the prefix cache; its
//! last prompt token then runs alone (one more step, identical logits by
//! batch invariance). The end of a sequence needs no snapshot: the cached
//! entry is that state. A snapshot is taken only when it fits the budget
//! with everything else; under pressure, running sequences' snapshots are
//! dropped after the prefix cache is evicted and before any preemption.
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
//! nothing.
//!
//! Cancelled sequences (flag or sink) are retired at the next step in any
//! phase (queued, prefilling, decoding, preempted and queued); when nothing
//! runs or waits, [`state_bytes`](Scheduler::state_bytes) is 0.
//!
//! Requests with a drafter (speculative decoding) are not batched: run them
//! alone through [`Conversation::run`](crate::Conversation::run).

mod disk_tier;
mod identity;
mod prefix_cache;
mod sequence;

use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use larder_model::{BatchSeq, LayerState, SequenceState, Wanted};
use larder_router::Phase;

use crate::conversation::{RequestSink, StopFilter};
use crate::engine::{Engine, FinishReason, GenerateOptions};
use crate::error::EngineError;
use crate::return_points::ReturnPoints;
use crate::route_log::{RouteLog, RowTag};
use crate::sampling::Sampler;
use crate::stats::Stats;
use crate::tokenizer::StreamDecoder;
pub use disk_tier::{check_state_dir, DiskTierConfig, DiskTierStats};
use disk_tier::{DiskHit, DiskTier};
pub use identity::{model_identity, CONTENT_DIGESTS};
use prefix_cache::{Hit, PrefixCache};
use sequence::{finish, sample_one, Seq};

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

/// One request handed to the scheduler (owned: it may outlive the caller's frame).
pub struct Job {
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
    /// Generation stops where any of these appears in the text.
    pub stop: Vec<String>,
    /// Set from anywhere to cancel the request at the next step.
    pub cancel: Option<Arc<AtomicBool>>,
    /// Receives the request's events; returning `false` cancels it.
    pub sink: Box<dyn RequestSink + Send>,
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
    /// Requests that ended this step (finished or cancelled), by id.
    pub finished: Vec<u64>,
    /// Requests that failed this step; their sinks got no `Finished` event.
    pub failed: Vec<Failure>,
    /// Requests preempted this step (state dropped, queued again), by id.
    pub preempted: Vec<u64>,
}

/// A forward pass's error, with the index of the sequence at fault when one is.
type StepError = (Option<usize>, EngineError);

/// Admits, batches, preempts and retires sequences; see the module docs.
pub struct Scheduler<'e> {
    engine: &'e Engine,
    config: SchedulerConfig,
    bytes_per_token: usize,
    /// Bytes every sequence holds whatever its length (recurrent layers).
    bytes_per_sequence: usize,
    queue: VecDeque<Seq>,
    running: Vec<Seq>,
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
        let fresh = engine.model().new_state();
        let bytes_per_token = (0..fresh.num_layers())
            .filter_map(|l| fresh.layer(l))
            .map(LayerState::bytes_per_position)
            .sum();
        // Recurrent layers hold a fixed-size state from the first position.
        let bytes_per_sequence = fresh.bytes();
        Ok(Scheduler {
            engine,
            config,
            bytes_per_token,
            bytes_per_sequence,
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
        self.bytes_per_token
    }

    /// Bytes every sequence's state holds whatever its length (recurrent
    /// layers' fixed-size states, both buffers; 0 for a KV-only model).
    pub fn bytes_per_sequence(&self) -> usize {
        self.bytes_per_sequence
    }

    /// Checks `job` (prompt, context, sampling, stop strings, KV budget) and
    /// queues it; returns its id. Nothing is generated on an error.
    pub fn submit(&mut self, job: Job) -> Result<u64, EngineError> {
        let max_new = self.engine.check_prompt(&job.prompt, Some(job.options.max_new))?;
        if job.prompt.is_empty() {
            return Err(EngineError::Invalid {
                field: "prompt",
                message: "is empty: at least one token is needed".into(),
            });
        }
        let sampler = Sampler::new(job.options.sampling)?;
        let stops = StopFilter::new(&job.stop)?;
        let needed = self.bytes_per_sequence + (job.prompt.len() + max_new) * self.bytes_per_token;
        if let Some(budget) = self.config.kv_budget.filter(|&b| needed > b) {
            return Err(EngineError::KvBudget {
                needed,
                budget,
                prompt_tokens: job.prompt.len(),
                max_new,
            });
        }
        let id = self.next_id;
        self.next_id += 1;
        let stats = Stats {
            prompt_tokens: job.prompt.len(),
            ..Stats::default()
        };
        self.queue.push_back(Seq {
            id,
            feed: job.prompt.clone(),
            job,
            max_new,
            // Made at admission: a queued request holds no state (a
            // recurrent layer's would take its fixed size at once).
            state: SequenceState::default(),
            points: ReturnPoints::new(),
            sampler,
            stops,
            decoder: StreamDecoder::new(),
            fed: 0,
            next: None,
            ids: Vec::new(),
            text: String::new(),
            started: Instant::now(),
            stats,
            decode_steps: 0,
            admitted: 0,
            preemptions: 0,
        });
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

    /// One step: retires cancelled sequences, admits queued ones, makes room
    /// in the KV budget (evicting, then preempting), runs one batched
    /// forward pass and samples each sequence's next token.
    pub fn step(&mut self) -> StepReport {
        let mut report = StepReport::default();
        self.retire_cancelled(&mut report);
        self.admit();
        self.make_room(&mut report);
        self.take_snapshots();
        if self.running.is_empty() {
            return report;
        }
        let Some(logits) = self.forward_or_fail(&mut report) else {
            return report;
        };
        report.batch = self.running.len();
        let (mut keep, mut ended) = (Vec::with_capacity(self.running.len()), Vec::new());
        for (mut s, l) in self.running.drain(..).zip(logits) {
            let done = match l {
                Some(_) if s.max_new == 0 => Some(FinishReason::Length),
                Some(l) => sample_one(self.engine, &mut s, &l),
                None => None,
            };
            match done {
                Some(reason) => ended.push((s, reason)),
                None => keep.push(s),
            }
        }
        self.running = keep;
        for (s, reason) in ended {
            report.finished.push(s.id);
            self.end(s, reason);
        }
        report
    }

    /// Runs the forward pass; a sequence at fault is removed and the rest
    /// run again (states are unchanged on error). `None` when none is left.
    fn forward_or_fail(&mut self, report: &mut StepReport) -> Option<Vec<Option<Vec<f32>>>> {
        loop {
            match self.forward() {
                Ok(l) => return Some(l),
                Err((Some(i), error)) => {
                    let s = self.running.remove(i);
                    report.failed.push(Failure { id: s.id, error });
                    if self.running.is_empty() {
                        return None;
                    }
                }
                Err((None, error)) if self.running.len() == 1 => {
                    let s = self.running.remove(0);
                    report.failed.push(Failure { id: s.id, error });
                    return None;
                }
                // Not one sequence's fault as far as the pass can tell (an
                // expert the source cannot send, say): each runs alone.
                Err((None, _)) => return self.forward_each_alone(report),
            }
        }
    }

    /// Runs every running sequence in a pass of its own (states are
    /// unchanged by the failed batch): the ones whose experts can be read go
    /// on with exactly the logits the batch would have given them (batch
    /// invariance, docs/design.md §3), the others fail with their own
    /// error. So a request needing an expert from a source that is down
    /// never takes the cached requests batched with it down too.
    fn forward_each_alone(&mut self, report: &mut StepReport) -> Option<Vec<Option<Vec<f32>>>> {
        let all = std::mem::take(&mut self.running);
        let (mut kept, mut logits) = (Vec::with_capacity(all.len()), Vec::with_capacity(all.len()));
        for s in all {
            self.running.push(s);
            let outcome = self.forward();
            let Some(s) = self.running.pop() else { continue };
            match outcome {
                Ok(mut l) => {
                    logits.push(l.pop().flatten());
                    kept.push(s);
                }
                Err((_, error)) => report.failed.push(Failure { id: s.id, error }),
            }
        }
        self.running = kept;
        (!self.running.is_empty()).then_some(logits)
    }

    fn retire_cancelled(&mut self, report: &mut StepReport) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].cancelled() {
                let s = self.running.remove(i);
                report.finished.push(s.id);
                self.end(s, FinishReason::Cancelled);
            } else {
                i += 1;
            }
        }
        let queued = std::mem::take(&mut self.queue);
        for s in queued {
            if s.cancelled() {
                report.finished.push(s.id);
                self.end(s, FinishReason::Cancelled);
            } else {
                self.queue.push_back(s);
            }
        }
    }

    /// Bytes the running sequences will hold after this step's forward pass
    /// (their snapshots included).
    fn step_bytes(&self) -> usize {
        let chunk = self.config.prefill_chunk;
        let positions: usize = self.running.iter().map(|s| s.state.len() + s.rows(chunk)).sum();
        let snapshots: usize = self.running.iter().map(|s| s.points.bytes()).sum();
        self.running.len() * self.bytes_per_sequence + positions * self.bytes_per_token + snapshots
    }

    /// Asks each running sequence whose next pass crosses its return point
    /// to snapshot it there, inside the pass (see the module docs), when the
    /// snapshot fits the KV budget with everything else.
    fn take_snapshots(&mut self) {
        let chunk = self.config.prefill_chunk;
        for i in 0..self.running.len() {
            let Some(mark) = self.running[i].snapshot_mark(self.running[i].rows(chunk)) else {
                continue;
            };
            let size = self.running[i].state.snapshot().bytes();
            let fits = self
                .config
                .kv_budget
                .is_none_or(|b| self.step_bytes() + self.cache.bytes() + size <= b);
            if fits {
                self.running[i].state.mark_after(mark);
            }
        }
    }

    /// Bytes `s` holds after its first forward pass when it reuses `reuse` positions.
    fn first_pass_bytes(&self, s: &Seq, reuse: usize) -> usize {
        self.bytes_per_sequence + (reuse + self.config.prefill_chunk.min(s.feed.len() - reuse)) * self.bytes_per_token
    }

    /// Moves queued sequences into the batch, in order, while the batch and
    /// the KV budget allow (see the module docs); evicts prefix-cache
    /// entries for the room, never preempts.
    fn admit(&mut self) {
        while self.running.len() < self.config.max_batch {
            let Some(front) = self.queue.front() else { break };
            let hit = self.cache.lookup(&front.feed);
            let ram = hit.map_or(0, |h| h.reuse);
            let disk = self.disk.as_ref().and_then(|d| d.lookup(&front.feed)).filter(|d| d.reuse > ram);
            if let Some(budget) = self.config.kv_budget {
                let running = self.step_bytes();
                if running + self.first_pass_bytes(front, 0) > budget {
                    break; // it waits for room
                }
                let (own, carried, moved) = match disk {
                    Some(d) => (d.reuse, d.snapshots * self.bytes_per_sequence / 2, 0),
                    None => (
                        ram,
                        hit.map_or(0, |h| h.carried_bytes),
                        hit.filter(|h| h.whole).map_or(0, |h| h.entry_bytes),
                    ),
                };
                let kept = self.cache.bytes() - moved;
                if running + self.first_pass_bytes(front, own) + carried + kept > budget {
                    if self.cache.evict_lru() {
                        continue;
                    }
                    break;
                }
            }
            let Some(mut s) = self.queue.pop_front() else { break };
            self.start(&mut s, hit, disk);
            self.running.push(s);
        }
    }

    /// Admits `s`: its place in the admission order, and the prefix it reuses.
    fn start(&mut self, s: &mut Seq, hit: Option<Hit>, disk: Option<DiskHit>) {
        s.admitted = self.admissions;
        self.admissions += 1;
        if let Some((state, points, reuse)) = self.load_from_disk(disk) {
            s.state = state;
            s.points = points;
            s.fed = reuse;
            if !s.resumed() {
                s.stats.cached_tokens = reuse;
            }
        } else if let Some((hit, (state, points))) = hit.and_then(|hit| self.cache.take(hit).map(|taken| (hit, taken))) {
            s.state = state;
            s.points = points;
            s.fed = hit.reuse;
            if !s.resumed() {
                s.stats.cached_tokens = hit.reuse;
            }
        } else {
            s.state = self.engine.model().new_state();
        }
    }

    /// The state `disk` names, loaded (with the positions it reuses); counts
    /// a miss when the disk tier had nothing longer than RAM or failed.
    fn load_from_disk(&mut self, disk: Option<DiskHit>) -> Option<(SequenceState, ReturnPoints, usize)> {
        let tier = self.disk.as_mut()?;
        let loaded = disk.and_then(|d| tier.load(d, self.engine.model()).map(|(s, p)| (s, p, d.reuse)));
        if loaded.is_none() {
            tier.miss();
        }
        loaded
    }

    /// Before a forward pass: while the step's need and the prefix cache
    /// exceed the KV budget, evicts the least recently used cached
    /// conversation, else drops a running sequence's snapshots (the most
    /// recently admitted one's first), else preempts the most recently
    /// admitted running sequence (never the last one, which fits alone).
    fn make_room(&mut self, report: &mut StepReport) {
        let Some(budget) = self.config.kv_budget else { return };
        while self.step_bytes() + self.cache.bytes() > budget {
            if self.cache.evict_lru() {
                continue;
            }
            let with_snapshots = (0..self.running.len())
                .filter(|&i| !self.running[i].points.is_empty())
                .max_by_key(|&i| self.running[i].admitted);
            if let Some(i) = with_snapshots {
                self.running[i].points.clear();
                continue;
            }
            if self.running.len() <= 1 {
                break;
            }
            let youngest = (0..self.running.len()).max_by_key(|&i| self.running[i].admitted);
            let Some(youngest) = youngest else { break };
            let mut s = self.running.remove(youngest);
            s.preempt(SequenceState::default());
            self.preemptions += 1;
            report.preempted.push(s.id);
            self.queue.push_front(s);
        }
    }

    /// Ends `s` (see [`finish`]) and keeps its conversation for prefix reuse
    /// (in RAM, and on disk when there is a disk tier).
    fn end(&mut self, s: Seq, reason: FinishReason) {
        let (tokens, state, points) = finish(s, reason);
        if let Some(disk) = &mut self.disk {
            disk.save(&tokens, &state, &points);
        }
        self.cache.insert(tokens, state, points);
    }

    /// The trace tags of the rows of a pass over `inputs` (one per running
    /// sequence, in order).
    fn row_tags(&self, inputs: &[(Vec<u32>, bool)]) -> Vec<RowTag> {
        let mut tags = Vec::new();
        for (s, (ids, _)) in self.running.iter().zip(inputs) {
            let (start, prompt) = (s.state.len(), s.job.prompt.len());
            tags.extend((start..start + ids.len()).map(|pos| RowTag {
                seq: s.id as usize,
                pos,
                phase: if pos < prompt { Phase::Prompt } else { Phase::Decode },
            }));
        }
        tags
    }

    /// One forward pass over every running sequence; per sequence the logits
    /// of its last row, or `None` while its feed is not yet all fed.
    fn forward(&mut self) -> Result<Vec<Option<Vec<f32>>>, StepError> {
        let chunk = self.config.prefill_chunk;
        let inputs: Vec<(Vec<u32>, bool)> = self.running.iter().map(|s| s.input(chunk)).collect();
        let tags = self.routes.is_some().then(|| self.row_tags(&inputs));
        let mut recorder = self.routes.as_ref().map(RouteLog::recorder);
        let started = Instant::now();
        let mut batch: Vec<BatchSeq<'_>> = self
            .running
            .iter_mut()
            .zip(&inputs)
            .map(|(s, (ids, _))| BatchSeq::new(ids, &mut s.state, Wanted::Last))
            .collect();
        let out = self
            .engine
            .model()
            .forward_batch(&mut batch, recorder.as_mut())
            .map_err(|e| match e {
                larder_model::ModelError::Sequence { index, source } => (Some(index), EngineError::Model(*source)),
                e => (None, EngineError::Model(e)),
            })?;
        drop(batch);
        let secs = started.elapsed().as_secs_f64();
        if let (Some(log), Some(rt), Some(tags)) = (self.routes.as_mut(), &recorder, &tags) {
            log.append(rt, |row| tags[row]);
        }
        let mut result = Vec::with_capacity(out.len());
        for ((s, (ids, last)), m) in self.running.iter_mut().zip(&inputs).zip(out) {
            if let Some(snap) = s.state.take_marked() {
                s.points.keep(snap);
            }
            s.account(ids.len(), *last, secs);
            result.push(last.then(|| m.into_vec()));
        }
        Ok(result)
    }
}
