//! The scheduler's prefix cache: finished conversations (the tokens fed to
//! the model, their [`SequenceState`] and its [`ReturnPoints`]) kept so that
//! a later request sharing a prefix with one of them prefills only the rest.
//!
//! - **Lookup** picks the entry with the longest common prefix with the
//!   request's feed, capped so the request still feeds at least its last
//!   token (its logits must be computed). A state that cannot roll back (a
//!   recurrent layer, Kimi Linear) reuses either the whole entry or only as
//!   far as the nearest snapshot it kept at or before the shared prefix (its
//!   prompt minus the last token, `crate::return_points`); an entry with no
//!   such snapshot gives no hit.
//! - **Take-over or copy.** When the reused length is the whole entry, the
//!   request takes the state over with its snapshots (moved, no copy): the
//!   request extends that conversation, and when it finishes its own, longer
//!   conversation replaces it. When only a part is reused (two conversations
//!   sharing a system prompt, say), the request gets a **copy** taken back to
//!   the shared length (rolled back, or its snapshot restored; the copy takes
//!   no snapshot) and the entry stays: the next request sharing it (the
//!   other conversation's next turn) still finds it whole. Each copy is
//!   counted ([`PrefixCache::copies`]). The copy clones the whole entry and
//!   then rolls back; the dropped tail's capacity stays allocated and
//!   uncounted, like the allocator's growth slack.
//! - **Insert.** A finished conversation replaces every entry it extends
//!   (whose tokens are a prefix of its tokens); one that an entry already
//!   extends adds nothing.
//! - **Eviction** is least recently used first (a hit or an insert counts as
//!   a use). The scheduler evicts when the KV budget needs the room (the
//!   cached bytes, snapshots included, count against it), before it
//!   preempts any sequence; at most `capacity` conversations are kept.

use larder_model::SequenceState;

use crate::return_points::ReturnPoints;

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
    /// Snapshots of `state` to return to (only when it cannot roll back).
    points: ReturnPoints,
    last_used: u64,
}

impl Entry {
    fn bytes(&self) -> usize {
        self.state.bytes() + self.points.bytes()
    }
}

/// What a request would reuse from the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Hit {
    entry: usize,
    /// Positions reused.
    pub reuse: usize,
    /// Whether the whole entry is reused (taken over, not copied).
    pub whole: bool,
    /// Bytes the entry holds (state and snapshots).
    pub entry_bytes: usize,
    /// Bytes of the snapshots the request takes over with a whole entry (0 for a copy).
    pub carried_bytes: usize,
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

    /// Bytes of every kept state and snapshot.
    pub(super) fn bytes(&self) -> usize {
        self.entries.iter().map(Entry::bytes).sum()
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
        let (entry, reuse) = longest_reuse(
            feed,
            self.entries.iter().map(|e| (e.tokens.as_slice(), e.last_used)),
            |i, common| self.entries[i].points.reachable(&self.entries[i].state, common),
        )?;
        let e = &self.entries[entry];
        let whole = reuse == e.state.len();
        (reuse > 0).then(|| Hit {
            entry,
            reuse,
            whole,
            entry_bytes: e.bytes(),
            carried_bytes: if whole { e.points.bytes() } else { 0 },
        })
    }

    /// The state for `hit` (from [`lookup`](Self::lookup), the cache
    /// unchanged since): the entry itself with its snapshots when whole, else
    /// a copy taken back to `hit.reuse` positions (rolled back, or its
    /// snapshot restored) with none. `None` when that fails (the request
    /// then prefills from the start).
    pub(super) fn take(&mut self, hit: Hit) -> Option<(SequenceState, ReturnPoints)> {
        if hit.entry >= self.entries.len() {
            return None;
        }
        if hit.whole {
            let e = self.entries.swap_remove(hit.entry);
            return Some((e.state, e.points));
        }
        self.clock += 1;
        let entry = &mut self.entries[hit.entry];
        entry.last_used = self.clock;
        let mut copy = entry.state.clone();
        self.copies += 1;
        let kept = entry.points.up_to(hit.reuse).keep_prefix(&mut copy, hit.reuse);
        (kept.ok() == Some(hit.reuse)).then(|| (copy, ReturnPoints::new()))
    }

    /// Keeps a finished conversation (`tokens` one per position of `state`);
    /// see the module docs for what it replaces.
    pub(super) fn insert(&mut self, tokens: Vec<u32>, state: SequenceState, points: ReturnPoints) {
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
            points,
            last_used: self.clock,
        });
    }
}

/// Of `entries` (each its tokens and last use), the one giving `feed` the
/// longest reuse and that reuse: `reachable(i, common)` says how much of a
/// common prefix of `common` positions entry `i` can give (at most
/// `feed.len() - 1`, so the request still feeds its last token); ties go to
/// the most recently used. `None` when there is no entry.
pub(super) fn longest_reuse<'a>(
    feed: &[u32],
    entries: impl Iterator<Item = (&'a [u32], u64)>,
    reachable: impl Fn(usize, usize) -> usize,
) -> Option<(usize, usize)> {
    let limit = feed.len().saturating_sub(1);
    entries
        .enumerate()
        .map(|(i, (tokens, last_used))| {
            let common = tokens.iter().zip(feed).take_while(|(a, b)| a == b).count();
            (i, reachable(i, common.min(limit)), last_used)
        })
        .max_by_key(|&(_, reuse, last_used)| (reuse, last_used))
        .map(|(i, reuse, _)| (i, reuse))
}
