//! `--ram-budget auto`: the expert cache sized from the memory available at
//! start, then shrunk under memory pressure and grown back when it passes,
//! without a restart. Which experts are cached changes when bytes arrive,
//! never what is computed, so output is bit-identical at every size.
//!
//! The size at start ([`auto_budget`]) is what is available
//! ([`crate::memory_limit::available`]: `MemAvailable`, or the room the
//! cgroup's v1 or v2 memory limit leaves when lower) minus headroom
//! for the OS, page cache and the first requests' KV cache
//! ([`crate::plan::headroom`]: the larger of 1 GiB and 5%), minus the spine
//! (not loaded yet) and the prefill activation memory, capped at the bank.
//!
//! A [`MemoryWatch`] thread then polls what is available every
//! [`WatchConfig::period`]. Below the headroom, it shrinks the budget by the
//! shortfall (never under one layer step's experts); above twice the
//! headroom, it grows the budget back by half the surplus, up to the size at
//! start. It holds only a weak reference: dropping the engine ends it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use larder_store::ExpertStore;

use crate::plan::headroom;

/// What the watcher keeps the budget between, and how often it looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchConfig {
    /// The budget at start: growth stops here.
    pub ceiling: u64,
    /// The least budget: one layer step's experts.
    pub floor: u64,
    /// Memory to keep available.
    pub headroom: u64,
    pub period: Duration,
}

/// Memory available to this process now: `MemAvailable`, or the room left
/// under its cgroup's v1 or v2 memory limit when that is lower
/// ([`crate::memory_limit::available`]).
pub(crate) fn available() -> Option<u64> {
    crate::memory_limit::available()
}

/// The cache budget `--ram-budget auto` starts with (see the module doc):
/// `available - headroom - spine - prefill`, capped at `bank`, at least `floor`.
pub(crate) fn auto_budget(available: u64, spine: u64, prefill: u64, bank: u64, floor: u64) -> u64 {
    available
        .saturating_sub(headroom(available))
        .saturating_sub(spine)
        .saturating_sub(prefill)
        .min(bank)
        .max(floor)
}

/// The budget after one look: shrink by the shortfall under the headroom,
/// grow by half the surplus over twice the headroom.
pub(crate) fn next_budget(budget: u64, available: u64, c: &WatchConfig) -> u64 {
    if available < c.headroom {
        budget.saturating_sub(c.headroom - available).max(c.floor)
    } else if available > 2 * c.headroom && budget < c.ceiling {
        budget.saturating_add((available - 2 * c.headroom) / 2).min(c.ceiling)
    } else {
        budget
    }
}

/// A running watcher; stops when dropped.
pub struct MemoryWatch {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl MemoryWatch {
    /// Watches [`available`] memory for `store`'s cache.
    pub fn start(store: &Arc<ExpertStore>, config: WatchConfig) -> MemoryWatch {
        Self::start_with(store, config, Box::new(available))
    }

    /// Watches with `available` as the source of the memory figure (tests).
    pub fn start_with(store: &Arc<ExpertStore>, config: WatchConfig, available: Box<dyn Fn() -> Option<u64> + Send>) -> MemoryWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let weak: Weak<ExpertStore> = Arc::downgrade(store);
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("larder-memory-watch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(config.period);
                    let (Some(store), Some(avail)) = (weak.upgrade(), available()) else {
                        continue;
                    };
                    let cache = store.cache();
                    let next = next_budget(cache.budget(), avail, &config);
                    if next != cache.budget() {
                        cache.set_budget(next);
                    }
                }
            })
            .ok();
        MemoryWatch { stop, handle }
    }
}

impl Drop for MemoryWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn the_budget_follows_pressure_between_floor_and_ceiling() {
        let c = WatchConfig {
            ceiling: 10 * GIB,
            floor: GIB,
            headroom: 2 * GIB,
            period: Duration::from_millis(1),
        };
        assert_eq!(next_budget(10 * GIB, GIB, &c), 9 * GIB, "1 GiB short");
        assert_eq!(next_budget(2 * GIB, 0, &c), GIB, "never under the floor");
        assert_eq!(next_budget(5 * GIB, 3 * GIB, &c), 5 * GIB, "between: hold");
        assert_eq!(next_budget(5 * GIB, 8 * GIB, &c), 7 * GIB, "half the surplus");
        assert_eq!(next_budget(9 * GIB, 40 * GIB, &c), 10 * GIB, "up to the ceiling");
    }

    #[test]
    fn auto_leaves_headroom_spine_and_prefill() {
        // 64 GiB available: 3.2 GiB headroom, 20 spine, 8 prefill.
        let b = auto_budget(64 * GIB, 20 * GIB, 8 * GIB, 1000 * GIB, GIB);
        assert_eq!(b, 64 * GIB - headroom(64 * GIB) - 28 * GIB);
        assert_eq!(
            auto_budget(64 * GIB, 20 * GIB, 8 * GIB, 5 * GIB, GIB),
            5 * GIB,
            "capped at the bank"
        );
        assert_eq!(auto_budget(GIB, 20 * GIB, 0, 5 * GIB, GIB / 2), GIB / 2, "at least the floor");
    }
}
