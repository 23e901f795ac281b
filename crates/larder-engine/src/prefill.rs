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
//! ([`larder_model::activation_bytes_per_row`]). By default
//! ([`PrefillChunk::Auto`]) a prompt runs in one pass unless its activations
//! would exceed [`default_prefill_memory`] (`--prefill-memory`): an eighth of
//! the memory available when the engine starts (a cgroup limit counts), at
//! least 1 GiB or a quarter of it, whichever is less. A longer
//! prompt runs in as few equal passes of at most that many rows as it needs.
//! Results never depend on the chunking (batch invariance, docs/design.md §3).
//!
//! Scale: a Kimi-K3-class row (hidden 7168, 16 routed experts) holds about
//! 1 MB of activations, so 8 GiB (a 64 GiB machine) runs an 8k-token prompt
//! in one pass; the k3-mini of the benchmarks (hidden 2048, top-8) about
//! 0.2 MB a row.

use larder_model::prefill_rows;
use larder_model::ModelSpec;

/// The least activation memory [`default_prefill_memory`] gives a pass: 1 GiB
/// (or a quarter of the memory available, when that is less than 4 GiB).
pub(crate) const MIN_PREFILL_MEMORY: u64 = 1 << 30;

/// The activation memory a prefill pass may hold by default: an eighth of
/// the memory available now ([`mem_available`]), at least
/// [`MIN_PREFILL_MEMORY`] or a quarter of it, whichever is less (under a
/// small cgroup limit 1 GiB would not fit); 2 GiB where that cannot be read.
pub(crate) fn default_prefill_memory() -> u64 {
    mem_available().map_or(2 << 30, prefill_memory_of)
}

/// [`default_prefill_memory`] out of `available` bytes.
fn prefill_memory_of(available: u64) -> u64 {
    (available / 8).max(MIN_PREFILL_MEMORY.min(available / 4))
}

/// Memory available to this process now, in bytes (`None` where it cannot
/// be read): `MemAvailable`, or the room its cgroup's v1 or v2 memory limit
/// leaves when that is lower ([`crate::memory_limit::available`]). What every
/// memory default (expert cache, KV budget, prefill) is a share of.
pub fn mem_available() -> Option<u64> {
    crate::memory_limit::available()
}

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
            memory: default_prefill_memory(),
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
pub(crate) fn passes(len: usize, max_rows: usize) -> Vec<usize> {
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
    fn the_default_memory_is_an_eighth_at_least_the_floor_or_a_quarter() {
        const GIB: u64 = 1 << 30;
        assert_eq!(prefill_memory_of(64 * GIB), 8 * GIB);
        assert_eq!(prefill_memory_of(6 * GIB), MIN_PREFILL_MEMORY);
        assert_eq!(prefill_memory_of(640 << 20), 160 << 20, "a small cgroup limit");
        assert_eq!(prefill_memory_of(0), 0);
    }

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
