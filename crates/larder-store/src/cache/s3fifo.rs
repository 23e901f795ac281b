//! S3-FIFO (Yang et al., SOSP '23) by bytes: a small FIFO (10% of the
//! budget) that new keys enter, a main FIFO, and a ghost queue of keys
//! recently dropped from the small one.
//!
//! Every held key has a 2-bit use count (0..=3, bumped on each hit). When
//! room is needed: if the small queue holds at least its share (or main is
//! empty) its oldest key is promoted to main when it was used at least once
//! since it came in, else it is the victim (and its key goes to the ghost
//! queue); otherwise main's oldest key is the victim when its count is 0,
//! else it goes back to main's tail with its count decremented. A key found
//! in the ghost queue when inserted goes straight to main. The ghost queue
//! remembers at most main's share of bytes.
//!
//! Queues are FIFO with lazy deletion: each entry carries a sequence number
//! and entries whose key was removed or re-filed since are skipped.

use std::collections::{HashMap, VecDeque};

use super::{EvictionPolicy, Key};

/// Which FIFO a held key is in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Queue {
    Small,
    Main,
}

struct Entry {
    queue: Queue,
    seq: u64,
    freq: u8,
    bytes: u64,
}

/// S3-FIFO eviction by bytes.
pub(crate) struct S3Fifo {
    small_target: u64,
    ghost_cap: u64,
    seq: u64,
    held: HashMap<Key, Entry>,
    small: VecDeque<(Key, u64)>,
    main: VecDeque<(Key, u64)>,
    small_bytes: u64,
    main_bytes: u64,
    /// Ghost FIFO of (key, seq); `ghost_keys` holds the live ones.
    ghost: VecDeque<(Key, u64)>,
    ghost_keys: HashMap<Key, (u64, u64)>,
    ghost_bytes: u64,
}

impl S3Fifo {
    /// A policy for `budget` bytes: small FIFO 10% of it, ghost up to 90%.
    pub(crate) fn new(budget: u64) -> S3Fifo {
        let small_target = (budget / 10).max(1);
        S3Fifo {
            small_target,
            ghost_cap: budget.saturating_sub(small_target),
            seq: 0,
            held: HashMap::new(),
            small: VecDeque::new(),
            main: VecDeque::new(),
            small_bytes: 0,
            main_bytes: 0,
            ghost: VecDeque::new(),
            ghost_keys: HashMap::new(),
            ghost_bytes: 0,
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Files a held key at the tail of `queue` (it must not be in a queue's
    /// byte count already).
    fn file(&mut self, key: Key, queue: Queue, freq: u8, bytes: u64) {
        let seq = self.next_seq();
        match queue {
            Queue::Small => {
                self.small.push_back((key, seq));
                self.small_bytes += bytes;
            }
            Queue::Main => {
                self.main.push_back((key, seq));
                self.main_bytes += bytes;
            }
        }
        self.held.insert(key, Entry { queue, seq, freq, bytes });
    }

    /// Takes a held key out of its queue's byte count and the map.
    fn unfile(&mut self, key: Key) -> Option<Entry> {
        let e = self.held.remove(&key)?;
        match e.queue {
            Queue::Small => self.small_bytes -= e.bytes,
            Queue::Main => self.main_bytes -= e.bytes,
        }
        Some(e)
    }

    /// The live key at the head of `queue`, dropping stale entries.
    fn head(&mut self, queue: Queue) -> Option<Key> {
        loop {
            let q = match queue {
                Queue::Small => &mut self.small,
                Queue::Main => &mut self.main,
            };
            let &(key, seq) = q.front()?;
            match self.held.get(&key) {
                Some(e) if e.seq == seq && e.queue == queue => return Some(key),
                _ => {
                    q.pop_front();
                }
            }
        }
    }

    fn remember(&mut self, key: Key, bytes: u64) {
        let seq = self.next_seq();
        if let Some((_, old)) = self.ghost_keys.insert(key, (seq, bytes)) {
            self.ghost_bytes -= old;
        }
        self.ghost.push_back((key, seq));
        self.ghost_bytes += bytes;
        while self.ghost_bytes > self.ghost_cap {
            let Some((k, s)) = self.ghost.pop_front() else { break };
            if self.ghost_keys.get(&k).is_some_and(|&(gs, _)| gs == s) {
                if let Some((_, b)) = self.ghost_keys.remove(&k) {
                    self.ghost_bytes -= b;
                }
            }
        }
    }

    /// One step of the eviction scan: `Some(victim)` or `None` after moving
    /// a key (promotion or second chance); `Err(())` when nothing is held.
    fn scan_step(&mut self) -> Result<Option<Key>, ()> {
        let small_first = self.small_bytes >= self.small_target || self.head(Queue::Main).is_none();
        let from = if small_first && self.head(Queue::Small).is_some() {
            Queue::Small
        } else {
            Queue::Main
        };
        let key = self.head(from).ok_or(())?;
        let (freq, bytes) = match self.held.get(&key) {
            Some(e) => (e.freq, e.bytes),
            None => return Err(()),
        };
        if freq == 0 {
            return Ok(Some(key));
        }
        self.unfile(key);
        match from {
            Queue::Small => self.file(key, Queue::Main, 0, bytes),
            Queue::Main => self.file(key, Queue::Main, freq - 1, bytes),
        }
        Ok(None)
    }
}

impl EvictionPolicy for S3Fifo {
    fn resized(&mut self, budget: u64) {
        self.small_target = (budget / 10).max(1);
        self.ghost_cap = budget.saturating_sub(self.small_target);
    }

    fn inserted(&mut self, key: Key, bytes: u64) {
        self.unfile(key);
        let queue = match self.ghost_keys.remove(&key) {
            Some((_, b)) => {
                self.ghost_bytes -= b;
                Queue::Main
            }
            None => Queue::Small,
        };
        self.file(key, queue, 0, bytes);
    }

    fn touched(&mut self, key: Key) {
        if let Some(e) = self.held.get_mut(&key) {
            e.freq = (e.freq + 1).min(3);
        }
    }

    fn removed(&mut self, key: Key) {
        if let Some(e) = self.unfile(key) {
            if e.queue == Queue::Small {
                self.remember(key, e.bytes);
            }
        }
    }

    fn victim(&mut self, _incoming: Key, _bytes: u64) -> Option<Key> {
        // Each non-victim step promotes a key or lowers a count, so this
        // ends within 4 x (held keys) steps.
        loop {
            match self.scan_step() {
                Ok(Some(k)) => return Some(k),
                Ok(None) => continue,
                Err(()) => return None,
            }
        }
    }
}
