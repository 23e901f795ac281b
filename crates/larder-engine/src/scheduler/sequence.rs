//! One sequence the scheduler owns ([`Seq`]): its request, model state,
//! sampler, stop filter, snapshots to return to and progress, how it is
//! preempted (state dropped, to be fed again), how it samples a token and
//! how it ends.

use std::sync::atomic::Ordering;
use std::time::Instant;

use larder_model::SequenceState;

use crate::return_points::ReturnPoints;

use super::Job;
use crate::conversation::{Outcome, RequestEvent, StopFilter};
use crate::engine::{Engine, FinishReason};
use crate::sampling::Sampler;
use crate::stats::Stats;
use crate::tokenizer::StreamDecoder;

/// One admitted or queued sequence.
pub(super) struct Seq {
    pub id: u64,
    pub job: Job,
    pub max_new: usize,
    pub state: SequenceState,
    /// Snapshots of `state` to return to (only when it cannot roll back).
    pub points: ReturnPoints,
    pub sampler: Sampler,
    pub stops: StopFilter,
    pub decoder: StreamDecoder,
    /// Tokens to run through the model before the next sample: the prompt,
    /// or after a preemption the prompt and every generated id.
    pub feed: Vec<u32>,
    /// Tokens of `feed` already in `state`.
    pub fed: usize,
    /// The token to feed next once decoding.
    pub next: Option<u32>,
    pub ids: Vec<u32>,
    pub text: String,
    pub started: Instant,
    pub stats: Stats,
    pub decode_steps: usize,
    /// Its place in the order of admissions (a readmission takes a new one).
    pub admitted: u64,
    /// Times its state was dropped to make room.
    pub preemptions: usize,
}

impl Seq {
    /// Rows it adds to the state in the next forward pass.
    pub fn rows(&self, chunk: usize) -> usize {
        match self.next {
            Some(_) => 1,
            None => chunk.min(self.feed.len() - self.fed),
        }
    }

    /// Where a state that cannot roll back (a recurrent layer) is
    /// snapshotted: after the prompt minus its last token, the point a later
    /// request sharing the prompt returns to (crate::return_points).
    /// `None` for a state that rolls back, or a one-token prompt.
    pub fn return_point(&self) -> Option<usize> {
        let point = self.job.prompt.len() - 1;
        (!self.state.can_rollback() && point > 0).then_some(point)
    }

    /// Rows into its next pass (of `rows` rows) after which its return point
    /// lies, when it has none kept there yet: the pass snapshots it there
    /// ([`SequenceState::mark_after`]), so the prompt's last token runs in
    /// the same pass as the rest and its experts are read once.
    pub fn snapshot_mark(&self, rows: usize) -> Option<usize> {
        let p = self.return_point()?;
        let here = self.next.is_none() && self.state.len() == self.fed && (self.fed..self.fed + rows).contains(&p);
        (here && !self.points.lengths().contains(&p)).then(|| p - self.fed)
    }

    /// The ids of its next forward pass, and whether its last row's logits
    /// are wanted (the feed is then all fed).
    pub fn input(&self, chunk: usize) -> (Vec<u32>, bool) {
        match self.next {
            Some(t) => (vec![t], true),
            None => {
                let end = self.fed + self.rows(chunk);
                (self.feed[self.fed..end].to_vec(), end == self.feed.len())
            }
        }
    }

    /// Whether it has been admitted and fed before (a preempted sequence).
    pub fn resumed(&self) -> bool {
        self.preemptions > 0
    }

    /// Drops its state (`fresh`, an empty one, takes its place) so that it
    /// feeds the prompt and every generated id again when readmitted; its
    /// sampler, stop filter and stream decoder stay as they are, so the
    /// logits of the re-fed last id are those its next decode step would
    /// have computed, and it samples on as if never stopped.
    pub fn preempt(&mut self, fresh: SequenceState) {
        self.state = fresh;
        self.points.clear();
        self.feed = self.job.prompt.iter().chain(&self.ids).copied().collect();
        self.fed = 0;
        self.next = None;
        self.preemptions += 1;
    }

    /// Records a forward pass of `secs` that fed `rows` rows.
    pub fn account(&mut self, rows: usize, last: bool, secs: f64) {
        if self.next.is_some() {
            self.stats.decode_s += secs;
            self.decode_steps += 1;
            return;
        }
        self.fed += rows;
        if self.ids.is_empty() {
            self.stats.prefill_s = self.started.elapsed().as_secs_f64();
        } else {
            // Feeding again after a preemption: it costs decode time, and
            // the pass that ends it yields one token as a decode step does.
            self.stats.decode_s += secs;
            if last {
                self.decode_steps += 1;
            }
        }
    }

    /// Whether its cancel flag is set.
    pub fn cancelled(&self) -> bool {
        self.job.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed))
    }
}

/// Samples `s`'s next token from `logits` as the single-sequence loop does;
/// returns why it ends, or `None` to go on with the token as its next input.
pub(super) fn sample_one(engine: &Engine, s: &mut Seq, logits: &[f32]) -> Option<FinishReason> {
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
    if !go || s.cancelled() {
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

/// Ends `s`: releases held text, sends `Finished`; returns the tokens its
/// state holds (one per position), the state and its snapshots, for the
/// prefix cache.
pub(super) fn finish(mut s: Seq, reason: FinishReason) -> (Vec<u32>, SequenceState, ReturnPoints) {
    let tail = s.stops.finish();
    if !tail.is_empty() {
        s.text.push_str(&tail);
        s.job.sink.event(RequestEvent::Text(&tail));
    }
    s.stats.new_tokens = s.ids.len();
    s.stats.finish(s.decode_steps);
    s.stats.record_state(&s.state, s.points.bytes());
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
    (tokens, s.state, s.points)
}
