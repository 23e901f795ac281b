//! The RAM expert cache: immutable entries shared with compute (a hit hands
//! out an `Arc`, never a copy) under a byte budget that is never exceeded.
//!
//! What to evict is a [`EvictionPolicy`]; the default is `FairAdaptive`
//! (per-layer shares; within a layer LRU, LFU or a hybrid of both, by which
//! hits most lately);
//! `FairLru`, the previous default, is LRU
//! with per-layer fairness: when room is needed it evicts from layers holding
//! more than their share of the budget (budget / layers) first, so one
//! layer's traffic (say, a long prefill through early layers) cannot push
//! every later layer's experts out. Entries evicted while in use stay alive
//! for their users; the budget counts what the cache holds.
//!
//! Other policies, each in its own module and all named by [`PolicyKind`]:
//! `Lru` (global LRU), `Lfu` (LFU, LRU tie-break), `S3Fifo` and
//! `HeatPinnedLru` (hottest keys of a heat profile pinned, LRU for the
//! rest). [`sim`] replays an access trace against any of them, or against
//! Belady's optimum, to compare hit rates at a budget.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

mod fair_adaptive;
mod kind;
mod lfu;
mod lru;
pub mod online_bound;
mod pinned;
pub mod prefetch_sim;
mod s3fifo;
pub mod sim;

pub(crate) use fair_adaptive::FairAdaptive;
pub use kind::{PolicyKind, UnknownPolicy};
pub(crate) use lfu::Lfu;
pub(crate) use lru::Lru;
pub(crate) use pinned::HeatPinnedLru;
pub(crate) use s3fifo::S3Fifo;

/// (layer, expert).
pub type Key = (usize, usize);

/// Decides eviction order. Called under the cache lock.
pub trait EvictionPolicy: Send {
    fn inserted(&mut self, key: Key, bytes: u64);
    fn touched(&mut self, key: Key);
    fn removed(&mut self, key: Key);
    /// The next entry to evict to make room for `incoming` of `bytes`
    /// (`None` when empty).
    fn victim(&mut self, incoming: Key, bytes: u64) -> Option<Key>;
    /// The cache's budget changed to `budget` (policies whose shares
    /// depend on it rescale them; entries are evicted by the cache).
    fn resized(&mut self, _budget: u64) {}
    /// Asked when `incoming` (not held) would need a victim: `false` keeps
    /// it out of the cache (the caller still uses it; the policy counts that
    /// access itself, as no `inserted` follows). Default: always admitted.
    fn admits(&mut self, _incoming: Key, _bytes: u64) -> bool {
        true
    }
}

/// The key [`ExpertCache::set_budget`] asks victims for: no real entry.
pub(crate) const NO_KEY: Key = (usize::MAX, usize::MAX);

/// LRU per layer; victims come from the layer most over its share, else
/// the globally least recently used entry.
pub(crate) struct FairLru {
    share: u64,
    layers: usize,
    tick: u64,
    /// Per layer: last-use tick -> expert.
    order: HashMap<usize, BTreeMap<u64, usize>>,
    last_use: HashMap<Key, (u64, u64)>,
    layer_bytes: HashMap<usize, u64>,
}

impl FairLru {
    /// `budget` bytes shared by `layers` layers (0 layers: plain LRU).
    pub(crate) fn new(budget: u64, layers: usize) -> FairLru {
        FairLru {
            share: if layers == 0 { u64::MAX } else { budget / layers as u64 },
            layers,
            tick: 0,
            order: HashMap::new(),
            last_use: HashMap::new(),
            layer_bytes: HashMap::new(),
        }
    }

    fn bump(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }
}

impl EvictionPolicy for FairLru {
    fn resized(&mut self, budget: u64) {
        if self.layers > 0 {
            self.share = budget / self.layers as u64;
        }
    }

    fn inserted(&mut self, key: Key, bytes: u64) {
        let t = self.bump();
        self.order.entry(key.0).or_default().insert(t, key.1);
        self.last_use.insert(key, (t, bytes));
        *self.layer_bytes.entry(key.0).or_default() += bytes;
    }

    fn touched(&mut self, key: Key) {
        let t = self.bump();
        if let Some((old, _)) = self.last_use.get_mut(&key) {
            let layer = self.order.entry(key.0).or_default();
            layer.remove(old);
            layer.insert(t, key.1);
            *old = t;
        }
    }

    fn removed(&mut self, key: Key) {
        if let Some((t, bytes)) = self.last_use.remove(&key) {
            if let Some(layer) = self.order.get_mut(&key.0) {
                layer.remove(&t);
            }
            if let Some(b) = self.layer_bytes.get_mut(&key.0) {
                *b -= bytes;
            }
        }
    }

    fn victim(&mut self, incoming: Key, bytes: u64) -> Option<Key> {
        // The oldest entry among layers over their share (counting the
        // incoming entry in its layer); else the oldest overall.
        let over = |l: usize| {
            let held = self.layer_bytes.get(&l).copied().unwrap_or(0);
            let held = if l == incoming.0 { held + bytes } else { held };
            held > self.share
        };
        let oldest = |only_over: bool| {
            self.order
                .iter()
                .filter(|(&l, _)| !only_over || over(l))
                .filter_map(|(&l, m)| m.iter().next().map(|(&t, &e)| (t, (l, e))))
                .min()
                .map(|(_, k)| k)
        };
        oldest(true).or_else(|| oldest(false))
    }
}

/// Counters of one cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheCounts {
    pub entries: usize,
    pub used_bytes: u64,
    pub peak_bytes: u64,
    pub evictions: u64,
}

struct Inner<V> {
    budget: u64,
    map: HashMap<Key, (Arc<V>, u64)>,
    used: u64,
    peak: u64,
    evictions: u64,
    policy: Box<dyn EvictionPolicy>,
}

/// A byte-budgeted map from (layer, expert) to shared values.
pub struct ExpertCache<V> {
    inner: Mutex<Inner<V>>,
}

impl<V> ExpertCache<V> {
    /// A cache with the default policy ([`PolicyKind::default`], now
    /// `FairAdaptive`, over `layers` layers).
    pub fn new(budget: u64, layers: usize) -> Self {
        Self::with_kind(budget, layers, PolicyKind::default(), &HashMap::new())
    }

    /// A cache with the policy `kind` names (`heat`: per-key use counts,
    /// read by [`PolicyKind::HeatPinnedLru`] only).
    pub(crate) fn with_kind(budget: u64, layers: usize, kind: PolicyKind, heat: &HashMap<Key, u64>) -> Self {
        Self::with_policy(budget, kind.build(budget, layers, heat))
    }

    pub(crate) fn with_policy(budget: u64, policy: Box<dyn EvictionPolicy>) -> Self {
        ExpertCache {
            inner: Mutex::new(Inner {
                budget,
                map: HashMap::new(),
                used: 0,
                peak: 0,
                evictions: 0,
                policy,
            }),
        }
    }

    /// The byte budget now (see [`set_budget`](Self::set_budget)).
    pub fn budget(&self) -> u64 {
        self.lock().budget
    }

    /// Changes the budget; a smaller one evicts, in the policy's order,
    /// until what the cache holds fits (entries in use stay alive for their
    /// users). Which experts are cached changes when bytes arrive, never
    /// what is computed.
    pub fn set_budget(&self, budget: u64) {
        let mut g = self.lock();
        g.budget = budget;
        g.policy.resized(budget);
        while g.used > budget {
            let Some(victim) = g.policy.victim(NO_KEY, 0) else { break };
            g.policy.removed(victim);
            if let Some((_, b)) = g.map.remove(&victim) {
                g.used -= b;
                g.evictions += 1;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<V>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The entry, marked as just used.
    pub fn get(&self, key: Key) -> Option<Arc<V>> {
        let mut g = self.lock();
        let v = g.map.get(&key).map(|(v, _)| v.clone())?;
        g.policy.touched(key);
        Some(v)
    }

    pub fn contains(&self, key: Key) -> bool {
        self.lock().map.contains_key(&key)
    }

    /// Keys currently held (any order).
    pub fn keys(&self) -> Vec<Key> {
        self.lock().map.keys().copied().collect()
    }

    /// Adds an entry of `bytes` just read on demand, evicting as needed,
    /// unless the policy does not admit it (see [`EvictionPolicy::admits`]).
    /// Values larger than the whole budget are not kept. Returns whether it was kept.
    pub fn insert(&self, key: Key, value: Arc<V>, bytes: u64) -> bool {
        self.insert_with(key, value, bytes, true)
    }

    /// [`insert`](Self::insert) for an entry expected to be used soon (a
    /// prefetch of a predicted expert, warming): admitted whatever its history.
    pub(crate) fn insert_expected(&self, key: Key, value: Arc<V>, bytes: u64) -> bool {
        self.insert_with(key, value, bytes, false)
    }

    fn insert_with(&self, key: Key, value: Arc<V>, bytes: u64, ask: bool) -> bool {
        let mut g = self.lock();
        if bytes > g.budget {
            return false;
        }
        if let Some((_, old)) = g.map.remove(&key) {
            g.used -= old;
            g.policy.removed(key);
        }
        if ask && g.used + bytes > g.budget && !g.policy.admits(key, bytes) {
            return false;
        }
        while g.used + bytes > g.budget {
            let Some(victim) = g.policy.victim(key, bytes) else { break };
            g.policy.removed(victim);
            if let Some((_, b)) = g.map.remove(&victim) {
                g.used -= b;
                g.evictions += 1;
            }
        }
        if g.used + bytes > g.budget {
            return false;
        }
        g.used += bytes;
        g.peak = g.peak.max(g.used);
        g.map.insert(key, (value, bytes));
        g.policy.inserted(key, bytes);
        debug_assert!(g.used <= g.budget);
        true
    }

    pub fn counts(&self) -> CacheCounts {
        let g = self.lock();
        CacheCounts {
            entries: g.map.len(),
            used_bytes: g.used,
            peak_bytes: g.peak,
            evictions: g.evictions,
        }
    }

    /// Drops every entry.
    pub fn clear(&self) {
        let mut g = self.lock();
        let keys: Vec<Key> = g.map.keys().copied().collect();
        for k in keys {
            g.policy.removed(k);
        }
        g.map.clear();
        g.used = 0;
    }
}

#[cfg(test)]
mod sim_tests;
#[cfg(test)]
mod tests;
