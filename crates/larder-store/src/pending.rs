//! The prefetches on their way ([`crate::prefetch`]), by key: which are
//! queued, which a prefetch thread has started, and for a started one its
//! outcome once read, for a demand to wait on.
//!
//! A prefetch moves queued -> started -> finished (then out of the map),
//! or queued -> out of the map when a demand takes it back or a layer's
//! demand makes it stale. That state lives in the map, under the map's one
//! lock; a [`PendingRead`]'s own lock guards only its outcome. No method
//! takes one lock while holding the other (see [`crate::shared`] for the
//! store's lock rules).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::cache::Key;
use crate::locks::{lock, wait};

/// One prefetch's outcome, for the demands that wait for it.
pub(crate) struct PendingRead<T> {
    /// `None` until the prefetch finishes; then the record or the error's message.
    outcome: Mutex<Option<Result<Arc<T>, String>>>,
    done: Condvar,
}

impl<T> PendingRead<T> {
    fn new() -> PendingRead<T> {
        PendingRead {
            outcome: Mutex::new(None),
            done: Condvar::new(),
        }
    }

    /// Blocks until the prefetch finishes; its record or error message.
    pub(crate) fn wait(&self) -> Result<Arc<T>, String> {
        let mut outcome = lock(&self.outcome);
        loop {
            if let Some(r) = &*outcome {
                return r.clone();
            }
            outcome = wait(&self.done, outcome);
        }
    }

    /// Records the outcome and wakes every waiter.
    fn finish(&self, outcome: Result<Arc<T>, String>) {
        *lock(&self.outcome) = Some(outcome);
        self.done.notify_all();
    }
}

struct Entry<T> {
    /// Whether a prefetch thread has claimed it (it can no longer be taken back).
    started: bool,
    read: Arc<PendingRead<T>>,
}

/// The prefetches queued or running, by key.
pub(crate) struct PendingReads<T> {
    map: Mutex<HashMap<Key, Entry<T>>>,
}

impl<T> PendingReads<T> {
    pub(crate) fn new() -> PendingReads<T> {
        PendingReads {
            map: Mutex::new(HashMap::new()),
        }
    }

    fn map(&self) -> MutexGuard<'_, HashMap<Key, Entry<T>>> {
        lock(&self.map)
    }

    /// Keeps in `keys` those with no prefetch on its way.
    pub(crate) fn retain_absent(&self, keys: &mut Vec<Key>) {
        let map = self.map();
        keys.retain(|k| !map.contains_key(k));
    }

    /// Queues each of `keys` that has no prefetch on its way yet and keeps
    /// in `keys` exactly those (each once).
    pub(crate) fn queue(&self, keys: &mut Vec<Key>) {
        let mut map = self.map();
        keys.retain(|&k| {
            if map.contains_key(&k) {
                return false;
            }
            let read = Arc::new(PendingRead::new());
            map.insert(k, Entry { started: false, read });
            true
        });
    }

    /// For a demand of `key`: a queued prefetch is taken back (the demand
    /// reads it now) and `None` returned, as when there is none; a started
    /// one is returned to wait for.
    pub(crate) fn take_back(&self, key: Key) -> Option<Arc<PendingRead<T>>> {
        let mut map = self.map();
        let entry = map.get(&key)?;
        if entry.started {
            return Some(entry.read.clone());
        }
        map.remove(&key);
        None
    }

    /// Cancels the queued (not started) prefetches of layers up to `layer`;
    /// returns how many.
    pub(crate) fn cancel_stale(&self, layer: usize) -> u64 {
        let mut map = self.map();
        let before = map.len();
        map.retain(|k, e| e.started || k.0 > layer);
        (before - map.len()) as u64
    }

    /// Claims for a prefetch thread those of `keys` still queued (a demand
    /// may have taken one back, or a layer's demand cancelled it, since it
    /// was queued), marking them started.
    pub(crate) fn claim(&self, keys: Vec<Key>) -> Vec<(Key, Arc<PendingRead<T>>)> {
        let mut map = self.map();
        keys.into_iter()
            .filter_map(|key| {
                let entry = map.get_mut(&key).filter(|e| !e.started)?;
                entry.started = true;
                Some((key, entry.read.clone()))
            })
            .collect()
    }

    /// Ends the started prefetch `read` of `key`: out of the map (a later
    /// demand finds the record in the cache, or reads it), then its waiters woken.
    pub(crate) fn finish(&self, key: Key, read: &PendingRead<T>, outcome: Result<Arc<T>, String>) {
        // Dropped after the map's lock is released.
        let _entry = self.map().remove(&key);
        read.finish(outcome);
    }
}
