//! The state one sequence carries between forward passes ([`SequenceState`]):
//! one [`LayerState`] per decoder layer, chosen by the layer's mixer.
//!
//! - Attention layers (GQA and MLA) keep their keys and values
//!   ([`LayerState::Kv`], a [`KvLayer`]): going back to an earlier length is a
//!   truncation, and a [`StateSnapshot`] of them is just a length.
//! - Recurrent layers (Kimi Delta Attention, [`LayerState::Recurrent`], a
//!   [`RecurrentLayer`]) keep a fixed-size state that folds every position
//!   in: per head a K x V f32 matrix, plus the short-convolution window (the
//!   last `kernel - 1` pre-convolution inputs of q, k and v). It cannot be
//!   truncated, so [`SequenceState::rollback`] to a shorter length fails for
//!   it; the way back is [`SequenceState::restore`] of a snapshot, which for
//!   these layers holds a copy of the state (a [`StateSnapshot`] is therefore
//!   no longer just a length, nor `Copy`). Its size does not depend on the
//!   length: [`LayerState::bytes`] counts it whole from the first position.
//!
//! A forward pass that fails must leave every state as it was. KV layers drop
//! what the pass appended; a recurrent layer writes the pass's result into a
//! second buffer of the same size ([`RecurrentLayer::update`]) that becomes
//! the state only when the whole pass succeeded (`commit`), so a recurrent
//! layer holds (and `bytes` counts) its state twice.
//!
//! Positions are counted once for the whole sequence (`len`), so a layer
//! without a length of its own still agrees with the rest; a forward pass
//! advances it only when every layer succeeded.

use crate::error::ModelError;
use crate::kv_cache::KvLayer;

/// The state of one decoder layer for one sequence.
#[derive(Debug, Clone)]
pub enum LayerState {
    /// Keys and values of an attention layer (GQA, MLA).
    Kv(KvLayer),
    /// The fixed-size state of a recurrent mixer (KDA).
    Recurrent(RecurrentLayer),
}

impl LayerState {
    /// Bytes held: for KV layers, the positions seen so far; for recurrent
    /// layers, their fixed size (both buffers) whatever the length.
    pub fn bytes(&self) -> usize {
        match self {
            LayerState::Kv(kv) => kv.bytes(),
            LayerState::Recurrent(r) => r.bytes(),
        }
    }

    /// Whether this layer can go back to an earlier length on its own (KV:
    /// by truncation). A recurrent layer cannot: it returns only to a snapshot.
    pub fn can_rollback(&self) -> bool {
        match self {
            LayerState::Kv(_) => true,
            LayerState::Recurrent(_) => false,
        }
    }

    /// Bytes each further position adds (0 for a recurrent layer).
    pub fn bytes_per_position(&self) -> usize {
        match self {
            LayerState::Kv(kv) => (kv.dims().0 + kv.dims().1) * 4,
            LayerState::Recurrent(_) => 0,
        }
    }

    /// Forgets every position.
    fn clear(&mut self) {
        match self {
            LayerState::Kv(kv) => kv.truncate(0),
            LayerState::Recurrent(r) => r.reset(),
        }
    }

    /// Drops what an unfinished pass wrote beyond the first `len` positions.
    fn discard_uncommitted(&mut self, len: usize) {
        match self {
            LayerState::Kv(kv) => kv.truncate(len),
            LayerState::Recurrent(r) => {
                r.pending = false;
                r.mark = None;
                r.marked = None;
            }
        }
    }
}

/// The values of a recurrent (KDA) layer's state.
#[derive(Debug, Clone, PartialEq)]
pub struct RecurrentValues {
    /// `[heads, head_dim (key), head_dim (value)]`, f32.
    pub matrix: Vec<f32>,
    /// `[kernel - 1, channels]`: the last pre-convolution inputs, oldest
    /// first (zeros before the first position).
    pub window: Vec<f32>,
}

/// The state of one recurrent (KDA) layer: the committed values, and the
/// buffer a forward pass writes its result into until it commits.
#[derive(Debug, Clone)]
pub struct RecurrentLayer {
    heads: usize,
    head_dim: usize,
    channels: usize,
    kernel: usize,
    committed: RecurrentValues,
    work: RecurrentValues,
    /// `work` holds a pass's result not yet committed.
    pending: bool,
    /// A return point inside the next pass: copy the values after its first
    /// `mark` rows into `marked` ([`SequenceState::mark_after`]).
    mark: Option<usize>,
    marked: Option<RecurrentValues>,
}

impl RecurrentLayer {
    /// A zero state: `heads` matrices of `head_dim` x `head_dim`, and a
    /// window of `kernel - 1` rows of `channels` inputs.
    pub fn new(heads: usize, head_dim: usize, channels: usize, kernel: usize) -> Self {
        let zero = RecurrentValues {
            matrix: vec![0.0; heads * head_dim * head_dim],
            window: vec![0.0; kernel.saturating_sub(1) * channels],
        };
        RecurrentLayer {
            heads,
            head_dim,
            channels,
            kernel,
            work: zero.clone(),
            committed: zero,
            pending: false,
            mark: None,
            marked: None,
        }
    }

    /// Rows into the next pass after which the values are wanted (a
    /// return point inside the pass), if asked for.
    pub(crate) fn mark(&self) -> Option<usize> {
        self.mark
    }

    /// The values after the marked row, as the pass computed them.
    pub(crate) fn set_marked(&mut self, values: Option<RecurrentValues>) {
        self.marked = values;
    }

    /// A layer whose committed state is `values` (read back from disk; the
    /// lengths must match the dims, which `crate::state_io` checks).
    pub(crate) fn with_values(heads: usize, head_dim: usize, channels: usize, kernel: usize, values: &RecurrentValues) -> Self {
        let mut r = RecurrentLayer::new(heads, head_dim, channels, kernel);
        r.set(values);
        r
    }

    /// `(heads, head_dim, channels, kernel)`.
    pub fn dims(&self) -> (usize, usize, usize, usize) {
        (self.heads, self.head_dim, self.channels, self.kernel)
    }

    /// The committed values.
    pub fn values(&self) -> &RecurrentValues {
        &self.committed
    }

    /// Bytes held: both buffers, f32.
    pub fn bytes(&self) -> usize {
        let one = self.committed.matrix.len() + self.committed.window.len();
        2 * one * 4
    }

    /// Runs one pass's update: `f(source, result)` must write every value of
    /// `result` from `source` and the pass's inputs. The result stays
    /// uncommitted until the whole forward pass succeeds.
    pub(crate) fn update<R>(&mut self, f: impl FnOnce(&RecurrentValues, &mut RecurrentValues) -> R) -> R {
        let out = if self.pending {
            let source = self.work.clone();
            f(&source, &mut self.work)
        } else {
            f(&self.committed, &mut self.work)
        };
        self.pending = true;
        out
    }

    /// Makes a finished pass's result the state.
    fn commit(&mut self) {
        if self.pending {
            std::mem::swap(&mut self.committed, &mut self.work);
            self.pending = false;
        }
    }

    fn reset(&mut self) {
        self.committed.matrix.fill(0.0);
        self.committed.window.fill(0.0);
        self.pending = false;
    }

    fn set(&mut self, values: &RecurrentValues) {
        self.committed.matrix.copy_from_slice(&values.matrix);
        self.committed.window.copy_from_slice(&values.window);
        self.pending = false;
    }
}

/// Everything one sequence carries between forward passes; made empty by
/// `DecoderModel::new_state`.
#[derive(Debug, Clone, Default)]
pub struct SequenceState {
    layers: Vec<LayerState>,
    len: usize,
    /// The length a return point inside the next pass snapshots ([`mark_after`](Self::mark_after)).
    mark: Option<usize>,
}

/// A point a [`SequenceState`] can return to with
/// [`restore`](SequenceState::restore): the length, and a copy of every
/// recurrent layer's state (none for KV-only models, so cheap for them).
#[derive(Debug, Clone, PartialEq)]
pub struct StateSnapshot {
    len: usize,
    recurrent: Vec<(usize, RecurrentValues)>,
}

impl StateSnapshot {
    /// Positions the snapshot holds.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A snapshot read back from disk: `len` positions, and per recurrent
    /// layer (by index) its values.
    pub(crate) fn from_parts(len: usize, recurrent: Vec<(usize, RecurrentValues)>) -> Self {
        StateSnapshot { len, recurrent }
    }

    /// Per recurrent layer (by index), the values copied.
    pub(crate) fn recurrent(&self) -> &[(usize, RecurrentValues)] {
        &self.recurrent
    }

    /// Bytes of recurrent state the snapshot copies.
    pub fn bytes(&self) -> usize {
        self.recurrent.iter().map(|(_, v)| (v.matrix.len() + v.window.len()) * 4).sum()
    }
}

impl SequenceState {
    /// An empty state with these per-layer states (each empty).
    pub fn new(layers: Vec<LayerState>) -> Self {
        SequenceState {
            layers,
            len: 0,
            mark: None,
        }
    }

    /// A state of `len` positions made of `layers` (read back from disk;
    /// `crate::state_io` checks every layer holds `len` positions).
    pub(crate) fn from_layers(layers: Vec<LayerState>, len: usize) -> Self {
        SequenceState { layers, len, mark: None }
    }

    /// Positions seen so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Bytes held (every layer's keys and values, and recurrent states, f32);
    /// 0 when empty for a model without recurrent layers.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(LayerState::bytes).sum()
    }

    /// Forgets every position.
    pub fn clear(&mut self) {
        for l in &mut self.layers {
            l.clear();
        }
        self.len = 0;
    }

    /// The first recurrent layer, if any.
    fn first_recurrent(&self) -> Option<usize> {
        self.layers.iter().position(|l| matches!(l, LayerState::Recurrent(_)))
    }

    /// Whether [`rollback`](Self::rollback) can go back to any earlier length
    /// (every layer is KV). When not (a recurrent layer), the way back is
    /// [`restore`](Self::restore) of a snapshot taken at or before the target
    /// length, then running the positions after it again.
    pub fn can_rollback(&self) -> bool {
        self.layers.iter().all(LayerState::can_rollback)
    }

    /// Asks the next forward pass for a snapshot after its first `rows` rows
    /// (a return point inside the pass: the prompt minus its last token runs
    /// in the same pass as the last token, so its experts are read once);
    /// [`take_marked`](Self::take_marked) hands it over after the pass. A
    /// pass that fails drops the request.
    pub fn mark_after(&mut self, rows: usize) {
        self.mark = Some(self.len + rows);
        for l in &mut self.layers {
            if let LayerState::Recurrent(r) = l {
                r.mark = Some(rows);
                r.marked = None;
            }
        }
    }

    /// The snapshot the last pass took at its mark, if one was asked for and
    /// every recurrent layer took it; the request is then cleared.
    pub fn take_marked(&mut self) -> Option<StateSnapshot> {
        let len = self.mark.take()?;
        let mut recurrent = Vec::new();
        let mut whole = len <= self.len;
        for (i, l) in self.layers.iter_mut().enumerate() {
            if let LayerState::Recurrent(r) = l {
                r.mark = None;
                match r.marked.take() {
                    Some(v) => recurrent.push((i, v)),
                    None => whole = false,
                }
            }
        }
        whole.then_some(StateSnapshot { len, recurrent })
    }

    /// Goes back to the first `len` positions. An error (the state unchanged)
    /// when `len` is beyond the current length, or when a layer cannot return
    /// to `len` without a snapshot (a recurrent layer).
    pub fn rollback(&mut self, len: usize) -> Result<(), ModelError> {
        if len > self.len {
            return Err(ModelError::State(format!(
                "cannot roll back to {len} positions: the sequence holds only {}",
                self.len
            )));
        }
        if len == self.len {
            return Ok(());
        }
        if let Some(l) = self.first_recurrent() {
            return Err(ModelError::State(format!(
                "cannot roll back from {} to {len} positions: layer {l} is recurrent (linear attention), its state \
                 folds every position in and cannot be truncated; restore a snapshot taken at {len} positions instead",
                self.len
            )));
        }
        for l in &mut self.layers {
            l.discard_uncommitted(len);
        }
        self.len = len;
        Ok(())
    }

    /// A point to [`restore`](Self::restore) later: the length, and a copy of
    /// every recurrent layer's state.
    pub fn snapshot(&self) -> StateSnapshot {
        let recurrent = self
            .layers
            .iter()
            .enumerate()
            .filter_map(|(i, l)| match l {
                LayerState::Recurrent(r) => Some((i, r.values().clone())),
                LayerState::Kv(_) => None,
            })
            .collect();
        StateSnapshot { len: self.len, recurrent }
    }

    /// Returns to `snap` exactly. An error (the state unchanged) when the
    /// snapshot is beyond the current length (KV layers cannot regain dropped
    /// positions) or was taken of a state of another shape.
    pub fn restore(&mut self, snap: &StateSnapshot) -> Result<(), ModelError> {
        if snap.len > self.len {
            return Err(ModelError::State(format!(
                "cannot restore a snapshot of {} positions: the sequence holds only {} (positions dropped since \
                 the snapshot cannot come back; run them again)",
                snap.len, self.len
            )));
        }
        let mut mine = self.layers.iter().enumerate().filter_map(|(i, l)| match l {
            LayerState::Recurrent(r) => Some((i, r.values())),
            LayerState::Kv(_) => None,
        });
        let fits = snap.recurrent.len() == self.layers.iter().filter(|l| matches!(l, LayerState::Recurrent(_))).count()
            && snap.recurrent.iter().all(|(i, v)| {
                mine.next()
                    .is_some_and(|(j, w)| *i == j && v.matrix.len() == w.matrix.len() && v.window.len() == w.window.len())
            });
        if !fits {
            return Err(ModelError::State(
                "cannot restore a snapshot of a state of another model (its recurrent layers differ)".into(),
            ));
        }
        for (i, values) in &snap.recurrent {
            if let Some(LayerState::Recurrent(r)) = self.layers.get_mut(*i) {
                r.set(values);
            }
        }
        for l in &mut self.layers {
            if let LayerState::Kv(kv) = l {
                kv.truncate(snap.len);
            }
        }
        self.len = snap.len;
        Ok(())
    }

    /// The state of layer `l`.
    pub fn layer(&self, l: usize) -> Option<&LayerState> {
        self.layers.get(l)
    }

    pub(crate) fn layer_mut(&mut self, l: usize) -> Option<&mut LayerState> {
        self.layers.get_mut(l)
    }

    #[cfg(test)]
    pub(crate) fn layers_mut(&mut self) -> impl Iterator<Item = &mut LayerState> {
        self.layers.iter_mut()
    }

    /// Makes a successful pass's results the state: `len` positions, and
    /// every recurrent layer's new values.
    pub(crate) fn commit(&mut self, len: usize) {
        for l in &mut self.layers {
            if let LayerState::Recurrent(r) = l {
                r.commit();
            }
        }
        self.len = len;
    }

    /// Drops what a failed pass wrote: KV positions past `len`, recurrent
    /// layers' uncommitted results.
    pub(crate) fn discard_uncommitted(&mut self) {
        self.mark = None;
        let len = self.len;
        for l in &mut self.layers {
            l.discard_uncommitted(len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(n: usize) -> SequenceState {
        let mut s = SequenceState::new(vec![LayerState::Kv(KvLayer::new(2, 3)), LayerState::Kv(KvLayer::new(2, 3))]);
        for p in 0..n {
            for l in s.layers_mut() {
                if let LayerState::Kv(kv) = l {
                    kv.push(&[p as f32; 2], &[p as f32; 3]);
                }
            }
        }
        s.commit(n);
        s
    }

    #[test]
    fn rollback_snapshot_restore_and_clear() {
        let mut s = filled(4);
        assert_eq!((s.len(), s.bytes()), (4, 2 * 4 * 5 * 4));
        let snap = filled(2).snapshot();
        s.restore(&snap).unwrap();
        assert_eq!(s.len(), 2);
        assert!(s.rollback(3).is_err());
        assert!(s.restore(&filled(3).snapshot()).is_err());
        assert_eq!(s.len(), 2);
        s.rollback(1).unwrap();
        assert_eq!(s.bytes(), 2 * 5 * 4);
        s.clear();
        assert!(s.is_empty());
        assert_eq!(s.bytes(), 0);
    }

    /// A KV layer and a recurrent layer (2 heads of 2, 3 channels, kernel 3),
    /// `n` positions in, every recurrent value `n`.
    fn hybrid(n: usize) -> SequenceState {
        let mut s = SequenceState::new(vec![
            LayerState::Kv(KvLayer::new(1, 1)),
            LayerState::Recurrent(RecurrentLayer::new(2, 2, 3, 3)),
        ]);
        for p in 0..n {
            for l in s.layers_mut() {
                match l {
                    LayerState::Kv(kv) => kv.push(&[p as f32], &[p as f32]),
                    LayerState::Recurrent(r) => r.update(|_, out| {
                        out.matrix.fill(p as f32 + 1.0);
                        out.window.fill(p as f32 + 1.0);
                    }),
                }
            }
            s.commit(p + 1);
        }
        s
    }

    fn recurrent(s: &SequenceState) -> RecurrentValues {
        match s.layer(1) {
            Some(LayerState::Recurrent(r)) => r.values().clone(),
            _ => panic!("layer 1 is recurrent"),
        }
    }

    #[test]
    fn recurrent_layers_refuse_rollback_and_restore_snapshots_exactly() {
        let mut s = hybrid(3);
        let fixed = 2 * (2 * 2 * 2 + 2 * 3) * 4;
        assert_eq!(s.bytes(), 3 * 2 * 4 + fixed);
        assert_eq!(hybrid(0).bytes(), fixed, "a recurrent state's size does not depend on the length");
        let e = s.rollback(2).unwrap_err().to_string();
        assert!(e.contains("layer 1 is recurrent") && e.contains("snapshot"), "{e}");
        assert_eq!(s.len(), 3);
        s.rollback(3).unwrap();

        let snap = s.snapshot();
        assert_eq!(snap.bytes(), (8 + 6) * 4);
        let at3 = recurrent(&s);
        let mut longer = hybrid(5);
        longer.restore(&snap).unwrap();
        assert_eq!((longer.len(), recurrent(&longer)), (3, at3.clone()));
        assert!(hybrid(2).restore(&snap).is_err(), "positions dropped since the snapshot");
        assert!(filled(4).restore(&snap).is_err(), "another model's snapshot");

        // An uncommitted pass is dropped; clear zeroes the recurrent state.
        if let Some(LayerState::Recurrent(r)) = longer.layer_mut(1) {
            r.update(|_, out| out.matrix.fill(9.0));
        }
        longer.discard_uncommitted();
        assert_eq!(recurrent(&longer), at3);
        longer.clear();
        assert!(recurrent(&longer).matrix.iter().all(|&v| v == 0.0));
    }
}
