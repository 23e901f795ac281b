//! Speculative decoding inside the scheduler: a sequence with a drafter
//! ([`Speculation`]) contributes its verification rows to the batched step.
//!
//! Each step a decoding sequence first asks its drafter for up to `k`
//! guesses (`k` from larder-spec's [`AdaptiveK`]; the first decode step is
//! plain, it calibrates what a token costs; never past `max_new` or the
//! context), and its rows in the step's `forward_batch` are `[pending,
//! d1..dk]` (pending: the last chosen token, not yet fed), every row's
//! logits wanted. Row `i` is the model's distribution after `d_i` (row 0:
//! after pending), bit-identical to one-token steps (batch invariance,
//! docs/design.md §3), whatever else shares the pass. [`verify`] then keeps
//! drafts while larder-spec's [`accept_draft`] accepts them (greedy-exact,
//! or speculative sampling's distribution-preserving rule), emits the
//! replacement or bonus token from the first rejected (or last) row, and
//! takes the state back to `pending + kept drafts` through
//! [`larder_spec::rewind`] from a snapshot taken just before the pass (a
//! truncation for KV; for a recurrent layer the snapshot restored and the
//! kept tokens run again, alone). The replacement/bonus token becomes
//! pending. This is, row for row and draw for draw, the loop a request
//! decoding alone runs, so its ids are those of a solo run with the same
//! drafter and seed.

use std::time::Instant;

use larder_model::{SequenceState, StateSnapshot};
use larder_spec::{AdaptiveK, Drafter, SpecStats};

use crate::error::EngineError;
use crate::stats::SpeculativeStats;

/// A sequence's drafter, draft length and counters, and this step's drafts.
pub(super) struct Speculation {
    drafter: Box<dyn Drafter>,
    adapt: AdaptiveK,
    stats: SpecStats,
    /// Guesses for this step's verification pass (empty: a plain step).
    drafts: Vec<u32>,
    /// The state just before this step's verification pass.
    before: Option<StateSnapshot>,
    /// Seconds the last forward pass it took part in took.
    pass_s: f64,
}

impl Speculation {
    /// Speculative decoding with `drafter`, at most `draft_max` guesses a pass.
    pub(super) fn new(drafter: Box<dyn Drafter>, draft_max: usize) -> Self {
        Speculation {
            stats: SpecStats {
                drafter: drafter.name().to_string(),
                ..SpecStats::default()
            },
            drafter,
            adapt: AdaptiveK::new(draft_max),
            drafts: Vec::new(),
            before: None,
            pass_s: 0.0,
        }
    }

    /// This step's guesses.
    pub(super) fn drafts(&self) -> &[u32] {
        &self.drafts
    }

    /// Forgets this step's guesses (the sequence was preempted before its pass).
    pub(super) fn discard(&mut self) {
        self.drafts.clear();
        self.before = None;
    }

    /// Asks for up to `room` guesses following `context` (the prompt and
    /// every chosen token, pending included), as many as the adaptive
    /// length allows; none on the first decode step.
    pub(super) fn propose(&mut self, context: &[u32], room: usize) -> Result<(), EngineError> {
        self.discard();
        let k = if self.stats.target_steps == 0 {
            0
        } else {
            self.adapt.k().min(room)
        };
        if k == 0 {
            return Ok(());
        }
        let started = Instant::now();
        let mut drafts = self.drafter.propose(context, k).map_err(|e| EngineError::Invalid {
            field: "draft",
            message: e.to_string(),
        })?;
        drafts.truncate(k);
        self.drafts = drafts;
        self.stats.draft_s += started.elapsed().as_secs_f64();
        Ok(())
    }

    /// Takes the snapshot this step's verification pass rewinds from (only
    /// when it has drafts).
    pub(super) fn snapshot_before(&mut self, state: &SequenceState) {
        if !self.drafts.is_empty() {
            self.before = Some(state.snapshot());
        }
    }

    /// Records the time of a forward pass it took part in.
    pub(super) fn timed(&mut self, secs: f64) {
        self.pass_s = secs;
    }

    /// After a decode pass without drafts: one plain target step.
    pub(super) fn plain_step(&mut self) {
        self.stats.target_steps += 1;
        self.adapt.plain_step(self.pass_s);
    }

    /// Takes this step's guesses and the snapshot taken before its pass,
    /// for verification.
    pub(super) fn take_pass(&mut self) -> (Vec<u32>, Option<StateSnapshot>) {
        (std::mem::take(&mut self.drafts), self.before.take())
    }

    /// Counts a verification pass that kept `kept` of `drafted` guesses and
    /// adapts the draft length to it.
    pub(super) fn verified(&mut self, drafted: usize, kept: usize) {
        self.stats.target_steps += 1;
        self.stats.verify_steps += 1;
        self.stats.drafted += drafted as u64;
        self.stats.accepted += kept as u64;
        self.adapt.verified(drafted, kept, self.pass_s);
    }

    /// The counters `stats.speculative` reports.
    pub(super) fn into_stats(mut self) -> SpeculativeStats {
        self.stats.disabled = self.adapt.is_off();
        SpeculativeStats::from(&self.stats)
    }
}
