//! The key/value cache: per layer, the post-RoPE keys and the values of every
//! position seen so far. `truncate` rolls it back (speculative decoding
//! rejects drafted positions this way).

/// Keys and values of one layer: `len` positions of `k_dim` key floats and
/// `v_dim` value floats each (equal for GQA; MLA's differ).
#[derive(Debug, Clone, Default)]
pub struct LayerCache {
    k_dim: usize,
    v_dim: usize,
    keys: Vec<f32>,
    values: Vec<f32>,
}

impl LayerCache {
    pub fn new(k_dim: usize, v_dim: usize) -> Self {
        LayerCache {
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

    pub fn truncate(&mut self, len: usize) {
        self.keys.truncate(len * self.k_dim);
        self.values.truncate(len * self.v_dim);
    }
}

/// The cache of a whole model.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    layers: Vec<LayerCache>,
}

impl KvCache {
    /// An empty cache for `num_layers` layers of `k_dim` key and `v_dim`
    /// value floats per position.
    pub fn new(num_layers: usize, k_dim: usize, v_dim: usize) -> Self {
        KvCache {
            layers: (0..num_layers).map(|_| LayerCache::new(k_dim, v_dim)).collect(),
        }
    }

    /// Cached positions (the same in every layer between forward passes).
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, LayerCache::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps the first `len` positions, dropping the rest.
    pub fn truncate(&mut self, len: usize) {
        for l in &mut self.layers {
            l.truncate(len);
        }
    }

    pub fn clear(&mut self) {
        self.truncate(0);
    }

    pub fn layer_mut(&mut self, i: usize) -> &mut LayerCache {
        &mut self.layers[i]
    }

    /// Bytes held (keys and values, f32).
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|l| (l.keys.len() + l.values.len()) * 4).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_drops_tail() {
        let mut c = KvCache::new(2, 2, 2);
        for p in 0..3 {
            for l in 0..2 {
                c.layer_mut(l).push(&[p as f32, 0.0], &[0.0, p as f32]);
            }
        }
        assert_eq!(c.len(), 3);
        c.truncate(1);
        assert_eq!(c.len(), 1);
        assert_eq!(c.layer_mut(1).key(0), &[0.0, 0.0]);
    }
}
