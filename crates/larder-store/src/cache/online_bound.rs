//! An upper bound on what any online eviction policy can reach on a trace
//! whose routes depend only on the previous token (the routing presets are
//! drawn so; real decode is close to it), to read a policy's gap to Belady
//! against: how much of it no policy without knowledge of the future closes.
//!
//! Per key, the whole trace gives how often it is used in a step after a
//! step that used it (`p1`) and after one that did not (`p0`). Before every
//! step the bound's cache holds, at no cost, the keys most likely to be used
//! next (`p1` or `p0` by the previous step), most likely first, as many as
//! the budget fits. It flatters every online policy three times over: the
//! likelihoods are counted on the very trace replayed, the cache is
//! rearranged for free (a real cache only inserts what misses), and nothing
//! is ever read to fill it. A policy at this bound cannot be bettered
//! online; one below it can.

use std::collections::{HashMap, HashSet};

use super::sim::{SimResult, Step};
use super::Key;

/// Per key: steps after a step that used it (and of those, steps that used
/// it again), and the same after a step that did not.
#[derive(Default, Clone, Copy)]
struct Counts {
    after_use: u64,
    reused: u64,
    after_none: u64,
    used: u64,
}

/// The online bound (see the module doc) of `steps` in `budget` bytes.
pub fn simulate_online_bound(steps: &[Step], budget: u64) -> SimResult {
    let sets: Vec<HashMap<Key, u64>> = steps.iter().map(|s| s.accesses.iter().copied().collect()).collect();
    let mut counts: HashMap<Key, Counts> = HashMap::new();
    let mut bytes: HashMap<Key, u64> = HashMap::new();
    for set in &sets {
        bytes.extend(set.iter().map(|(k, b)| (*k, *b)));
    }
    for pair in sets.windows(2) {
        for &key in bytes.keys() {
            let c = counts.entry(key).or_default();
            let now = pair[1].contains_key(&key);
            if pair[0].contains_key(&key) {
                c.after_use += 1;
                c.reused += u64::from(now);
            } else {
                c.after_none += 1;
                c.used += u64::from(now);
            }
        }
    }
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let mut result = SimResult::default();
    let mut hits = 0u64;
    let mut ranked: Vec<(f64, Key)> = Vec::with_capacity(bytes.len());
    let mut held: HashSet<Key> = HashSet::new();
    for (i, set) in sets.iter().enumerate() {
        held.clear();
        if i > 0 {
            ranked.clear();
            for (&key, c) in &counts {
                let p = if sets[i - 1].contains_key(&key) {
                    ratio(c.reused, c.after_use)
                } else {
                    ratio(c.used, c.after_none)
                };
                if p > 0.0 {
                    ranked.push((p, key));
                }
            }
            ranked.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            let mut room = budget;
            for &(_, key) in &ranked {
                let b = bytes[&key];
                if b <= room {
                    room -= b;
                    held.insert(key);
                }
            }
        }
        result.tokens += steps[i].tokens as u64;
        for (key, &b) in set {
            result.accesses += 1;
            result.bytes_requested += b;
            if held.contains(key) {
                hits += 1;
            } else {
                result.bytes_read += b;
            }
        }
    }
    result.hits = hits;
    result.hit_rate = ratio(hits, result.accesses);
    result.bytes_read_per_token = ratio(result.bytes_read, result.tokens);
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::sim::simulate_belady;

    fn step(keys: &[usize]) -> Step {
        Step {
            tokens: 1,
            accesses: keys.iter().map(|&e| ((0, e), 1)).collect(),
        }
    }

    #[test]
    fn a_repeating_stream_is_all_hits_after_the_first_step() {
        let steps: Vec<Step> = (0..10).map(|_| step(&[1, 2])).collect();
        let r = simulate_online_bound(&steps, 2);
        assert_eq!((r.accesses, r.hits), (20, 18));
    }

    #[test]
    fn an_alternating_stream_is_learned_from_its_transitions() {
        // 0 and 1 alternate with 2 always there; one slot: holding 2 is best, online or not.
        let steps: Vec<Step> = (0..20).map(|t| step(&[t % 2, 2])).collect();
        let bound = simulate_online_bound(&steps, 1);
        let belady = simulate_belady(&steps, 1);
        assert_eq!(bound.hits, 19);
        assert!(bound.hits <= belady.hits, "{bound:?} {belady:?}");
        // Two slots: after a 0 comes a 1, which the transition counts know.
        assert_eq!(simulate_online_bound(&steps, 2).hits, 38);
    }
}
