//! The scheduler's prefix cache: finished conversations (the tokens fed to
//! the model and their [`SequenceState`]) kept so that a later request
//! sharing a prefix with one of them prefills only the rest.
//!
//! - **Lookup** picks the entry with the longest common prefix with the
//!   request's feed, capped so the request still feeds at least its last
//!   token (its logits must be computed).
//! - **Take-over or copy.** When the reused length is the whole entry, the
//!   request takes the state over (moved, no copy): the request extends that
//!   conversation, and when it finishes its own, longer conversation replaces
//!   it. When only a part is reused (two conversations sharing a system
//!   prompt, say), the request gets a **copy** rolled back to the shared
//!   length and the entry stays: the next request sharing it (the other
//!   conversation's next turn) still finds it whole. Each copy is counted
//!   ([`PrefixCache::copies`]). The copy clones the whole entry and then
//!   rolls back; the dropped tail's capacity stays allocated and uncounted,
//!   like the allocator's growth slack.
//! - **Insert.** A finished conversation replaces every entry it extends
//!   (whose tokens are a prefix of its tokens); one that an entry already
//!   extends adds nothing.
//! - **Eviction** is least recently used first (a hit or an insert counts as
//!   a use). The scheduler evicts when the KV budget needs the room (the
//!   cached bytes count against it), before it preempts any sequence; at most
//!   `capacity` conversations are kept.

use larder_model::SequenceState;

/// Finished conversations kept for prefix reuse; see the module docs.
pub(super) struct PrefixCache {
    entries: Vec<Entry>,
    capacity: usize,
    /// Ticks at every use; an entry's `last_used` orders eviction.
    clock: u64,
    copies: u64,
}

struct Entry {
    /// The tokens the state holds, one per position.
    tokens: Vec<u32>,
    state: SequenceState,
    last_used: u64,
}

/// What a request would reuse from the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Hit {
    entry: usize,
    /// Positions reused.
    pub reuse: usize,
    /// Whether the whole entry is reused (taken over, not copied).
    pub whole: bool,
    /// Bytes the entry holds.
    pub entry_bytes: usize,
}

impl PrefixCache {
    /// An empty cache keeping at most `capacity` conversations.
    pub(super) fn new(capacity: usize) -> Self {
        PrefixCache {
            entries: Vec::new(),
            capacity,
            clock: 0,
            copies: 0,
        }
    }

    /// Bytes of every kept state.
    pub(super) fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.state.bytes()).sum()
    }

    /// Conversations kept.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Partial hits served by a copy of an entry's state so far.
    pub(super) fn copies(&self) -> u64 {
        self.copies
    }

    pub(super) fn clear(&mut self) {
        self.entries.clear();
    }

    /// Drops the least recently used conversation; `false` when none is kept.
    pub(super) fn evict_lru(&mut self) -> bool {
        let Some(i) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used) else {
            return false;
        };
        self.entries.swap_remove(i);
        true
    }

    /// The longest reuse for `feed` (at most `feed.len() - 1` positions), if
    /// any entry shares at least one token with it.
    pub(super) fn lookup(&self, feed: &[u32]) -> Option<Hit> {
        let limit = feed.len().saturating_sub(1);
        let (entry, reuse) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let common = e.tokens.iter().zip(feed).take_while(|(a, b)| a == b).count();
                (i, common.min(limit).min(e.state.len()))
            })
            .max_by_key(|&(i, reuse)| (reuse, self.entries[i].last_used))?;
        (reuse > 0).then(|| Hit {
            entry,
            reuse,
            whole: reuse == self.entries[entry].state.len(),
            entry_bytes: self.entries[entry].state.bytes(),
        })
    }

    /// The state for `hit` (from [`lookup`](Self::lookup), the cache
    /// unchanged since): the entry itself when whole, else a copy rolled back
    /// to `hit.reuse` positions. `None` when the state cannot roll back (the
    /// request then prefills from the start).
    pub(super) fn take(&mut self, hit: Hit) -> Option<SequenceState> {
        if hit.entry >= self.entries.len() {
            return None;
        }
        if hit.whole {
            return Some(self.entries.swap_remove(hit.entry).state);
        }
        self.clock += 1;
        let entry = &mut self.entries[hit.entry];
        entry.last_used = self.clock;
        let mut copy = entry.state.clone();
        self.copies += 1;
        copy.rollback(hit.reuse).is_ok().then_some(copy)
    }

    /// Keeps a finished conversation (`tokens` one per position of `state`);
    /// see the module docs for what it replaces.
    pub(super) fn insert(&mut self, tokens: Vec<u32>, state: SequenceState) {
        if self.capacity == 0 || state.is_empty() || tokens.len() != state.len() {
            return;
        }
        self.clock += 1;
        if let Some(e) = self.entries.iter_mut().find(|e| e.tokens.starts_with(&tokens)) {
            e.last_used = self.clock;
            return;
        }
        self.entries.retain(|e| !tokens.starts_with(&e.tokens));
        while self.entries.len() >= self.capacity {
            self.evict_lru();
        }
        self.entries.push(Entry {
            tokens,
            state,
            last_used: self.clock,
        });
    }
}
