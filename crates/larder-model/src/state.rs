//! The state one sequence carries between forward passes ([`SequenceState`]):
//! one [`LayerState`] per decoder layer, chosen by the layer's mixer.
//!
//! - Attention layers (GQA and MLA) keep their keys and values
//!   ([`LayerState::Kv`], a [`KvLayer`]): going back to an earlier length is a
//!   truncation, and a [`StateSnapshot`] of them is just a length.
//! - A recurrent mixer (linear attention such as KDA) will keep a fixed-size
//!   state that folds every position in: it cannot truncate, so
//!   [`SequenceState::rollback`] will fail for it and the way back is
//!   [`SequenceState::restore`] of a snapshot that copies that state. Its
//!   variant is added with the first architecture that needs it.
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
}

impl LayerState {
    /// Bytes held for the positions seen so far.
    pub fn bytes(&self) -> usize {
        match self {
            LayerState::Kv(kv) => kv.bytes(),
        }
    }

    /// Whether this layer can go back to an earlier length on its own (KV:
    /// by truncation). A recurrent layer cannot: it returns only to a snapshot.
    pub fn can_rollback(&self) -> bool {
        match self {
            LayerState::Kv(_) => true,
        }
    }

    /// Back to the first `len` positions (`len` at most the current length).
    fn rollback(&mut self, len: usize) {
        match self {
            LayerState::Kv(kv) => kv.truncate(len),
        }
    }

    /// Whether this layer state has the shape `other`'s has (same mixer and
    /// widths): a state made by another model does not.
    pub(crate) fn same_shape(&self, other: &LayerState) -> bool {
        match (self, other) {
            (LayerState::Kv(a), LayerState::Kv(b)) => a.dims() == b.dims(),
        }
    }
}

/// Everything one sequence carries between forward passes; made empty by
/// `DecoderModel::new_state`.
#[derive(Debug, Clone, Default)]
pub struct SequenceState {
    layers: Vec<LayerState>,
    len: usize,
}

/// A point a [`SequenceState`] can return to with
/// [`restore`](SequenceState::restore). For KV layers it is just the length;
/// recurrent layers will add a copy of their state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateSnapshot {
    len: usize,
}

impl StateSnapshot {
    /// Positions the snapshot holds.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl SequenceState {
    /// An empty state with these per-layer states (each empty).
    pub fn new(layers: Vec<LayerState>) -> Self {
        SequenceState { layers, len: 0 }
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

    /// Bytes held (every layer's keys and values, f32); 0 when empty.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(LayerState::bytes).sum()
    }

    /// Forgets every position.
    pub fn clear(&mut self) {
        for l in &mut self.layers {
            l.rollback(0);
        }
        self.len = 0;
    }

    /// Whether [`rollback`](Self::rollback) can go back to any earlier length
    /// (every layer is KV). When not (a recurrent layer), the way back is
    /// [`restore`](Self::restore) of a snapshot taken at or before the target
    /// length, then running the positions after it again.
    pub fn can_rollback(&self) -> bool {
        self.layers.iter().all(LayerState::can_rollback)
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
        for l in &mut self.layers {
            l.rollback(len);
        }
        self.len = len;
        Ok(())
    }

    /// A point to [`restore`](Self::restore) later (cheap for KV layers).
    pub fn snapshot(&self) -> StateSnapshot {
        StateSnapshot { len: self.len }
    }

    /// Returns to `snap`. An error (the state unchanged) when the snapshot is
    /// beyond the current length: KV layers cannot regain dropped positions.
    pub fn restore(&mut self, snap: &StateSnapshot) -> Result<(), ModelError> {
        if snap.len > self.len {
            return Err(ModelError::State(format!(
                "cannot restore a snapshot of {} positions: the sequence holds only {} (positions dropped since \
                 the snapshot cannot come back; run them again)",
                snap.len, self.len
            )));
        }
        self.rollback(snap.len)
    }

    /// The state of layer `l`.
    pub fn layer(&self, l: usize) -> Option<&LayerState> {
        self.layers.get(l)
    }

    pub(crate) fn layer_mut(&mut self, l: usize) -> Option<&mut LayerState> {
        self.layers.get_mut(l)
    }

    pub(crate) fn set_len(&mut self, len: usize) {
        self.len = len;
    }

    /// Drops what a failed pass appended to the layers past `len`. (A
    /// recurrent layer will need its pre-pass state kept for this.)
    pub(crate) fn discard_uncommitted(&mut self) {
        let len = self.len;
        for l in &mut self.layers {
            l.rollback(len);
        }
    }

    /// Whether every layer has the shape `other`'s has (made by the same model).
    pub(crate) fn same_shape(&self, other: &SequenceState) -> bool {
        self.layers.len() == other.layers.len() && self.layers.iter().zip(&other.layers).all(|(a, b)| a.same_shape(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(n: usize) -> SequenceState {
        let mut s = SequenceState::new(vec![LayerState::Kv(KvLayer::new(2, 3)), LayerState::Kv(KvLayer::new(2, 3))]);
        for p in 0..n {
            for l in &mut s.layers {
                let LayerState::Kv(kv) = l;
                kv.push(&[p as f32; 2], &[p as f32; 3]);
            }
        }
        s.set_len(n);
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
}
