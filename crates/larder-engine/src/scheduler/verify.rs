//! Verification of a drafting sequence's pass (see `speculation` for the
//! whole loop): keeps drafts while larder-spec's [`accept_draft`] accepts
//! them, emits the replacement or bonus token from the first rejected (or
//! last) row, and takes the state back to `pending + kept drafts` through
//! [`larder_spec::rewind`].

use larder_spec::{accept_draft, rewind, Decision};
use larder_tensor::Mat;

use super::sequence::Seq;
use super::speculation::Speculation;
use crate::engine::{Engine, FinishReason};
use crate::error::EngineError;

/// Most guesses `s` may have this step: up to `max_new` and the context.
pub(super) fn room(engine: &Engine, s: &Seq<'_>) -> usize {
    let max_ctx = engine.model().spec().max_position_embeddings;
    (s.max_new - s.ids.len()).min(max_ctx.saturating_sub(s.state.len() + 1))
}

/// Verifies `s`'s drafts against `logits` (one row per token of its pass:
/// pending, then each draft), emits what is kept and the model's next token,
/// and takes the state back to what was kept; returns why `s` ends, if it
/// does. An error (a rewind that failed) fails the request.
pub(super) fn verify(engine: &Engine, s: &mut Seq<'_>, logits: &Mat) -> Result<Option<FinishReason>, EngineError> {
    let Some(mut spec) = s.spec.take() else {
        return Err(internal("a verification pass for a sequence without a drafter"));
    };
    let outcome = verify_with(engine, s, &mut spec, logits);
    s.spec = Some(spec);
    outcome
}

fn verify_with(engine: &Engine, s: &mut Seq<'_>, spec: &mut Speculation, logits: &Mat) -> Result<Option<FinishReason>, EngineError> {
    let (drafts, before) = spec.take_pass();
    let (Some(before), Some(pending)) = (before, s.next) else {
        return Err(internal("a verification pass without its snapshot or pending token"));
    };
    let (mut kept, mut stop, mut next) = (0, None, pending);
    for i in 0..=drafts.len() {
        // Over what the constraint allows: a forbidden draft has
        // probability 0 and is rejected like any other mismatch.
        let dist = s.chooser.distribution(logits.row(i))?;
        let (token, accepted) = if i == drafts.len() {
            (s.chooser.draw(&dist), false)
        } else {
            let u = s.chooser.uniform();
            let chooser = &mut s.chooser;
            match accept_draft(&dist, drafts[i], u, &mut |r| chooser.draw(r)) {
                Decision::Accept => (drafts[i], true),
                Decision::Replace(t) => (t, false),
            }
        };
        kept += usize::from(accepted);
        if let Some(reason) = s.emit(engine, token, logits.row(i))? {
            stop = Some(reason);
            break;
        }
        if !accepted {
            next = token;
            break;
        }
    }
    spec.verified(drafts.len(), kept);
    let rows: Vec<u32> = std::iter::once(pending).chain(drafts).collect();
    let model = engine.model();
    rewind(&mut s.state, &before, &rows, before.len() + 1 + kept, |kept_rows, state| {
        model.forward_last(kept_rows, state, None).map(drop)
    })?;
    if stop.is_some() {
        return Ok(stop);
    }
    s.next = Some(next);
    Ok(s.context_full(engine).then_some(FinishReason::Length))
}

fn internal(what: &str) -> EngineError {
    EngineError::Invalid {
        field: "draft",
        message: format!("internal: {what}"),
    }
}
