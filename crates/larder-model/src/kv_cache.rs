//! The key/value cache: per layer, the post-RoPE keys and the values of every
//! position seen so far. `truncate` rolls it back (speculative decoding
//! rejects drafted positions this way).

/// Keys and values of one layer, `len` positions of `kv_dim` floats each.
#[derive(Debug, Clone, Default)]
pub struct LayerCache {
    kv_dim: usize,
    keys: Vec<f32>,
    values: Vec<f32>,
}

impl LayerCache {
    pub fn new(kv_dim: usize) -> Self {
        LayerCache {
            kv_dim,
            keys: Vec::new(),
            values: Vec::new(),
        }
    }

    /// Number of cached positions.
    pub fn len(&self) -> usize {
        self.keys.len() / self.kv_dim.max(1)
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Appends one position.
    pub fn push(&mut self, key: &[f32], value: &[f32]) {
        debug_assert_eq!(key.len(), self.kv_dim);
        debug_assert_eq!(value.len(), self.kv_dim);
        self.keys.extend_from_slice(key);
        self.values.extend_from_slice(value);
    }

    pub fn key(&self, pos: usize) -> &[f32] {
        &self.keys[pos * self.kv_dim..(pos + 1) * self.kv_dim]
    }

    pub fn value(&self, pos: usize) -> &[f32] {
        &self.values[pos * self.kv_dim..(pos + 1) * self.kv_dim]
    }

    pub fn truncate(&mut self, len: usize) {
        self.keys.truncate(len * self.kv_dim);
        self.values.truncate(len * self.kv_dim);
    }
}

/// The cache of a whole model.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    layers: Vec<LayerCache>,
}

impl KvCache {
    /// An empty cache for `num_layers` layers of `kv_dim` floats per position.
    pub fn new(num_layers: usize, kv_dim: usize) -> Self {
        KvCache {
            layers: (0..num_layers).map(|_| LayerCache::new(kv_dim)).collect(),
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
        let mut c = KvCache::new(2, 2);
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
