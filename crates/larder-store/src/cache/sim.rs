//! Trace replay: hit rate and bytes read of an eviction policy (or of
//! Belady's optimum) over a recorded sequence of expert accesses, with no
//! I/O and no values, just keys and sizes.
//!
//! [`simulate`] drives an [`EvictionPolicy`] with exactly the calls
//! [`ExpertCache`](super::ExpertCache) makes (a hit is `touched`; a miss
//! evicts `victim`s, each followed by `removed`, until the entry fits, then
//! `inserted`), so a policy behaves here as it does in the cache.
//! [`simulate_belady`] evicts the held key used again furthest in the
//! future and bypasses an incoming key used again later than every key it
//! would evict: optimal for equal sizes; with unequal sizes this is the
//! classic heuristic (the exact optimum is NP-hard), not a bound.
//! [`simulate_belady_shares`] is the same optimum held to fixed per-layer
//! shares (the budget split evenly, as the fair policies split it): the
//! best a policy with those shares can do, so the gap between it and
//! [`simulate_belady`] is what moving room between layers with knowledge of
//! the future is worth.
//!
//! A step is one decode token or one prefill pass; within a step a key is
//! counted once (the engine reads a layer's union of experts once). As the
//! store's `fetch` does, a run of consecutive accesses to one layer looks
//! every key up first (the hits, touched) and only then inserts the misses,
//! so a layer's misses never evict the hits of the same request.

use std::collections::{BTreeSet, HashMap, HashSet};

use serde::Serialize;

use super::{EvictionPolicy, Key};

/// One decode token or one prefill pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Step {
    /// Tokens this step produced or consumed.
    pub tokens: usize,
    /// (key, bytes) in request order; repeats within the step count once.
    pub accesses: Vec<(Key, u64)>,
}

/// What a replay cost.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SimResult {
    /// Accesses after per-step dedupe.
    pub accesses: u64,
    pub hits: u64,
    /// hits / accesses (0 without accesses).
    pub hit_rate: f64,
    /// Bytes of every (deduped) access.
    pub bytes_requested: u64,
    /// Bytes of the misses (what storage had to deliver).
    pub bytes_read: u64,
    pub tokens: u64,
    /// bytes_read / tokens (0 without tokens).
    pub bytes_read_per_token: f64,
}

/// Running counters, turned into a [`SimResult`] at the end.
#[derive(Default)]
struct Tally {
    accesses: u64,
    hits: u64,
    bytes_requested: u64,
    bytes_read: u64,
    tokens: u64,
}

impl Tally {
    fn access(&mut self, bytes: u64, hit: bool) {
        self.accesses += 1;
        self.bytes_requested += bytes;
        if hit {
            self.hits += 1;
        } else {
            self.bytes_read += bytes;
        }
    }

    fn finish(self) -> SimResult {
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        SimResult {
            accesses: self.accesses,
            hits: self.hits,
            hit_rate: ratio(self.hits, self.accesses),
            bytes_requested: self.bytes_requested,
            bytes_read: self.bytes_read,
            tokens: self.tokens,
            bytes_read_per_token: ratio(self.bytes_read, self.tokens),
        }
    }
}

/// The accesses of `steps` after per-step dedupe, in order, with the
/// tokens of every step summed.
fn flatten(steps: &[Step]) -> (Vec<(Key, u64)>, u64) {
    let mut out = Vec::with_capacity(steps.iter().map(|s| s.accesses.len()).sum());
    let mut seen = HashSet::new();
    let mut tokens = 0u64;
    for step in steps {
        tokens += step.tokens as u64;
        seen.clear();
        out.extend(step.accesses.iter().filter(|(k, _)| seen.insert(*k)).copied());
    }
    (out, tokens)
}

/// A cache of keys and sizes driven like [`ExpertCache`](super::ExpertCache).
pub(super) struct Held<'a> {
    budget: u64,
    used: u64,
    map: HashMap<Key, u64>,
    policy: &'a mut dyn EvictionPolicy,
}

impl<'a> Held<'a> {
    /// An empty cache of `budget` bytes run by `policy`.
    pub(super) fn new(budget: u64, policy: &'a mut dyn EvictionPolicy) -> Held<'a> {
        Held {
            budget,
            used: 0,
            map: HashMap::new(),
            policy,
        }
    }

    /// Whether `key` is held (no policy call: a lookup the engine makes
    /// without using the entry, as prefetch does).
    pub(super) fn contains(&self, key: Key) -> bool {
        self.map.contains_key(&key)
    }

    /// `ExpertCache::get`: a hit marks the key used.
    pub(super) fn get(&mut self, key: Key) -> bool {
        if !self.map.contains_key(&key) {
            return false;
        }
        self.policy.touched(key);
        true
    }

    /// `ExpertCache::insert` for a key not held.
    pub(super) fn insert(&mut self, key: Key, bytes: u64) {
        self.insert_with(key, bytes, true)
    }

    /// `ExpertCache::insert_expected` for a key not held (a prefetch).
    pub(super) fn insert_expected(&mut self, key: Key, bytes: u64) {
        self.insert_with(key, bytes, false)
    }

    fn insert_with(&mut self, key: Key, bytes: u64, ask: bool) {
        if bytes > self.budget {
            return;
        }
        if ask && self.used + bytes > self.budget && !self.policy.admits(key, bytes) {
            return;
        }
        while self.used + bytes > self.budget {
            let Some(victim) = self.policy.victim(key, bytes) else { break };
            self.policy.removed(victim);
            if let Some(b) = self.map.remove(&victim) {
                self.used -= b;
            }
        }
        if self.used + bytes > self.budget {
            return;
        }
        self.used += bytes;
        self.map.insert(key, bytes);
        self.policy.inserted(key, bytes);
    }
}

/// Replays `steps` against `policy` (fresh, built for `budget`) in a cache
/// of `budget` bytes.
pub fn simulate(steps: &[Step], budget: u64, policy: &mut dyn EvictionPolicy) -> SimResult {
    let mut held = Held::new(budget, policy);
    let mut tally = Tally::default();
    for step in steps {
        tally.tokens += step.tokens as u64;
        replay_step(&mut held, step, &mut |_, bytes, hit| tally.access(bytes, hit));
    }
    tally.finish()
}

/// One step through `held` as the store's `fetch` runs it: deduped, and per
/// run of one layer's accesses every key looked up before the misses are
/// inserted; `access(key, bytes, hit)` is called for each deduped access.
pub(super) fn replay_step(held: &mut Held, step: &Step, access: &mut dyn FnMut(Key, u64, bool)) {
    let mut seen = HashSet::new();
    let unique: Vec<(Key, u64)> = step.accesses.iter().filter(|(k, _)| seen.insert(*k)).copied().collect();
    let mut misses = Vec::new();
    for layer in unique.chunk_by(|a, b| a.0 .0 == b.0 .0) {
        misses.clear();
        for &(key, bytes) in layer {
            let hit = held.get(key);
            access(key, bytes, hit);
            if !hit {
                misses.push((key, bytes));
            }
        }
        for &(key, bytes) in &misses {
            held.insert(key, bytes);
        }
    }
}

/// Never used again.
const NEVER: usize = usize::MAX;

/// For each access, the index of the next access to the same key (or
/// [`NEVER`]).
fn next_uses(accesses: &[(Key, u64)]) -> Vec<usize> {
    let mut next = vec![NEVER; accesses.len()];
    let mut later: HashMap<Key, usize> = HashMap::new();
    for (i, &(key, _)) in accesses.iter().enumerate().rev() {
        if let Some(j) = later.insert(key, i) {
            next[i] = j;
        }
    }
    next
}

/// Belady's cache: held keys by next use.
struct Oracle {
    budget: u64,
    used: u64,
    /// Held key -> (next use, bytes).
    map: HashMap<Key, (usize, u64)>,
    /// (next use, key) of held keys; the last is the furthest.
    by_next: BTreeSet<(usize, Key)>,
}

impl Oracle {
    /// A hit: the key's next use moves on to `next`.
    fn hit(&mut self, key: Key, next: usize) -> bool {
        let Some(entry) = self.map.get_mut(&key) else { return false };
        self.by_next.remove(&(entry.0, key));
        entry.0 = next;
        self.by_next.insert((next, key));
        true
    }

    /// The keys to evict (furthest next use first) for `bytes` to fit, or
    /// `None` when the incoming key (next use `next`) should bypass.
    fn victims(&self, bytes: u64, next: usize) -> Option<Vec<Key>> {
        let mut free = self.budget - self.used;
        let mut out = Vec::new();
        for &(n, k) in self.by_next.iter().rev() {
            if free >= bytes {
                break;
            }
            if n <= next {
                return None;
            }
            free += self.map.get(&k).map_or(0, |e| e.1);
            out.push(k);
        }
        (free >= bytes).then_some(out)
    }

    fn miss(&mut self, key: Key, bytes: u64, next: usize) {
        if bytes > self.budget {
            return;
        }
        let Some(victims) = self.victims(bytes, next) else { return };
        for v in victims {
            if let Some((n, b)) = self.map.remove(&v) {
                self.by_next.remove(&(n, v));
                self.used -= b;
            }
        }
        self.used += bytes;
        self.map.insert(key, (next, bytes));
        self.by_next.insert((next, key));
    }
}

/// Replays `steps` with Belady's optimum (see the module doc) in a cache of
/// `budget` bytes.
pub fn simulate_belady(steps: &[Step], budget: u64) -> SimResult {
    let (accesses, tokens) = flatten(steps);
    let next = next_uses(&accesses);
    let mut oracle = Oracle {
        budget,
        used: 0,
        map: HashMap::new(),
        by_next: BTreeSet::new(),
    };
    let mut tally = Tally {
        tokens,
        ..Tally::default()
    };
    for (i, &(key, bytes)) in accesses.iter().enumerate() {
        let hit = oracle.hit(key, next[i]);
        tally.access(bytes, hit);
        if !hit {
            oracle.miss(key, bytes, next[i]);
        }
    }
    tally.finish()
}

/// [`simulate_belady`] held to fixed shares: each of the `layers` layers
/// the budget is split over (0: one per layer the steps touch) replayed alone
/// in `budget / layers` bytes, the results summed (tokens counted once).
pub fn simulate_belady_shares(steps: &[Step], budget: u64, layers: usize) -> SimResult {
    let touched: BTreeSet<usize> = steps.iter().flat_map(|s| s.accesses.iter().map(|((l, _), _)| *l)).collect();
    let share = budget / (if layers == 0 { touched.len() } else { layers }).max(1) as u64;
    let mut tally = Tally {
        tokens: steps.iter().map(|s| s.tokens as u64).sum(),
        ..Tally::default()
    };
    for &layer in &touched {
        let alone: Vec<Step> = steps
            .iter()
            .map(|s| Step {
                tokens: 0,
                accesses: s.accesses.iter().filter(|((l, _), _)| *l == layer).copied().collect(),
            })
            .collect();
        let r = simulate_belady(&alone, share);
        tally.accesses += r.accesses;
        tally.hits += r.hits;
        tally.bytes_requested += r.bytes_requested;
        tally.bytes_read += r.bytes_read;
    }
    tally.finish()
}
