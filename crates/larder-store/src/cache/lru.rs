//! Plain global LRU: the least recently inserted-or-touched entry is the
//! victim, whatever its layer (the baseline the other policies are
//! measured against).

use std::collections::{BTreeMap, HashMap};

use super::{EvictionPolicy, Key};

/// Global least-recently-used order over every held key.
#[derive(Default)]
pub(crate) struct Lru {
    tick: u64,
    /// Last-use tick -> key, oldest first.
    order: BTreeMap<u64, Key>,
    last_use: HashMap<Key, u64>,
}

impl Lru {
    pub(crate) fn new() -> Lru {
        Lru::default()
    }

    fn stamp(&mut self, key: Key) {
        self.tick += 1;
        if let Some(old) = self.last_use.insert(key, self.tick) {
            self.order.remove(&old);
        }
        self.order.insert(self.tick, key);
    }
}

impl EvictionPolicy for Lru {
    fn inserted(&mut self, key: Key, _bytes: u64) {
        self.stamp(key);
    }

    fn touched(&mut self, key: Key) {
        if self.last_use.contains_key(&key) {
            self.stamp(key);
        }
    }

    fn removed(&mut self, key: Key) {
        if let Some(t) = self.last_use.remove(&key) {
            self.order.remove(&t);
        }
    }

    fn victim(&mut self, _incoming: Key, _bytes: u64) -> Option<Key> {
        self.order.values().next().copied()
    }
}
