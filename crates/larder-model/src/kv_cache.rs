//! Key/value storage of one attention layer ([`KvLayer`]): the post-RoPE keys
//! and the values of every position seen so far, as a
//! [`LayerState::Kv`](crate::state::LayerState::Kv) holds them. Rolling back
//! is a truncation (speculative decoding rejects drafted positions this way).
//!
//! Also the transitional names of the old whole-model cache: [`KvCache`] is
//! now [`SequenceState`], with `truncate` and `DecoderModel::new_cache` kept
//! as thin wrappers until every caller moves over.

use crate::state::SequenceState;

/// Keys and values of one layer: `len` positions of `k_dim` key floats and
/// `v_dim` value floats each (equal for GQA; MLA's differ).
#[derive(Debug, Clone, Default)]
pub struct KvLayer {
    k_dim: usize,
    v_dim: usize,
    keys: Vec<f32>,
    values: Vec<f32>,
}

impl KvLayer {
    pub fn new(k_dim: usize, v_dim: usize) -> Self {
        KvLayer {
            k_dim,
            v_dim,
            keys: Vec::new(),
            values: Vec::new(),
        }
    }

    /// Number of cached positions.
    pub fn len(&self) -> usize {
        self.keys.len() / self.k_dim.max(1)
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Appends one position.
    pub fn push(&mut self, key: &[f32], value: &[f32]) {
        debug_assert_eq!(key.len(), self.k_dim);
        debug_assert_eq!(value.len(), self.v_dim);
        self.keys.extend_from_slice(key);
        self.values.extend_from_slice(value);
    }

    pub fn key(&self, pos: usize) -> &[f32] {
        &self.keys[pos * self.k_dim..(pos + 1) * self.k_dim]
    }

    pub fn value(&self, pos: usize) -> &[f32] {
        &self.values[pos * self.v_dim..(pos + 1) * self.v_dim]
    }

    /// Keeps the first `len` positions (no-op when it holds fewer).
    pub fn truncate(&mut self, len: usize) {
        self.keys.truncate(len * self.k_dim);
        self.values.truncate(len * self.v_dim);
    }

    /// Key and value floats per position.
    pub fn dims(&self) -> (usize, usize) {
        (self.k_dim, self.v_dim)
    }

    /// Bytes held by the positions (keys and values, f32).
    pub fn bytes(&self) -> usize {
        (self.keys.len() + self.values.len()) * 4
    }
}

/// Transitional: use [`SequenceState`].
pub type KvCache = SequenceState;

impl SequenceState {
    /// Transitional: use [`SequenceState::rollback`] (or, for models with
    /// recurrent layers, [`SequenceState::restore`]). Keeps the first `len`
    /// positions; a `len` at or beyond the current length changes nothing. A
    /// recurrent layer cannot truncate: the state is then marked unusable and
    /// its next forward pass is an error saying so (until `clear` or
    /// `restore`), never a silently wrong result.
    pub fn truncate(&mut self, len: usize) {
        if len < self.len() {
            if let Err(e) = self.rollback(len) {
                self.set_unusable(format!("truncated without a snapshot: {e}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_drops_tail() {
        let mut c = KvLayer::new(2, 2);
        for p in 0..3 {
            c.push(&[p as f32, 0.0], &[0.0, p as f32]);
        }
        assert_eq!(c.len(), 3);
        assert_eq!(c.bytes(), 3 * 4 * 4);
        c.truncate(1);
        assert_eq!(c.len(), 1);
        assert_eq!(c.key(0), &[0.0, 0.0]);
        assert_eq!(c.value(0), &[0.0, 0.0]);
    }
}
