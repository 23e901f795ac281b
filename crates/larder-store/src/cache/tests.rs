use std::sync::Arc;

use super::*;

fn cache(budget: u64, layers: usize) -> ExpertCache<u32> {
    ExpertCache::new(budget, layers)
}

#[test]
fn lru_order_and_budget() {
    // One layer: plain LRU.
    let c = cache(300, 1);
    for e in 0..3 {
        assert!(c.insert((0, e), Arc::new(e as u32), 100));
    }
    assert!(c.get((0, 0)).is_some()); // 0 is now the most recent
    assert!(c.insert((0, 3), Arc::new(3), 100));
    assert!(!c.contains((0, 1)), "least recently used is evicted first");
    assert!(c.contains((0, 0)) && c.contains((0, 2)) && c.contains((0, 3)));
    assert_eq!(c.counts().used_bytes, 300);
    assert_eq!(c.counts().evictions, 1);
}

#[test]
fn budget_never_exceeded_under_pressure() {
    let c = cache(1000, 4);
    let mut x = 12345u64;
    for i in 0..5000u64 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let layer = (x >> 33) as usize % 4;
        let expert = (x >> 40) as usize % 16;
        let bytes = 50 + (x >> 50) % 300;
        if c.get((layer, expert)).is_none() {
            c.insert((layer, expert), Arc::new(i as u32), bytes);
        }
        let n = c.counts();
        assert!(n.used_bytes <= 1000, "step {i}: {} > budget", n.used_bytes);
    }
    assert!(c.counts().peak_bytes <= 1000);
    assert!(c.counts().evictions > 0);
}

#[test]
fn too_big_is_not_kept() {
    let c = cache(100, 1);
    assert!(!c.insert((0, 0), Arc::new(0), 101));
    assert_eq!(c.counts().entries, 0);
}

#[test]
fn fair_share_protects_quiet_layers() {
    // Budget 400 over 2 layers (share 200). Layer 1 holds 2 old entries; a
    // burst on layer 0 must evict layer 0's own entries, not layer 1's.
    let c = cache(400, 2);
    c.insert((1, 0), Arc::new(0), 100);
    c.insert((1, 1), Arc::new(1), 100);
    for e in 0..10 {
        c.insert((0, e), Arc::new(e as u32), 100);
    }
    assert!(c.contains((1, 0)) && c.contains((1, 1)));
    assert!(c.contains((0, 8)) && c.contains((0, 9)));
    assert_eq!(c.counts().used_bytes, 400);
}

#[test]
fn evicted_entries_stay_alive_for_users() {
    let c = cache(100, 1);
    c.insert((0, 0), Arc::new(7), 100);
    let held = c.get((0, 0)).unwrap();
    c.insert((0, 1), Arc::new(8), 100);
    assert!(!c.contains((0, 0)));
    assert_eq!(*held, 7);
}

#[test]
fn concurrent_readers_and_writers() {
    let c = Arc::new(cache(2000, 8));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                for i in 0..2000usize {
                    let key = ((i * 7 + t) % 8, (i * 13 + t) % 32);
                    match c.get(key) {
                        Some(v) => assert_eq!(*v, (key.0 * 100 + key.1) as u32),
                        None => {
                            c.insert(key, Arc::new((key.0 * 100 + key.1) as u32), 100);
                        }
                    }
                    assert!(c.counts().used_bytes <= 2000);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(c.counts().peak_bytes <= 2000);
}

#[test]
fn a_smaller_budget_evicts_down_and_a_larger_one_refills() {
    for kind in crate::cache::PolicyKind::ALL {
        let c = ExpertCache::<u32>::with_kind(1000, 4, kind, &std::collections::HashMap::new());
        for e in 0..10 {
            c.insert((e % 4, e), Arc::new(e as u32), 100);
        }
        assert_eq!(c.counts().used_bytes, 1000, "{kind}");
        let held = c.get((1, 9));
        c.set_budget(350);
        assert_eq!(c.budget(), 350);
        assert!(c.counts().used_bytes <= 350, "{kind}: {:?}", c.counts());
        // An entry in use outlives its eviction.
        assert_eq!(held.as_deref(), Some(&9));
        assert!(!c.insert((0, 99), Arc::new(0), 400), "{kind}: more than the new budget");
        c.set_budget(1000);
        for e in 10..20 {
            c.insert((e % 4, e), Arc::new(e as u32), 100);
        }
        assert_eq!(c.counts().used_bytes, 1000, "{kind}");
        c.set_budget(0);
        assert_eq!(c.counts().used_bytes, 0, "{kind}");
    }
}

/// A policy that admits nothing once full (LRU otherwise).
struct Closed(FairLru);

impl EvictionPolicy for Closed {
    fn inserted(&mut self, key: Key, bytes: u64) {
        self.0.inserted(key, bytes)
    }
    fn touched(&mut self, key: Key) {
        self.0.touched(key)
    }
    fn removed(&mut self, key: Key) {
        self.0.removed(key)
    }
    fn victim(&mut self, incoming: Key, bytes: u64) -> Option<Key> {
        self.0.victim(incoming, bytes)
    }
    fn admits(&mut self, _incoming: Key, _bytes: u64) -> bool {
        false
    }
}

#[test]
fn a_refused_demand_entry_stays_out_and_an_expected_one_goes_in() {
    let c: ExpertCache<u32> = ExpertCache::with_policy(200, Box::new(Closed(FairLru::new(200, 1))));
    assert!(
        c.insert((0, 0), Arc::new(0), 100) && c.insert((0, 1), Arc::new(1), 100),
        "room: no question asked"
    );
    assert!(!c.insert((0, 2), Arc::new(2), 100), "full: the policy refuses");
    assert!(!c.contains((0, 2)) && c.contains((0, 0)) && c.contains((0, 1)));
    assert!(c.insert_expected((0, 3), Arc::new(3), 100), "a prefetch is always admitted");
    assert!(c.contains((0, 3)));
    assert_eq!(c.counts().used_bytes, 200);
}
