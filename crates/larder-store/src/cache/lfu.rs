//! LFU with an LRU tie-break: the victim is the held key used least often,
//! and among equals the one used least recently.
//!
//! Use counts persist across evictions (a key read again starts from its
//! old count plus one), so a key that keeps coming back is not treated as
//! new each time; counts are kept for every key ever seen (at most the
//! model's expert count).

use std::collections::{BTreeSet, HashMap};

use super::{EvictionPolicy, Key};

/// Least-frequently-used, persistent counts, LRU among equal counts.
#[derive(Default)]
pub(crate) struct Lfu {
    tick: u64,
    /// (uses, last-use tick, key) of held keys; the first is the victim.
    order: BTreeSet<(u64, u64, Key)>,
    /// Held key -> (uses, last-use tick).
    held: HashMap<Key, (u64, u64)>,
    /// Uses of every key ever seen (held or not).
    uses: HashMap<Key, u64>,
}

impl Lfu {
    pub(crate) fn new() -> Lfu {
        Lfu::default()
    }

    /// Counts one use of `key` and re-files it if held (or `insert`).
    fn count(&mut self, key: Key, insert: bool) {
        if !insert && !self.held.contains_key(&key) {
            return;
        }
        self.tick += 1;
        let n = self.uses.entry(key).or_default();
        *n += 1;
        let n = *n;
        if let Some((old_n, old_t)) = self.held.insert(key, (n, self.tick)) {
            self.order.remove(&(old_n, old_t, key));
        }
        self.order.insert((n, self.tick, key));
    }
}

impl EvictionPolicy for Lfu {
    fn inserted(&mut self, key: Key, _bytes: u64) {
        self.count(key, true);
    }

    fn touched(&mut self, key: Key) {
        self.count(key, false);
    }

    fn removed(&mut self, key: Key) {
        if let Some((n, t)) = self.held.remove(&key) {
            self.order.remove(&(n, t, key));
        }
    }

    fn victim(&mut self, _incoming: Key, _bytes: u64) -> Option<Key> {
        self.order.iter().next().map(|&(_, _, k)| k)
    }
}
