//! The [`Scheduler`]: many sequences decode together, each bit-identical to
//! running alone.
//!
//! It owns every admitted sequence (its model state, its seeded [`Sampler`],
//! stop filter, token budget, cancel flag and event sink) and advances them in
//! steps. Each [`step`](Scheduler::step) runs one `forward_batch` over every
//! running sequence: one row for a decoding sequence (its last token), and at
//! most `prefill_chunk` prompt tokens for a sequence still prefilling, so a
//! long new prompt never stalls the running streams for more than one chunk.
//! The model's batch invariance makes each sequence's logits identical to
//! running it alone, and each sequence samples with its own generator in the
//! same order as [`Engine::generate`], so its tokens are identical too, in
//! any arrival order and at any batch size.
//!
//! At most `max_batch` sequences run; more wait in a FIFO queue. The KV
//! budget bounds the model state of all sequences together: a request's
//! worst case is `(prompt + max_new) x bytes per position` (every layer's
//! keys and values, f32; the allocator's growth slack is not counted). A
//! request whose worst case alone exceeds the budget is refused at
//! [`submit`](Scheduler::submit); a queued one is admitted only while the
//! worst cases of the running ones and its own fit, so the state never
//! outgrows the budget. Finished and cancelled sequences are retired at the
//! step that ends them.
//!
//! Prefix reuse: the last finished sequence's tokens and state are kept
//! ([`kept_bytes`](Scheduler::kept_bytes)); the next admitted request that
//! shares a prompt prefix with it takes that state over and prefills only
//! the rest (bit-identical to a fresh prefill; `Outcome::cached_tokens`
//! says how many it reused). The kept state counts against the KV budget
//! and is dropped when a request needs the room.
//!
//! Requests with a drafter (speculative decoding) are not batched: run them
//! alone through [`Conversation::run`](crate::Conversation::run).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use larder_model::{BatchSeq, LayerState, SequenceState, Wanted};

use crate::conversation::{Outcome, RequestEvent, RequestSink, StopFilter};
use crate::engine::{Engine, FinishReason, GenerateOptions};
use crate::error::EngineError;
use crate::sampling::Sampler;
use crate::stats::Stats;
use crate::tokenizer::StreamDecoder;

/// Limits of a [`Scheduler`].
#[derive(Debug, Clone, Copy)]
pub struct SchedulerConfig {
    /// Most sequences running (decoding or prefilling) at once.
    pub max_batch: usize,
    /// Most prompt tokens one sequence prefills per step.
    pub prefill_chunk: usize,
    /// Bytes of all sequence states together (`None`: unbounded).
    pub kv_budget: Option<usize>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_batch: 8,
            prefill_chunk: crate::engine::PREFILL_CHUNK,
            kv_budget: None,
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
}

/// A forward pass's error, with the index of the sequence at fault when one is.
type StepError = (Option<usize>, EngineError);

/// One admitted or queued sequence.
struct Seq {
    id: u64,
    job: Job,
    max_new: usize,
    worst_bytes: usize,
    state: SequenceState,
    sampler: Sampler,
    stops: StopFilter,
    decoder: StreamDecoder,
    /// Prompt tokens already fed to the model.
    fed: usize,
    /// The token to feed next once decoding.
    next: Option<u32>,
    ids: Vec<u32>,
    text: String,
    started: Instant,
    stats: Stats,
    decode_steps: usize,
}

/// Admits, batches and retires sequences; see the module docs.
pub struct Scheduler<'e> {
    engine: &'e Engine,
    config: SchedulerConfig,
    bytes_per_token: usize,
    queue: VecDeque<Seq>,
    running: Vec<Seq>,
    next_id: u64,
    /// The last finished sequence's tokens and state, kept for prefix reuse.
    kept: Option<Kept>,
}

/// A finished conversation: the tokens fed to the model and their state.
struct Kept {
    tokens: Vec<u32>,
    state: SequenceState,
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
        let fresh = engine.model().new_state();
        let bytes_per_token = (0..fresh.num_layers())
            .filter_map(|l| fresh.layer(l))
            .map(|s| match s {
                LayerState::Kv(kv) => (kv.dims().0 + kv.dims().1) * 4,
            })
            .sum();
        Ok(Scheduler {
            engine,
            config,
            bytes_per_token,
            queue: VecDeque::new(),
            running: Vec::new(),
            next_id: 0,
            kept: None,
        })
    }

    /// Bytes of model state one position takes in every layer.
    pub fn bytes_per_token(&self) -> usize {
        self.bytes_per_token
    }

    /// Checks `job` (prompt, context, sampling, stop strings, KV budget) and
    /// queues it; returns its id. Nothing is generated on an error.
    pub fn submit(&mut self, job: Job) -> Result<u64, EngineError> {
        let max_new = self.engine.check_prompt(&job.prompt, Some(job.options.max_new))?;
        let sampler = Sampler::new(job.options.sampling)?;
        let stops = StopFilter::new(&job.stop)?;
        let worst_bytes = (job.prompt.len() + max_new) * self.bytes_per_token;
        if let Some(budget) = self.config.kv_budget {
            if worst_bytes > budget {
                return Err(EngineError::Invalid {
                    field: "max_tokens",
                    message: format!(
                        "the prompt's {} tokens plus max_tokens {max_new} need up to {} of sequence state, over the KV \
                         budget of {}; lower max_tokens, shorten the prompt or raise --kv-budget",
                        job.prompt.len(),
                        larder_store::format_size(worst_bytes as u64),
                        larder_store::format_size(budget as u64)
                    ),
                });
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        let stats = Stats {
            prompt_tokens: job.prompt.len(),
            ..Stats::default()
        };
        self.queue.push_back(Seq {
            id,
            job,
            max_new,
            worst_bytes,
            state: self.engine.model().new_state(),
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
        });
        Ok(id)
    }

    /// Sequences running (decoding or prefilling).
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Requests waiting for a place in the batch.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Whether nothing runs or waits.
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.queue.is_empty()
    }

    /// Bytes of model state all sequences hold now.
    pub fn state_bytes(&self) -> usize {
        self.running.iter().chain(&self.queue).map(|s| s.state.bytes()).sum()
    }

    /// One step: retires cancelled sequences, admits queued ones, runs one
    /// batched forward pass and samples each sequence's next token.
    pub fn step(&mut self) -> StepReport {
        let mut report = StepReport::default();
        self.retire_cancelled(&mut report);
        self.admit();
        if self.running.is_empty() {
            return report;
        }
        let logits = loop {
            match self.forward() {
                Ok(l) => break l,
                Err((Some(i), error)) => {
                    // States are unchanged on error: drop the culprit, rerun the rest.
                    let s = self.running.remove(i);
                    report.failed.push(Failure { id: s.id, error });
                    if self.running.is_empty() {
                        return report;
                    }
                }
                Err((None, error)) => {
                    // Not one sequence's fault (expert I/O, say): every running one fails.
                    let msg = error.to_string();
                    let mut first = Some(error);
                    for s in self.running.drain(..) {
                        let error = first.take().unwrap_or_else(|| EngineError::Invalid {
                            field: "model",
                            message: format!("the batched forward pass failed: {msg}"),
                        });
                        report.failed.push(Failure { id: s.id, error });
                    }
                    return report;
                }
            }
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

    fn retire_cancelled(&mut self, report: &mut StepReport) {
        let cancelled = |s: &Seq| s.job.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed));
        let mut i = 0;
        while i < self.running.len() {
            if cancelled(&self.running[i]) {
                let s = self.running.remove(i);
                report.finished.push(s.id);
                self.end(s, FinishReason::Cancelled);
            } else {
                i += 1;
            }
        }
        let queued = std::mem::take(&mut self.queue);
        for s in queued {
            if cancelled(&s) {
                report.finished.push(s.id);
                self.end(s, FinishReason::Cancelled);
            } else {
                self.queue.push_back(s);
            }
        }
    }

    /// Moves queued sequences into the batch, in order, while the batch and
    /// the KV budget (worst cases) allow.
    /// The kept conversation's state counts against the budget until a
    /// sequence takes it over, and is dropped when room is needed.
    fn admit(&mut self) {
        while self.running.len() < self.config.max_batch {
            let Some(front) = self.queue.front() else { break };
            if let Some(budget) = self.config.kv_budget {
                let reserved: usize = self.running.iter().map(|s| s.worst_bytes).sum();
                if reserved + self.kept_bytes() + front.worst_bytes > budget {
                    if self.kept.take().is_some() {
                        continue;
                    }
                    break;
                }
            }
            if let Some(mut s) = self.queue.pop_front() {
                self.reuse_kept(&mut s);
                self.running.push(s);
            }
        }
    }

    /// Gives `s` the kept conversation's state when they share a prompt
    /// prefix (at least the last prompt token is still fed, for its logits).
    fn reuse_kept(&mut self, s: &mut Seq) {
        let Some(kept) = &self.kept else { return };
        let common = kept.tokens.iter().zip(&s.job.prompt).take_while(|(a, b)| a == b).count();
        let reuse = common.min(s.job.prompt.len() - 1).min(kept.state.len());
        if reuse == 0 {
            return;
        }
        let Some(mut kept) = self.kept.take() else { return };
        if kept.state.rollback(reuse).is_ok() {
            s.state = kept.state;
            s.fed = reuse;
            s.stats.cached_tokens = reuse;
        }
    }

    /// Ends `s` (see [`finish`]) and keeps its conversation for prefix reuse.
    fn end(&mut self, s: Seq, reason: FinishReason) {
        if let Some(kept) = finish(s, reason) {
            self.kept = Some(kept);
        }
    }

    /// Bytes of the conversation kept for prefix reuse (0 when none).
    pub fn kept_bytes(&self) -> usize {
        self.kept.as_ref().map_or(0, |k| k.state.bytes())
    }

    /// Drops the conversation kept for prefix reuse.
    pub fn clear_kept(&mut self) {
        self.kept = None;
    }

    /// One forward pass over every running sequence; per sequence the logits
    /// of its last row, or `None` while its prompt is not yet all fed.
    fn forward(&mut self) -> Result<Vec<Option<Vec<f32>>>, StepError> {
        let chunk = self.config.prefill_chunk;
        let inputs: Vec<(Vec<u32>, bool)> = self
            .running
            .iter()
            .map(|s| match s.next {
                Some(t) => (vec![t], true),
                None => {
                    let end = (s.fed + chunk).min(s.job.prompt.len());
                    (s.job.prompt[s.fed..end].to_vec(), end == s.job.prompt.len())
                }
            })
            .collect();
        let started = Instant::now();
        let mut batch: Vec<BatchSeq<'_>> = self
            .running
            .iter_mut()
            .zip(&inputs)
            .map(|(s, (ids, _))| BatchSeq::new(ids, &mut s.state, Wanted::Last))
            .collect();
        let out = self.engine.model().forward_batch(&mut batch, None).map_err(|e| match e {
            larder_model::ModelError::Sequence { index, source } => (Some(index), EngineError::Model(*source)),
            e => (None, EngineError::Model(e)),
        })?;
        drop(batch);
        let secs = started.elapsed().as_secs_f64();
        let mut result = Vec::with_capacity(out.len());
        for ((s, (ids, last)), m) in self.running.iter_mut().zip(&inputs).zip(out) {
            if s.next.is_some() {
                s.stats.decode_s += secs;
                s.decode_steps += 1;
            } else {
                s.fed += ids.len();
                s.stats.prefill_s = s.started.elapsed().as_secs_f64();
            }
            result.push(last.then(|| m.into_vec()));
        }
        Ok(result)
    }
}

/// Samples `s`'s next token from `logits` as the single-sequence loop does;
/// returns why it ends, or `None` to go on with the token as its next input.
fn sample_one(engine: &Engine, s: &mut Seq, logits: &[f32]) -> Option<FinishReason> {
    let next = s.sampler.sample(logits);
    s.ids.push(next);
    if s.ids.len() == 1 {
        s.stats.time_to_first_token_s = s.started.elapsed().as_secs_f64();
    }
    let piece = match engine.tokenizer() {
        Ok(t) => s.decoder.push(t, next).ok().flatten().unwrap_or_default(),
        Err(_) => String::new(),
    };
    let (shown, hit) = s.stops.push(&piece);
    s.text.push_str(&shown);
    let go = s.job.sink.event(RequestEvent::Token { id: next, text: &shown });
    if hit {
        return Some(FinishReason::Stop);
    }
    if !go || s.job.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed)) {
        return Some(FinishReason::Cancelled);
    }
    if s.job.options.stop_at_eos && engine.generation_config().eos_token_ids.contains(&next) {
        return Some(FinishReason::Stop);
    }
    let max_ctx = engine.model().spec().max_position_embeddings;
    if s.ids.len() == s.max_new || s.state.len() + 1 > max_ctx {
        return Some(FinishReason::Length);
    }
    s.next = Some(next);
    None
}

/// Ends `s`: releases held text, sends `Finished`, frees its state.
fn finish(mut s: Seq, reason: FinishReason) -> Option<Kept> {
    let tail = s.stops.finish();
    if !tail.is_empty() {
        s.text.push_str(&tail);
        s.job.sink.event(RequestEvent::Text(&tail));
    }
    s.stats.new_tokens = s.ids.len();
    s.stats.finish(s.decode_steps);
    let outcome = Outcome {
        finish_reason: reason,
        stop_string: s.stops.matched().map(str::to_string),
        prompt_tokens: s.job.prompt.len(),
        cached_tokens: s.stats.cached_tokens,
        ids: std::mem::take(&mut s.ids),
        text: std::mem::take(&mut s.text),
        stats: s.stats.clone(),
    };
    s.job.sink.event(RequestEvent::Finished(&outcome));
    let tokens = s.job.prompt.iter().chain(&outcome.ids).copied().take(s.state.len()).collect();
    (!s.state.is_empty()).then_some(Kept { tokens, state: s.state })
}
