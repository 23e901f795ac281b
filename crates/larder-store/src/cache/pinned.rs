//! Heat-pinned + LRU: keys ranked hottest by a heat profile (per-key use
//! counts, e.g. from a calibration run) are pinned up to a fraction of the
//! budget and are never victims while an unpinned key is held; the rest
//! are evicted in LRU order.
//!
//! Sizes are learnt as keys come in: a ranked key is pinned on insert when
//! the pinned bytes leave room for it, else colder pinned keys are demoted
//! to LRU (as most recent) to make room; a key that still does not fit goes
//! to LRU. When only pinned keys are held, the coldest pinned key is the
//! victim.

use std::collections::{BTreeMap, HashMap};

use super::{EvictionPolicy, Key, Lru};

/// Heat-pinned keys plus an LRU for everything else.
pub(crate) struct HeatPinnedLru {
    /// Key -> heat rank (0 = hottest), for keys with heat > 0.
    rank: HashMap<Key, usize>,
    pin_cap: u64,
    pinned_bytes: u64,
    /// Held pinned keys by rank, and their bytes.
    pinned: BTreeMap<usize, (Key, u64)>,
    lru: Lru,
    /// Bytes of held unpinned keys (needed to demote/pin later).
    lru_bytes: HashMap<Key, u64>,
}

impl HeatPinnedLru {
    /// Pins the hottest keys of `heat` up to `fraction` (clamped to 0..=1)
    /// of `budget` bytes.
    pub(crate) fn new(budget: u64, heat: &HashMap<Key, u64>, fraction: f64) -> HeatPinnedLru {
        let mut hot: Vec<(u64, Key)> = heat.iter().filter(|(_, &h)| h > 0).map(|(&k, &h)| (h, k)).collect();
        // Hottest first; ties by key so the ranking is deterministic.
        hot.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let rank = hot.iter().enumerate().map(|(i, &(_, k))| (k, i)).collect();
        let fraction = if fraction.is_finite() { fraction.clamp(0.0, 1.0) } else { 0.0 };
        HeatPinnedLru {
            rank,
            pin_cap: (budget as f64 * fraction) as u64,
            pinned_bytes: 0,
            pinned: BTreeMap::new(),
            lru: Lru::new(),
            lru_bytes: HashMap::new(),
        }
    }

    /// Whether `key` is currently pinned.
    #[cfg(test)]
    pub(crate) fn is_pinned(&self, key: Key) -> bool {
        self.rank
            .get(&key)
            .is_some_and(|r| self.pinned.get(r).is_some_and(|&(k, _)| k == key))
    }

    fn file_lru(&mut self, key: Key, bytes: u64) {
        self.lru.inserted(key, bytes);
        self.lru_bytes.insert(key, bytes);
    }

    /// Pins `key` of rank `r` if it fits, demoting colder pinned keys.
    fn try_pin(&mut self, key: Key, r: usize, bytes: u64) -> bool {
        if bytes > self.pin_cap {
            return false;
        }
        let colder: u64 = self.pinned.range(r + 1..).map(|(_, &(_, b))| b).sum();
        if self.pinned_bytes - colder + bytes > self.pin_cap {
            return false;
        }
        while self.pinned_bytes + bytes > self.pin_cap {
            let Some((_, (k, b))) = self.pinned.pop_last() else { break };
            self.pinned_bytes -= b;
            self.file_lru(k, b);
        }
        self.pinned.insert(r, (key, bytes));
        self.pinned_bytes += bytes;
        true
    }
}

impl EvictionPolicy for HeatPinnedLru {
    fn inserted(&mut self, key: Key, bytes: u64) {
        self.removed(key);
        let pinned = match self.rank.get(&key) {
            Some(&r) => self.try_pin(key, r, bytes),
            None => false,
        };
        if !pinned {
            self.file_lru(key, bytes);
        }
    }

    fn touched(&mut self, key: Key) {
        self.lru.touched(key);
    }

    fn removed(&mut self, key: Key) {
        if self.lru_bytes.remove(&key).is_some() {
            self.lru.removed(key);
            return;
        }
        if let Some(&r) = self.rank.get(&key) {
            if let Some(&(k, b)) = self.pinned.get(&r) {
                if k == key {
                    self.pinned.remove(&r);
                    self.pinned_bytes -= b;
                }
            }
        }
    }

    fn victim(&mut self, incoming: Key, bytes: u64) -> Option<Key> {
        self.lru
            .victim(incoming, bytes)
            .or_else(|| self.pinned.values().next_back().map(|&(k, _)| k))
    }
}
