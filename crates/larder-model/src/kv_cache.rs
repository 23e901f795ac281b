//! Key/value storage of one attention layer ([`KvLayer`]): the post-RoPE keys
//! and the values of every position seen so far, as a
//! [`LayerState::Kv`](crate::state::LayerState::Kv) holds them. Rolling back
//! is a truncation, done only through
//! [`SequenceState::rollback`](crate::state::SequenceState::rollback).

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

    /// A layer holding `keys` and `values` as read back from disk
    /// (`crate::state_io` checks their lengths against the dims).
    pub(crate) fn from_parts(k_dim: usize, v_dim: usize, keys: Vec<f32>, values: Vec<f32>) -> Self {
        KvLayer {
            k_dim,
            v_dim,
            keys,
            values,
        }
    }

    /// Every position's keys, then every position's values.
    pub(crate) fn parts(&self) -> (&[f32], &[f32]) {
        (&self.keys, &self.values)
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

    /// Keeps the first `len` positions (no-op when it holds fewer). Callers
    /// go through `SequenceState::rollback`, which keeps the sequence's
    /// length in step.
    pub(crate) fn truncate(&mut self, len: usize) {
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
