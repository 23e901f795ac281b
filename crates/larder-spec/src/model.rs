//! A draft model: any checkpoint larder can run that shares the target's
//! vocabulary, kept in RAM with its own sequence state; or the **target itself**
//! in its cache-resident mode (every MoE layer uses only experts already in
//! RAM, router weights rescaled over them: drafting costs no expert I/O).
//! It drafts greedily; its state follows the context: before each guess it
//! goes back to the longest common prefix of what it ran and the new context
//! (through [`rewind`](crate::rewind()) from a snapshot taken before
//! its last guesses, so a recurrent draft model works too).

use std::sync::Arc;

use larder_model::{DecoderModel, ModelError, SequenceState, StateSnapshot};
use larder_tensor::ops::argmax;

use crate::rewind::rewind;
use crate::{Drafter, SpecError};

pub struct ModelDrafter {
    model: Arc<DecoderModel>,
    state: SequenceState,
    /// Tokens whose state is in `state`.
    fed: Vec<u32>,
    /// `state` after the last context was run, before the guesses after it.
    before_guesses: StateSnapshot,
    /// Self-draft: the target in its cache-resident mode.
    resident_only: bool,
}

impl ModelDrafter {
    /// A drafter over `model`, which must have `target_vocab` tokens.
    pub fn new(model: Arc<DecoderModel>, target_vocab: usize) -> Result<Self, SpecError> {
        let vocab = model.spec().vocab_size;
        if vocab != target_vocab {
            return Err(SpecError::Invalid(format!(
                "the draft model has {vocab} tokens, the target {target_vocab}: they must share one vocabulary"
            )));
        }
        Ok(Self::over(model, false))
    }

    /// The cache-resident self-draft over the target `model` itself.
    pub fn self_draft(model: Arc<DecoderModel>) -> Self {
        Self::over(model, true)
    }

    fn over(model: Arc<DecoderModel>, resident_only: bool) -> Self {
        let state = model.new_state();
        ModelDrafter {
            before_guesses: state.snapshot(),
            state,
            model,
            fed: Vec::new(),
            resident_only,
        }
    }

    fn step(&mut self, ids: &[u32]) -> Result<Vec<f32>, SpecError> {
        Ok(run(&self.model, self.resident_only, ids, &mut self.state)?)
    }

    /// Goes back to (at most) the first `keep` tokens run; returns how many
    /// are kept: `keep`, or 0 when the context left what was run before the
    /// last guesses and the state cannot roll back that far.
    fn go_back(&mut self, keep: usize) -> Result<usize, SpecError> {
        let snap = &self.before_guesses;
        let keep = if keep >= snap.len() {
            let (model, resident_only) = (&self.model, self.resident_only);
            let guesses = &self.fed[snap.len()..];
            rewind(&mut self.state, snap, guesses, keep, |ids, state| {
                run(model, resident_only, ids, state).map(drop)
            })?;
            keep
        } else if self.state.can_rollback() {
            self.state.rollback(keep)?;
            keep
        } else {
            self.state.clear();
            0
        };
        self.fed.truncate(keep);
        self.before_guesses = self.state.snapshot();
        Ok(keep)
    }
}

/// The last position's logits of `ids` run on `state` (cache-resident when
/// `resident_only`).
fn run(model: &DecoderModel, resident_only: bool, ids: &[u32], state: &mut SequenceState) -> Result<Vec<f32>, ModelError> {
    if resident_only {
        model.forward_last_resident(ids, state)
    } else {
        model.forward_last(ids, state, None)
    }
}

impl Drafter for ModelDrafter {
    fn name(&self) -> &'static str {
        if self.resident_only {
            "self"
        } else {
            "model"
        }
    }

    fn propose(&mut self, context: &[u32], k: usize) -> Result<Vec<u32>, SpecError> {
        if k == 0 || context.is_empty() {
            return Ok(Vec::new());
        }
        let max = self.model.spec().max_position_embeddings;
        let k = k.min(max.saturating_sub(context.len()));
        if k == 0 {
            return Ok(Vec::new());
        }
        // Keep the common prefix (at least one token must run for logits).
        let common = self.fed.iter().zip(context).take_while(|(a, b)| a == b).count();
        let keep = self.go_back(common.min(context.len() - 1))?;
        let mut logits = self.step(&context[keep..])?;
        self.fed.extend_from_slice(&context[keep..]);
        self.before_guesses = self.state.snapshot();
        let mut out = Vec::with_capacity(k);
        for i in 0..k {
            let t = argmax(&logits);
            out.push(t);
            if i + 1 < k {
                logits = self.step(&[t])?;
                self.fed.push(t);
            }
        }
        Ok(out)
    }
}
