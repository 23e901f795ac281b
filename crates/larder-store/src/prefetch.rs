//! Background reads of experts the model predicts it will need (docs/design.md
//! §3.5): while layer L computes, its caller hints layer L+1's likely
//! experts; a few threads take the queued predictions one at a time and read
//! them through the store's one backend
//! ([`IoBackend::read_background`](crate::io::IoBackend::read_background),
//! beside demand batches; a lazy store fetches from its source), check
//! digests and put them in the cache.
//!
//! Demand always wins: a demanded expert whose prefetch has not started is
//! taken back and read on demand; one being read is waited for; a failed
//! prefetch is retried on demand; and when a layer's demand arrives, the
//! predictions for it and earlier layers not yet started are cancelled
//! (stale: [`Prefetcher::cancel_stale`]). A wrong guess costs bandwidth and
//! cache space, never correctness: prefetch only decides when bytes arrive.
//! A layer whose predictions go mostly unused stops prefetching but for
//! one request in [`PREFETCH_PROBE`] ([`Prefetcher::request`]).
//!
//! The prefetches on their way are [`crate::pending`]'s; the counters and
//! the cache are [`Shared`]'s.

use std::sync::Arc;
use std::thread::JoinHandle;

use crate::cache::Key;
use crate::io::{check_range, spawn, ReadResult};
use crate::pending::PendingRead;
use crate::queue::WorkQueue;
use crate::shared::{ExpertRecord, Shared};
use crate::StoreError;

/// Most prefetch threads a store starts: prefetch reads one layer ahead
/// (top-k records), so more threads than that only add contention.
pub const MAX_PREFETCH_THREADS: usize = 64;
/// Background reads a layer makes before its precision can switch its
/// prefetch off, and the share of requests that still go through then.
pub const PREFETCH_PROBE: u64 = 64;
/// A layer whose prefetched records are used less often than this stops
/// prefetching (see [`ExpertStore::prefetch`](crate::ExpertStore::prefetch)).
pub(crate) const PREFETCH_MIN_PRECISION: f64 = 0.5;

/// Most predictions one worker reads in one batch: one, so the records a
/// demand waits for first arrive first (a batch read together finishes
/// together; see `io::uring`).
const BATCH: usize = 1;

pub(crate) struct Prefetcher {
    shared: Arc<Shared>,
    queue: Arc<WorkQueue<Key>>,
    threads: Vec<JoinHandle<()>>,
}

impl Prefetcher {
    /// Starts `threads` workers (at most [`MAX_PREFETCH_THREADS`]); an
    /// error, with none left running, when out of range or a spawn fails.
    pub(crate) fn start(shared: Arc<Shared>, threads: usize) -> Result<Prefetcher, StoreError> {
        check_range("prefetch threads (--prefetch)", threads, 0, MAX_PREFETCH_THREADS)?;
        // On an error, dropping the prefetcher shuts down and joins the threads started.
        let mut p = Prefetcher {
            shared,
            queue: Arc::new(WorkQueue::new()),
            threads: Vec::with_capacity(threads),
        };
        for i in 0..threads {
            let (s, q) = (p.shared.clone(), p.queue.clone());
            p.threads
                .push(spawn("prefetch", format!("larder-prefetch-{i}"), move || worker(&s, &q))?);
        }
        Ok(p)
    }

    /// Queues the ids of `layer` that are neither cached nor pending, unless
    /// the layer's prefetch is off for low precision: once it has read
    /// [`PREFETCH_PROBE`] records in the background and fewer than
    /// [`PREFETCH_MIN_PRECISION`] of them were used, only every
    /// [`PREFETCH_PROBE`]th request goes through.
    pub(crate) fn request(&self, layer: usize, ids: &[usize]) {
        let sh = &*self.shared;
        let off = sh
            .layer_counts(layer)
            .is_some_and(|c| c.prefetch_reads >= PREFETCH_PROBE && c.prefetch_precision() < PREFETCH_MIN_PRECISION);
        if off && !sh.count_prefetch_skipped(layer).is_multiple_of(PREFETCH_PROBE) {
            return;
        }
        let mut keys: Vec<Key> = ids
            .iter()
            .filter(|&&e| sh.index.get(layer, e).is_some())
            .map(|&e| (layer, e))
            .collect();
        // Not pending, then not cached, then queued unless queued meanwhile
        // (one lock at a time: see `shared`'s lock rules).
        sh.pending.retain_absent(&mut keys);
        keys.retain(|&key| !sh.cache.contains(key));
        sh.pending.queue(&mut keys);
        if !keys.is_empty() {
            self.queue.push_all(keys);
        }
    }

    /// Cancels the predictions for layers up to `layer` not yet started: its
    /// demand has arrived, so they can no longer be used before being read
    /// again. Counts them in the stats.
    pub(crate) fn cancel_stale(&self, layer: usize) {
        let cancelled = self.shared.pending.cancel_stale(layer);
        if cancelled > 0 {
            self.shared.count_cancelled(cancelled);
        }
    }
}

fn worker(sh: &Shared, queue: &WorkQueue<Key>) {
    loop {
        let keys = queue.pop_batch(BATCH - 1);
        if keys.is_empty() {
            return;
        }
        // Claim them, but for those a demand read took back or cancelled.
        let claimed = sh.pending.claim(keys);
        let (copies, jobs, mut tickets) = sh.plan_reads(claimed.iter().map(|(k, _)| *k));
        sh.backend.read_background(&jobs, &mut |job, views| {
            tickets[job] = None;
            let (key, pending) = &claimed[job];
            finish(sh, *key, copies[job], pending, views);
        });
    }
}

/// Checks and caches one prefetched record, counts it, and wakes its waiters.
fn finish(sh: &Shared, key: Key, copy: usize, pending: &PendingRead<ExpertRecord>, views: ReadResult) {
    let (layer, expert) = key;
    let mut verify_s = 0.0;
    let result = match sh.index.get(layer, expert) {
        Some(_) => views.and_then(|views| sh.record(layer, expert, copy, &views, &mut verify_s, true)),
        None => Err(StoreError::MissingExpert { layer, expert }),
    };
    if let (Err(e), true) = (&result, copy > 0) {
        // The demand read that waits for it reads the primary.
        sh.note_bad_mirror(key, e);
    }
    sh.count_prefetch(layer, verify_s, result.as_ref().ok().map(|(_, n)| *n));
    if result.is_ok() {
        sh.note_prefetched(key);
    }
    sh.pending.finish(key, pending, result.map(|(r, _)| r).map_err(|e| e.to_string()));
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.queue.shut_down();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
