//! Taking a sequence's state back to the kept prefix after speculative
//! tokens were run (the protocol is on [`rewind`]).

use larder_model::{ModelError, SequenceState, StateSnapshot};

/// Takes `state` back to its first `keep` positions. `snap` was taken
/// before `fed` was run (so the state holds `snap.len() + fed.len()`
/// positions), and `keep` lies between `snap.len()` and that. `run_again`
/// runs tokens on the state (the same model and mode as the first time); it
/// is called only when the state cannot roll back. An error (a
/// [`ModelError::State`] naming the lengths) when the lengths disagree.
///
/// Speculative tokens are the target's verification pass
/// `[pending, d1..dk]`, or a draft model's own guesses. Nothing here assumes
/// the state can truncate.
///
/// The protocol, for every caller:
/// 1. take a [`StateSnapshot`] **before** running the speculative tokens
///    (for KV layers it is just a length, so it costs nothing);
/// 2. run them (one batched pass, or several);
/// 3. decide how many to keep, then [`rewind`] to that length.
///
/// [`rewind`] picks the way back from the state:
/// - every layer keeps keys and values (GQA, MLA): roll back
///   ([`SequenceState::rollback`], a truncation, no model pass);
/// - a recurrent layer (linear attention such as Kimi Linear's KDA) folds
///   every position into a fixed-size state and cannot drop positions
///   ([`SequenceState::can_rollback`] is false): [`refeed`] restores the
///   snapshot (which for such a layer holds a copy of its state) and runs
///   the kept tokens again in one pass. The verification pass computed those
///   same positions from the same state, so by batch invariance (design §3)
///   the re-run gives the same state bit for bit, provided the recurrent
///   mixer, like attention, computes each position the same whatever the
///   pass's length (the rule prefill chunks already need). It costs one more
///   forward over the kept rows per verification pass; a later refinement
///   may keep the per-position states of the verification pass and pick the
///   kept one instead, behind the same protocol.
pub fn rewind(
    state: &mut SequenceState,
    snap: &StateSnapshot,
    fed: &[u32],
    keep: usize,
    run_again: impl FnOnce(&[u32], &mut SequenceState) -> Result<(), ModelError>,
) -> Result<(), ModelError> {
    let held = snap.len() + fed.len();
    if state.len() != held || keep < snap.len() || keep > held {
        return Err(ModelError::State(format!(
            "cannot rewind to {keep} positions: the state holds {} positions, the snapshot {} plus {} tokens run since",
            state.len(),
            snap.len(),
            fed.len()
        )));
    }
    if state.can_rollback() {
        state.rollback(keep)
    } else {
        refeed(state, snap, &fed[..keep - snap.len()], run_again)
    }
}

/// The way back for a state that cannot roll back (any state may take it):
/// restores `snap`, then runs `kept` (the tokens to keep after it) again with
/// `run_again`.
pub fn refeed(
    state: &mut SequenceState,
    snap: &StateSnapshot,
    kept: &[u32],
    run_again: impl FnOnce(&[u32], &mut SequenceState) -> Result<(), ModelError>,
) -> Result<(), ModelError> {
    state.restore(snap)?;
    if kept.is_empty() {
        Ok(())
    } else {
        run_again(kept, state)
    }
}
