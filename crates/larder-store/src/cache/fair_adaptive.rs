//! [`FairAdaptive`]: per-layer fair shares (as [`FairLru`](super::FairLru))
//! and, within each layer, a choice between recency (LRU), frequency (LFU)
//! and both (LRU among all but the most used half of the share, which stay)
//! made by watching which of the three would have hit most.
//!
//! What it owns: for every layer, the held experts with their last-use tick
//! and bytes, the use count and last-use tick of every expert ever seen in
//! the layer (at most the model's experts per layer), its access count, and
//! six shadow caches (keys and sizes only, no values): three of the layer's
//! fair share, run as LRU, LFU and the hybrid (they choose the mode), and
//! three of the share in whole records, run as LRU, LFU and LFU with
//! admission (they gate admission, below). All are fed the layer's full
//! access stream (a hit is `touched`, a miss `inserted` or refused, so the
//! policy sees every access). Each
//! shadow hit adds to that shadow's score; scores decay with a half-life of
//! [`HALF_LIFE`] layer accesses, so the choice follows phase changes.
//!
//! Victims: the layer most over its share (budget / layers, counting the
//! incoming entry in its layer) gives one; within a layer, the held expert
//! used least recently when the LRU shadow leads; the one used least often
//! when the LFU shadow leads (LRU among equals; counts persist across
//! evictions, as in [`Lfu`](super::Lfu)); when the hybrid leads, the least
//! recently used of those outside the most used half of the layer's share
//! (routes that come back within a token or two beside a popular core: the
//! `mixed` preset, where it gains 0.03 of Belady's hit rate at 10-20%).
//! When no layer is over its share (0 layers, or a budget that does not
//! divide), each layer's candidate by its own mode competes and the least
//! recently used candidate goes.
//!
//! Admission: a layer in LFU mode keeps a demand-read newcomer out of the
//! cache (it is used, not kept) when it has been used less often and less
//! recently than the victim it would replace, as Belady's optimum does for
//! a newcomer needed later than everything held. Under independent draws of
//! skewed popularity (the `skewed` preset) a plain LFU keeps losing one slot
//! to the newcomers it then evicts; admission gives it back (k3-mini skewed,
//! 20% of the bank: 0.89 -> 0.90 of Belady). It is on only while it measurably
//! pays: the layer has seen [`ADMIT_AFTER`] accesses, and three more shadows
//! at the layer's share in whole records (what the real layer may hold) say
//! LFU beats LRU and LFU with admission beats LFU. Prefetched and warmed
//! records are always admitted (they are expected to be used soon).
//!
//! Why not ARC: on routing traces the frequency signal that matters is
//! long-run popularity (many uses), which ARC's T2 ("used twice") does not
//! rank; persistent LFU does, and the duel keeps LRU where recency wins.
//! Per-layer scans are O(experts per layer), small for MoE banks.

use std::collections::HashMap;

use super::{EvictionPolicy, Key};

/// Half-life of the shadow scores, in accesses to the layer.
pub(super) const HALF_LIFE: f64 = 512.0;

/// Accesses a layer must have seen before its cache may refuse a newcomer.
pub(super) const ADMIT_AFTER: u64 = 512;

/// Which ordering a layer evicts by.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Lru,
    Lfu,
    /// LRU among all but the most used half of the share.
    Hybrid,
    /// LFU whose newcomer stays out when used less often than the victim
    /// (a shadow only: it decides whether the real cache admits).
    LfuAdmit,
}

/// Use history of one expert in a layer (held or not).
#[derive(Clone, Copy, Default)]
struct Seen {
    uses: u64,
    last: u64,
}

/// A keys-only cache of the layer's share, evicting by one [`Mode`].
struct Shadow {
    mode: Mode,
    held: HashMap<usize, u64>,
    bytes: u64,
    score: f64,
}

impl Shadow {
    fn new(mode: Mode) -> Shadow {
        Shadow {
            mode,
            held: HashMap::new(),
            bytes: 0,
            score: 0.0,
        }
    }

    /// One access to `expert` (already counted in `seen`): scores a hit,
    /// else admits it within `cap` bytes.
    fn access(&mut self, expert: usize, bytes: u64, cap: u64, decay: f64, seen: &HashMap<usize, Seen>) {
        let protect = (cap / bytes.max(1)) as usize / 2;
        let hit = self.held.contains_key(&expert);
        self.score = self.score * decay + if hit { 1.0 } else { 0.0 };
        if hit || bytes > cap {
            return;
        }
        while self.bytes + bytes > cap {
            let Some(v) = pick(self.mode, self.held.keys().copied().filter(|&e| e != expert), seen, protect) else {
                break;
            };
            let uses = |e: usize| seen.get(&e).map_or(0, |s| s.uses);
            if self.mode == Mode::LfuAdmit && uses(expert) < uses(v) {
                return;
            }
            if let Some(b) = self.held.remove(&v) {
                self.bytes -= b;
            }
        }
        if self.bytes + bytes <= cap {
            self.held.insert(expert, bytes);
            self.bytes += bytes;
        }
    }
}

/// The expert among `experts` to evict by `mode`.
fn pick(mode: Mode, experts: impl Iterator<Item = usize>, seen: &HashMap<usize, Seen>, protect: usize) -> Option<usize> {
    let info = |e: usize| seen.get(&e).copied().unwrap_or_default();
    match mode {
        Mode::Lru => experts.min_by_key(|&e| (info(e).last, e)),
        Mode::Lfu | Mode::LfuAdmit => experts.min_by_key(|&e| (info(e).uses, info(e).last, e)),
        Mode::Hybrid => {
            // The `protect` most used first (in no order), then LRU among the rest; with
            // no rest, the least used goes.
            let mut by_use: Vec<usize> = experts.collect();
            if by_use.len() <= protect {
                return by_use.into_iter().min_by_key(|&e| (info(e).uses, info(e).last, e));
            }
            if protect > 0 {
                by_use.select_nth_unstable_by_key(protect - 1, |&e| std::cmp::Reverse((info(e).uses, info(e).last, e)));
            }
            by_use[protect..].iter().copied().min_by_key(|&e| (info(e).last, e))
        }
    }
}

/// One layer's state.
struct Layer {
    /// Held expert -> bytes.
    held: HashMap<usize, u64>,
    held_bytes: u64,
    seen: HashMap<usize, Seen>,
    lru: Shadow,
    lfu: Shadow,
    hybrid: Shadow,
    /// LFU without and with admission, at whole records: admission is on
    /// while the second leads.
    admit_lru: Shadow,
    admit_lfu: Shadow,
    admit: Shadow,
    /// Accesses to the layer so far.
    accesses: u64,
}

impl Layer {
    fn new() -> Layer {
        Layer {
            held: HashMap::new(),
            held_bytes: 0,
            seen: HashMap::new(),
            lru: Shadow::new(Mode::Lru),
            lfu: Shadow::new(Mode::Lfu),
            hybrid: Shadow::new(Mode::Hybrid),
            admit_lru: Shadow::new(Mode::Lru),
            admit_lfu: Shadow::new(Mode::Lfu),
            admit: Shadow::new(Mode::LfuAdmit),
            accesses: 0,
        }
    }

    fn mode(&self) -> Mode {
        if self.hybrid.score > self.lru.score.max(self.lfu.score) {
            Mode::Hybrid
        } else if self.lfu.score > self.lru.score {
            Mode::Lfu
        } else {
            Mode::Lru
        }
    }

    /// This layer's victim by its current mode.
    fn candidate(&self, share: u64) -> Option<usize> {
        let each = self.held.values().copied().max().unwrap_or(1).max(1);
        pick(self.mode(), self.held.keys().copied(), &self.seen, (share / each) as usize / 2)
    }
}

/// Per-layer fair shares; within a layer LRU, LFU or the hybrid, whichever
/// its shadows say hits most lately. See the module doc.
pub(crate) struct FairAdaptive {
    share: u64,
    /// Layers sharing the budget (0: no fairness).
    fair_layers: usize,
    tick: u64,
    decay: f64,
    layers: HashMap<usize, Layer>,
}

impl FairAdaptive {
    /// `budget` bytes shared by `layers` layers (0 layers: one share of the
    /// whole budget per layer, no fairness).
    pub(crate) fn new(budget: u64, layers: usize) -> FairAdaptive {
        FairAdaptive {
            share: if layers == 0 { budget } else { budget / layers as u64 },
            fair_layers: layers,
            tick: 0,
            decay: 0.5f64.powf(1.0 / HALF_LIFE),
            layers: HashMap::new(),
        }
    }

    /// Counts one access and feeds both shadows.
    fn access(&mut self, key: Key, bytes: u64) {
        self.tick += 1;
        let (tick, cap, decay) = (self.tick, self.share, self.decay);
        // The admission duel holds whole records, as many as the layer may hold.
        let whole = self.share.div_ceil(bytes.max(1)).saturating_mul(bytes.max(1));
        let layer = self.layers.entry(key.0).or_insert_with(Layer::new);
        layer.accesses += 1;
        let s = layer.seen.entry(key.1).or_default();
        s.uses += 1;
        s.last = tick;
        layer.lru.access(key.1, bytes, cap, decay, &layer.seen);
        layer.lfu.access(key.1, bytes, cap, decay, &layer.seen);
        layer.hybrid.access(key.1, bytes, cap, decay, &layer.seen);
        layer.admit_lru.access(key.1, bytes, whole, decay, &layer.seen);
        layer.admit_lfu.access(key.1, bytes, whole, decay, &layer.seen);
        layer.admit.access(key.1, bytes, whole, decay, &layer.seen);
    }

    /// The mode layer `layer` evicts by now (`None` for a layer never seen).
    #[cfg(test)]
    fn mode_of(&self, layer: usize) -> Option<Mode> {
        self.layers.get(&layer).map(Layer::mode)
    }
}

impl EvictionPolicy for FairAdaptive {
    fn resized(&mut self, budget: u64) {
        self.share = if self.fair_layers == 0 {
            budget
        } else {
            budget / self.fair_layers as u64
        };
    }

    fn inserted(&mut self, key: Key, bytes: u64) {
        self.access(key, bytes);
        if let Some(layer) = self.layers.get_mut(&key.0) {
            if let Some(old) = layer.held.insert(key.1, bytes) {
                layer.held_bytes -= old;
            }
            layer.held_bytes += bytes;
        }
    }

    fn touched(&mut self, key: Key) {
        let Some(&bytes) = self.layers.get(&key.0).and_then(|l| l.held.get(&key.1)) else {
            return;
        };
        self.access(key, bytes);
    }

    fn removed(&mut self, key: Key) {
        if let Some(layer) = self.layers.get_mut(&key.0) {
            if let Some(b) = layer.held.remove(&key.1) {
                layer.held_bytes -= b;
            }
        }
    }

    fn admits(&mut self, incoming: Key, bytes: u64) -> bool {
        let Some(victim) = self.victim(incoming, bytes) else { return true };
        let Some(layer) = self.layers.get(&incoming.0) else { return true };
        if victim.0 != incoming.0
            || layer.accesses < ADMIT_AFTER
            || layer.mode() != Mode::Lfu
            || layer.admit.score <= layer.admit_lfu.score
            || layer.admit_lfu.score <= layer.admit_lru.score
        {
            return true;
        }
        let info = |e: usize| layer.seen.get(&e).copied().unwrap_or_default();
        let (new, old) = (info(incoming.1), info(victim.1));
        if new.uses + 1 >= old.uses || new.last > old.last {
            return true;
        }
        self.access(incoming, bytes);
        false
    }

    fn victim(&mut self, incoming: Key, bytes: u64) -> Option<Key> {
        // The layer most over its share (the incoming entry counted in its
        // layer), lowest layer among equals.
        let over = self
            .layers
            .iter()
            .filter(|(_, l)| !l.held.is_empty())
            .filter_map(|(&i, l)| {
                let held = if i == incoming.0 { l.held_bytes + bytes } else { l.held_bytes };
                held.checked_sub(self.share).filter(|&d| d > 0).map(|d| (d, std::cmp::Reverse(i)))
            })
            .max()
            .map(|(_, std::cmp::Reverse(i))| i);
        if let Some(i) = over {
            let l = self.layers.get(&i)?;
            return l.candidate(self.share).map(|e| (i, e));
        }
        // Nobody over: each layer's candidate; the least recently used goes.
        self.layers
            .iter()
            .filter_map(|(&i, l)| {
                let e = l.candidate(self.share)?;
                let last = l.seen.get(&e).map_or(0, |s| s.last);
                Some((last, i, e))
            })
            .min()
            .map(|(_, i, e)| (i, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ITEM: u64 = 10;

    /// Replays `keys` on layer 0 of a one-layer policy with room for `cap`
    /// items, as the cache does (hit: touched; miss: evict, insert).
    fn replay(p: &mut FairAdaptive, keys: &[usize], cap: usize) -> usize {
        replay_into(p, &mut Vec::new(), keys, cap)
    }

    /// [`replay`] into a cache already holding `held`.
    fn replay_into(p: &mut FairAdaptive, held: &mut Vec<usize>, keys: &[usize], cap: usize) -> usize {
        let mut hits = 0;
        for &e in keys {
            if held.contains(&e) {
                hits += 1;
                p.touched((0, e));
                continue;
            }
            if held.len() >= cap && !p.admits((0, e), ITEM) {
                continue;
            }
            while held.len() >= cap {
                let Some((_, v)) = p.victim((0, e), ITEM) else { break };
                p.removed((0, v));
                held.retain(|&h| h != v);
            }
            held.push(e);
            p.inserted((0, e), ITEM);
        }
        hits
    }

    #[test]
    fn hybrid_protects_the_most_used_and_evicts_the_least_recent_of_the_rest() {
        let seen: HashMap<usize, Seen> = [(1, (9, 1)), (2, (8, 2)), (3, (1, 3)), (4, (2, 4)), (5, (1, 5))]
            .into_iter()
            .map(|(e, (uses, last))| (e, Seen { uses, last }))
            .collect();
        let all = || [1, 2, 3, 4, 5].into_iter();
        // 1 and 2 are used most but least recently: protected, so 3 goes.
        assert_eq!(pick(Mode::Hybrid, all(), &seen, 2), Some(3));
        assert_eq!(pick(Mode::Lru, all(), &seen, 2), Some(1));
        assert_eq!(pick(Mode::Lfu, all(), &seen, 2), Some(3));
        // Nothing outside the protected: the least used goes.
        assert_eq!(pick(Mode::Hybrid, [1, 2].into_iter(), &seen, 2), Some(2));
        assert_eq!(pick(Mode::Hybrid, all(), &seen, 0), Some(1));
    }

    #[test]
    fn a_recency_trace_selects_lru_and_a_popularity_trace_lfu() {
        // Sliding window of 3 over 0..: only recency predicts.
        let recency: Vec<usize> = (0..600).flat_map(|i| [i, i + 1, i + 2]).collect();
        let mut p = FairAdaptive::new(4 * ITEM, 1);
        replay(&mut p, &recency, 4);
        assert_eq!(p.mode_of(0), Some(Mode::Lru));
        // Two hot keys, each followed by 3 never-seen keys: only frequency
        // predicts (LRU with room for 4 loses both every time).
        let popular: Vec<usize> = (0..600)
            .flat_map(|i| {
                [
                    0,
                    100 + 3 * i,
                    101 + 3 * i,
                    102 + 3 * i,
                    1,
                    5000 + 3 * i,
                    5001 + 3 * i,
                    5002 + 3 * i,
                ]
            })
            .collect();
        let mut p = FairAdaptive::new(4 * ITEM, 1);
        let hits = replay(&mut p, &popular, 4);
        assert_eq!(p.mode_of(0), Some(Mode::Lfu));
        assert!(hits >= 2 * 600 - 10, "{hits}");
    }

    #[test]
    fn under_skewed_popularity_a_rare_newcomer_stays_out_once_admission_pays() {
        // Keys 0-3 are hot (each step), 100+ are never seen again: plain LFU
        // loses a hot key to every newcomer; with admission all four stay.
        let step = |i: usize| [0, 1, 2, 3, 100 + i];
        let (mut p, mut held) = (FairAdaptive::new(4 * ITEM, 1), Vec::new());
        let early: Vec<usize> = (0..50).flat_map(step).collect();
        replay_into(&mut p, &mut held, &early, 4);
        assert!(p.admits((0, 9999), ITEM), "nothing is refused before ADMIT_AFTER accesses");
        let warm: Vec<usize> = (50..300).flat_map(step).collect();
        replay_into(&mut p, &mut held, &warm, 4);
        assert_eq!(p.mode_of(0), Some(Mode::Lfu));
        assert!(!p.admits((0, 9999), ITEM), "a never-used newcomer beside four hot keys stays out");
        let later: Vec<usize> = (300..400).flat_map(step).collect();
        assert_eq!(replay_into(&mut p, &mut held, &later, 4), 4 * 100, "every hot access hits");
    }

    #[test]
    fn the_layer_over_its_share_gives_the_victim() {
        let mut p = FairAdaptive::new(4 * ITEM, 2);
        for e in 0..3 {
            p.inserted((0, e), ITEM);
        }
        p.inserted((1, 0), ITEM);
        assert_eq!(p.victim((1, 1), ITEM).map(|k| k.0), Some(0));
        assert_eq!(p.victim((0, 9), ITEM).map(|k| k.0), Some(0));
    }

    #[test]
    fn empty_and_unknown_keys_are_harmless() {
        let mut p = FairAdaptive::new(0, 0);
        assert_eq!(p.victim((0, 0), ITEM), None);
        p.touched((3, 3));
        p.removed((3, 3));
        assert_eq!(p.victim((0, 0), ITEM), None);
        // An unbounded budget: shares in whole records do not overflow.
        let mut p = FairAdaptive::new(u64::MAX, 1);
        p.inserted((0, 0), 3);
        p.touched((0, 0));
        assert!(p.admits((0, 1), 3));
    }
}
