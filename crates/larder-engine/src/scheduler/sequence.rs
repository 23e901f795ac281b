//! One sequence the scheduler owns ([`Seq`]): its request, model state,
//! token chooser (sampler, adjustments, constraint), stop filter, snapshots to return to, drafter (when it decodes
//! speculatively) and progress; how it is preempted (state dropped, to be
//! fed again), how a chosen token is emitted, how it samples a token and
//! how it ends.

use std::time::Instant;

use larder_model::{RouteTrace, SequenceState, Wanted};
use larder_store::StoreStats;

use super::speculation::Speculation;
use crate::choice::{TokenChooser, TokenLogprob};
use crate::engine::{Engine, FinishReason};
use crate::error::EngineError;
use crate::prefill::passes;
use crate::request::{Job, Outcome, RequestEvent, RequestSink, StopFilter};
use crate::return_points::ReturnPoints;
use crate::sampling::Sampler;
use crate::stats::{ExpertStats, Stats};
use crate::tokenizer::StreamDecoder;

/// One admitted or queued sequence.
pub(super) struct Seq<'e> {
    pub id: u64,
    pub prompt: Vec<u32>,
    pub stop_at_eos: bool,
    pub sink: Box<dyn RequestSink + 'e>,
    pub max_new: usize,
    pub state: SequenceState,
    /// Snapshots of `state` to return to (only when it cannot roll back).
    pub points: ReturnPoints,
    pub chooser: TokenChooser,
    pub stops: StopFilter,
    pub decoder: StreamDecoder,
    /// Speculative decoding, when the request has a drafter.
    pub spec: Option<Speculation>,
    /// The routes it records ([`Job::record_routes`]).
    pub routes: Option<RouteTrace>,
    /// Tokens to run through the model before the next sample: the prompt,
    /// or after a preemption the prompt and the generated ids.
    pub feed: Vec<u32>,
    /// Tokens of `feed` already in `state`.
    pub fed: usize,
    /// The token to feed next once decoding.
    pub next: Option<u32>,
    pub ids: Vec<u32>,
    /// Each new token's logprob, when the request asks for them.
    pub logprobs: Option<Vec<TokenLogprob>>,
    pub text: String,
    pub started: Instant,
    pub stats: Stats,
    /// The expert store's counters when it was admitted (streamed experts).
    pub store_before: Option<StoreStats>,
    pub decode_steps: usize,
    /// Its place in the order of admissions (a readmission takes a new one).
    pub admitted: u64,
    /// Times its state was dropped to make room.
    pub preemptions: usize,
}

impl<'e> Seq<'e> {
    /// A queued sequence for `job` (checked), allowed `max_new` tokens.
    pub(super) fn new(id: u64, job: Job, sink: Box<dyn RequestSink + 'e>, max_new: usize, sampler: Sampler, stops: StopFilter) -> Self {
        let Job {
            prompt,
            options,
            drafter,
            record_routes,
            adjust,
            constraint,
            logprobs,
            keep_special_tokens,
            ..
        } = job;
        Seq {
            id,
            feed: prompt.clone(),
            stats: Stats {
                prompt_tokens: prompt.len(),
                ..Stats::default()
            },
            prompt,
            stop_at_eos: options.stop_at_eos,
            sink,
            max_new,
            // Made at admission: a queued request holds no state (a
            // recurrent layer's would take its fixed size at once).
            state: SequenceState::default(),
            points: ReturnPoints::new(),
            chooser: TokenChooser::new(sampler, adjust, constraint, logprobs),
            stops,
            decoder: match keep_special_tokens {
                true => StreamDecoder::keeping_special_tokens(),
                false => StreamDecoder::new(),
            },
            spec: drafter.map(|d| Speculation::new(d, options.draft_max)),
            routes: record_routes.map(RouteTrace::with_lookahead),
            fed: 0,
            next: None,
            ids: Vec::new(),
            logprobs: logprobs.map(|_| Vec::new()),
            text: String::new(),
            started: Instant::now(),
            store_before: None,
            decode_steps: 0,
            admitted: 0,
            preemptions: 0,
        }
    }

    /// Rows it adds to the state in the next forward pass: its pending token
    /// and this step's drafts when decoding, else the next prefill pass of
    /// its feed (the remaining feed cut into equal passes of at most `chunk`).
    pub(super) fn rows(&self, chunk: usize) -> usize {
        match self.next {
            Some(_) => 1 + self.spec.as_ref().map_or(0, |s| s.drafts().len()),
            None => passes(self.feed.len() - self.fed, chunk).first().copied().unwrap_or(0),
        }
    }

    /// Where a state that cannot roll back (a recurrent layer) is
    /// snapshotted: after the prompt minus its last token, the point a later
    /// request sharing the prompt returns to (crate::return_points).
    /// `None` for a state that rolls back, or a one-token prompt.
    pub(super) fn return_point(&self) -> Option<usize> {
        let point = self.prompt.len() - 1;
        (!self.state.can_rollback() && point > 0).then_some(point)
    }

    /// Rows into its next pass (of `rows` rows) after which its return point
    /// lies, when it has none kept there yet: the pass snapshots it there
    /// ([`SequenceState::mark_after`]), so the prompt's last token runs in
    /// the same pass as the rest and its experts are read once.
    pub(super) fn snapshot_mark(&self, rows: usize) -> Option<usize> {
        let p = self.return_point()?;
        let here = self.next.is_none() && self.state.len() == self.fed && (self.fed..self.fed + rows).contains(&p);
        (here && !self.points.lengths().contains(&p)).then(|| p - self.fed)
    }

    /// The ids of its next forward pass and the logits it wants back: every
    /// row's for a verification pass, else the last row's.
    pub(super) fn input(&self, chunk: usize) -> (Vec<u32>, Wanted) {
        match self.next {
            Some(t) => match self.spec.as_ref().map(Speculation::drafts).filter(|d| !d.is_empty()) {
                Some(drafts) => (std::iter::once(t).chain(drafts.iter().copied()).collect(), Wanted::All),
                None => (vec![t], Wanted::Last),
            },
            None => {
                let end = self.fed + self.rows(chunk);
                (self.feed[self.fed..end].to_vec(), Wanted::Last)
            }
        }
    }

    /// Whether it has been admitted and fed before (a preempted sequence).
    pub(super) fn resumed(&self) -> bool {
        self.preemptions > 0
    }

    /// Drops its state (`fresh`, an empty one, takes its place) so that,
    /// readmitted, it feeds its prompt and generated ids again; its chooser,
    /// stop filter, stream decoder and drafter stay as they are. A plain
    /// sequence feeds every generated id and samples from the last row's
    /// logits (what its next decode step would have computed); a drafting
    /// one feeds all but its pending token, which it then verifies with
    /// drafts as it would have: either way it goes on as if never stopped.
    pub(super) fn preempt(&mut self, fresh: SequenceState) {
        self.state = fresh;
        self.points.clear();
        let resent = match (&self.spec, self.ids.len()) {
            (Some(_), n) if n > 0 => n - 1,
            (_, n) => n,
        };
        self.feed = self.prompt.iter().chain(&self.ids[..resent]).copied().collect();
        if let Some(spec) = &mut self.spec {
            spec.discard();
        }
        self.fed = 0;
        self.next = None;
        self.preemptions += 1;
    }

    /// After a pass that fed the last of its feed: a drafting sequence fed
    /// again after a preemption takes its pending token back (`true`);
    /// anything else (a decode pass, a plain sequence, a prompt's last pass)
    /// samples from the pass's logits (`false`).
    pub(super) fn resume_pending(&mut self) -> bool {
        if self.next.is_some() || self.spec.is_none() || self.ids.is_empty() {
            return false;
        }
        self.next = self.ids.last().copied();
        true
    }

    /// Records a forward pass of `secs` that fed `rows` rows.
    pub(super) fn account(&mut self, rows: usize, last: bool, secs: f64) {
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

    /// Whether it was cancelled from elsewhere (its sink says so).
    pub(super) fn cancelled(&self) -> bool {
        self.sink.cancelled()
    }

    /// Records chosen token `t` (chosen from the model's `logits` at its
    /// position): commits it to the chooser, the text it releases goes to
    /// the sink with its logprob; says why it ends there (a stop string,
    /// cancelled, EOS, the constraint done, `max_new`), if it does. An error
    /// (the constraint refused the token) fails the request.
    pub(super) fn emit(&mut self, engine: &Engine, t: u32, logits: &[f32]) -> Result<Option<FinishReason>, EngineError> {
        self.chooser.commit(t)?;
        let logprob = self.chooser.logprob(logits, t);
        self.ids.push(t);
        if self.ids.len() == 1 {
            self.stats.time_to_first_token_s = self.started.elapsed().as_secs_f64();
        }
        // The EOS that ends it is never text (spelled only when special
        // tokens are kept).
        let ends = self.stop_at_eos && engine.generation_config().eos_token_ids.contains(&t);
        let piece = match engine.tokenizer() {
            Ok(tok) if !ends => self.decoder.push(tok, t).ok().flatten().unwrap_or_default(),
            _ => String::new(),
        };
        let (shown, hit) = self.stops.push(&piece);
        self.text.push_str(&shown);
        let go = self.sink.event(RequestEvent::Token {
            id: t,
            text: &shown,
            logprob: logprob.as_ref(),
        });
        if let (Some(all), Some(lp)) = (&mut self.logprobs, logprob) {
            all.push(lp);
        }
        if hit {
            return Ok(Some(FinishReason::Stop));
        }
        if !go || self.cancelled() {
            return Ok(Some(FinishReason::Cancelled));
        }
        if self.stop_at_eos && engine.generation_config().eos_token_ids.contains(&t) {
            return Ok(Some(FinishReason::Stop));
        }
        if self.chooser.is_done() {
            return Ok(Some(FinishReason::Stop));
        }
        Ok((self.ids.len() >= self.max_new).then_some(FinishReason::Length))
    }

    /// Whether the context has no room for its pending token.
    pub(super) fn context_full(&self, engine: &Engine) -> bool {
        self.state.len() + 1 > engine.model().spec().max_position_embeddings
    }
}

/// Samples `s`'s next token from `logits` as the single-sequence loop does;
/// returns why it ends, or `None` to go on with the token as its next
/// input; an error (from its constraint) fails it.
pub(super) fn sample_one(engine: &Engine, s: &mut Seq<'_>, logits: &[f32]) -> Result<Option<FinishReason>, EngineError> {
    // A constraint complete before any token (an empty grammar) is never asked.
    if s.chooser.is_done() {
        return Ok(Some(FinishReason::Stop));
    }
    let next = s.chooser.sample(logits)?;
    // A decode pass without drafts (not the prompt's last pass).
    if let (Some(spec), Some(_)) = (&mut s.spec, s.next) {
        spec.plain_step();
    }
    if let Some(reason) = s.emit(engine, next, logits)? {
        return Ok(Some(reason));
    }
    if s.context_full(engine) {
        return Ok(Some(FinishReason::Length));
    }
    s.next = Some(next);
    Ok(None)
}

/// Ends `s`: releases held text, sends `Finished`; returns the tokens its
/// state holds (one per position), the state and its snapshots, for the
/// prefix cache.
pub(super) fn finish(engine: &Engine, mut s: Seq<'_>, reason: FinishReason) -> (Vec<u32>, SequenceState, ReturnPoints) {
    let tail = s.stops.finish();
    if !tail.is_empty() {
        s.text.push_str(&tail);
        s.sink.event(RequestEvent::Text(&tail));
    }
    s.stats.new_tokens = s.ids.len();
    match s.spec.take() {
        // Tokens after the first per second of target forwards (several per verification pass).
        Some(spec) => {
            s.stats.finish(s.ids.len().saturating_sub(1));
            s.stats.speculative = Some(spec.into_stats());
        }
        None => s.stats.finish(s.decode_steps),
    }
    s.stats.record_state(&s.state, s.points.bytes());
    if let (Some(store), Some(before)) = (engine.store(), &s.store_before) {
        s.stats.experts = Some(ExpertStats::from_store(store.backend().name(), &store.stats().since(before)));
    }
    let outcome = Outcome {
        finish_reason: reason,
        stop_string: s.stops.matched().map(str::to_string),
        prompt_tokens: s.prompt.len(),
        cached_tokens: s.stats.cached_tokens,
        ids: std::mem::take(&mut s.ids),
        text: std::mem::take(&mut s.text),
        stats: s.stats.clone(),
        routes: s.routes.take(),
        logprobs: s.logprobs.take(),
    };
    s.sink.event(RequestEvent::Finished(&outcome));
    let tokens = s.prompt.iter().chain(&outcome.ids).copied().take(s.state.len()).collect();
    (tokens, s.state, s.points)
}
