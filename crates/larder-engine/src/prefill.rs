//! How many prompt positions one forward pass takes ([`PrefillChunk`]).
//!
//! A pass runs all its rows through layer L before layer L+1, with one MoE
//! step over the union of their experts, so a streamed expert is read at
//! most once per pass. Running the whole prompt in one pass therefore reads
//! each expert the prompt routes to exactly once, whatever the prompt's
//! length and the RAM budget; a prompt cut into chunks of a few hundred
//! tokens reads nearly every expert once per chunk.
//!
//! What bounds a pass is its activations
//! ([`larder_model::activation::activation_bytes_per_row`]). By default
//! ([`PrefillChunk::Auto`]) a prompt runs in one pass unless its activations
//! would exceed [`DEFAULT_PREFILL_MEMORY`] (`--prefill-memory`); a longer one
//! runs in as few equal passes of at most that many rows as it needs.
//! Results never depend on the chunking (batch invariance, docs/design.md §3).

use larder_model::activation::prefill_rows;
use larder_model::ModelSpec;

/// The activation memory a prefill pass may hold by default: 2 GiB. Next to
/// a streamed model's expert cache this is a small share; it keeps a 2.8 T
/// Kimi-K3-class prompt of ~8k tokens in one pass.
pub const DEFAULT_PREFILL_MEMORY: u64 = 2 << 30;

/// How a prompt is split into forward passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillChunk {
    /// As many rows as `memory` bytes of activations allow (see the module docs).
    Auto { memory: u64 },
    /// Exactly this many rows per pass (at least 1): the old fixed chunking,
    /// kept for comparison.
    Rows(usize),
}

impl Default for PrefillChunk {
    fn default() -> Self {
        PrefillChunk::Auto {
            memory: DEFAULT_PREFILL_MEMORY,
        }
    }
}

impl PrefillChunk {
    /// Rows per pass for a model of `spec` (at least 1).
    pub fn rows(&self, spec: &ModelSpec) -> usize {
        match *self {
            PrefillChunk::Auto { memory } => prefill_rows(spec, memory),
            PrefillChunk::Rows(n) => n.max(1),
        }
    }
}

/// `len` positions cut into passes of at most `max_rows`, as equal as can
/// be (a 9,000-token prompt with 8,192 rows a pass runs as 4,500 + 4,500,
/// not 8,192 + 808): the ranges' lengths, in order.
pub fn passes(len: usize, max_rows: usize) -> Vec<usize> {
    if len == 0 {
        return Vec::new();
    }
    let n = len.div_ceil(max_rows.max(1));
    let (base, extra) = (len / n, len % n);
    (0..n).map(|i| base + usize::from(i < extra)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_are_few_and_even() {
        assert_eq!(passes(0, 8), Vec::<usize>::new());
        assert_eq!(passes(5, 8), vec![5]);
        assert_eq!(passes(8, 8), vec![8]);
        assert_eq!(passes(9, 8), vec![5, 4]);
        assert_eq!(passes(9000, 8192), vec![4500, 4500]);
        assert_eq!(passes(3, 0), vec![1, 1, 1]);
        assert_eq!(passes(17, 4).iter().sum::<usize>(), 17);
    }
}
