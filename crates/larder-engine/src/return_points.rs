//! Where a sequence may go back to: [`ReturnPoints`], the snapshots a
//! sequence keeps so that a later request sharing only part of it (prefix
//! reuse) continues from there instead of prefilling from the start.
//!
//! A model whose layers all keep KV state goes back to any earlier length by
//! truncation ([`SequenceState::rollback`]); for it nothing is kept here and
//! going back is exactly the rollback it always was. A model with a recurrent
//! layer (Kimi Linear's KDA) cannot truncate: its state folds every position
//! in. For it a sequence keeps [`StateSnapshot`]s (each a copy of every
//! recurrent layer's fixed-size state; KV layers are truncated on restore):
//!
//! - **Policy.** A snapshot is taken at the points a sequence may return to:
//!   after its prompt minus the last token (a follow-up turn or a
//!   regeneration that shares the prompt returns there, and feeds the last
//!   prompt token again for its logits), and at the end of a turn (the
//!   conversation's whole state: the scheduler's prefix cache keeps that
//!   state itself, so it takes only the first kind). Prefill-chunk ends are not snapshotted:
//!   a snapshot is the recurrent state's full size (MiBs per KDA layer at
//!   K3 shapes), so one per chunk would cost more memory than it saves.
//!   At most [`MAX_RETURN_POINTS`] are kept per sequence, the oldest dropped.
//! - **Going back** ([`keep_prefix`](ReturnPoints::keep_prefix)) to `wanted`
//!   positions restores the nearest snapshot at or before `wanted` (or keeps
//!   the state when it holds no more than `wanted`) and drops every snapshot
//!   beyond the point returned to: what comes next overwrites them. With
//!   no snapshot that fits, the state starts empty (a full prefill).
//!
//! Restoring is exact ([`SequenceState::restore`]), so the positions fed
//! after it give logits bit-identical to a fresh prefill (batch invariance,
//! docs/design.md §3).

use larder_model::{SequenceState, StateSnapshot};

use crate::error::EngineError;

/// Most snapshots one sequence keeps (older ones are dropped first).
pub(crate) const MAX_RETURN_POINTS: usize = 4;

/// The snapshots of one sequence, by increasing length; see the module docs.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReturnPoints {
    snapshots: Vec<StateSnapshot>,
}

impl ReturnPoints {
    /// No snapshot kept.
    pub(crate) fn new() -> Self {
        ReturnPoints::default()
    }

    /// Snapshots read back from disk (ascending lengths, as
    /// [`snapshots`](Self::snapshots) gave them).
    pub(crate) fn from_snapshots(mut snapshots: Vec<StateSnapshot>) -> Self {
        snapshots.sort_by_key(StateSnapshot::len);
        ReturnPoints { snapshots }
    }

    /// The snapshots, by increasing length.
    pub(crate) fn snapshots(&self) -> &[StateSnapshot] {
        &self.snapshots
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.snapshots.is_empty()
    }

    /// Bytes of recurrent state the snapshots copy (0 for KV-only models).
    pub(crate) fn bytes(&self) -> usize {
        self.snapshots.iter().map(StateSnapshot::bytes).sum()
    }

    /// Lengths of the kept snapshots, ascending.
    pub(crate) fn lengths(&self) -> Vec<usize> {
        self.snapshots.iter().map(StateSnapshot::len).collect()
    }

    /// Forgets every snapshot.
    pub(crate) fn clear(&mut self) {
        self.snapshots.clear();
    }

    /// Keeps a snapshot of `state` as it is now when `state` cannot roll back
    /// (a KV-only state needs none) and none is kept at that length yet.
    /// Returns whether one was taken.
    #[cfg(test)]
    pub(crate) fn record(&mut self, state: &SequenceState) -> bool {
        if state.can_rollback() {
            return false;
        }
        self.keep(state.snapshot())
    }

    /// Keeps `snap`, a snapshot of this sequence's state taken inside a pass
    /// ([`SequenceState::take_marked`]), as `record` keeps
    /// one of the state: `false` when empty or when one of its length is kept.
    pub(crate) fn keep(&mut self, snap: StateSnapshot) -> bool {
        if snap.is_empty() || self.snapshots.iter().any(|s| s.len() == snap.len()) {
            return false;
        }
        // Snapshots past this point belong to another continuation.
        self.snapshots.retain(|s| s.len() < snap.len());
        self.snapshots.push(snap);
        if self.snapshots.len() > MAX_RETURN_POINTS {
            self.snapshots.remove(0);
        }
        true
    }

    /// The longest length at or before `wanted` that `state` can go back to:
    /// `wanted` itself for a rollable state (or one holding no more than
    /// it), else the longest kept snapshot at or before it (0 when none).
    pub(crate) fn reachable(&self, state: &SequenceState, wanted: usize) -> usize {
        let keep = wanted.min(state.len());
        if keep == state.len() || state.can_rollback() {
            return keep;
        }
        self.snapshots
            .iter()
            .map(StateSnapshot::len)
            .filter(|&n| n <= keep)
            .max()
            .unwrap_or(0)
    }

    /// Takes `state` back to [`reachable`](Self::reachable)`(state, wanted)`
    /// positions (by rollback, by restoring a snapshot, or by clearing it)
    /// and returns that length; snapshots beyond it are dropped.
    pub(crate) fn keep_prefix(&mut self, state: &mut SequenceState, wanted: usize) -> Result<usize, EngineError> {
        let keep = self.reachable(state, wanted);
        if keep < state.len() {
            if state.can_rollback() {
                state.rollback(keep)?;
            } else if let Some(snap) = self.snapshots.iter().find(|s| s.len() == keep) {
                state.restore(snap)?;
            } else {
                state.clear();
            }
        }
        self.snapshots.retain(|s| s.len() <= keep);
        Ok(keep)
    }

    /// Keeps only the snapshots at or before `len` positions (for a copy of
    /// a state taken back to `len`).
    pub(crate) fn up_to(&self, len: usize) -> ReturnPoints {
        ReturnPoints {
            snapshots: self.snapshots.iter().filter(|s| s.len() <= len).cloned().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use larder_model::load_model;

    use super::*;

    const IDS: &[u32] = &[360, 386, 74, 15, 315, 217, 285, 254, 415, 327];

    fn model(name: &str) -> larder_model::DecoderModel {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name);
        load_model(&dir, None).unwrap()
    }

    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    #[test]
    fn a_recurrent_state_returns_to_its_nearest_snapshot_bit_identically() {
        for name in ["kimi_linear_tiny", "kimi_linear_mla_first"] {
            let m = model(name);
            let fresh = m.forward(IDS, &mut m.new_state(), None).unwrap().into_vec();
            let vocab = fresh.len() / IDS.len();
            let mut state = m.new_state();
            let mut points = ReturnPoints::new();
            m.forward(&IDS[..4], &mut state, None).unwrap();
            assert!(points.record(&state), "{name}: a recurrent state is snapshotted");
            assert!(!points.record(&state), "{name}: one snapshot per length");
            m.forward(&IDS[4..8], &mut state, None).unwrap();
            points.record(&state);
            // A diverging continuation after 6 positions: back to the snapshot at 4.
            assert_eq!(points.reachable(&state, 6), 4, "{name}");
            assert_eq!(points.keep_prefix(&mut state, 6).unwrap(), 4, "{name}");
            assert_eq!(points.lengths(), vec![4], "{name}: the later snapshot is dropped");
            let again = m.forward(&IDS[4..], &mut state, None).unwrap().into_vec();
            assert!(
                same_bits(&again, &fresh[4 * vocab..]),
                "{name}: logits after restore equal a fresh prefill"
            );
            // Before the first snapshot: nothing kept, a full prefill.
            assert_eq!(points.keep_prefix(&mut state, 3).unwrap(), 0, "{name}");
            assert!(state.is_empty() && points.is_empty(), "{name}");
        }
    }

    #[test]
    fn a_kv_state_rolls_back_and_keeps_no_snapshot() {
        let m = model("qwen3_moe_tiny");
        let mut state = m.new_state();
        let mut points = ReturnPoints::new();
        m.forward(&IDS[..6], &mut state, None).unwrap();
        assert!(!points.record(&state));
        assert_eq!(points.keep_prefix(&mut state, 3).unwrap(), 3);
        assert_eq!((state.len(), points.bytes()), (3, 0));
    }

    #[test]
    fn at_most_max_return_points_are_kept() {
        let m = model("kimi_linear_tiny");
        let mut state = m.new_state();
        let mut points = ReturnPoints::new();
        for t in IDS.iter().take(MAX_RETURN_POINTS + 2) {
            m.forward(&[*t], &mut state, None).unwrap();
            points.record(&state);
        }
        assert_eq!(points.lengths(), (3..=MAX_RETURN_POINTS + 2).collect::<Vec<_>>());
        assert_eq!(points.bytes(), MAX_RETURN_POINTS * state.snapshot().bytes());
        assert_eq!(points.up_to(4).lengths(), vec![3, 4]);
    }
}
