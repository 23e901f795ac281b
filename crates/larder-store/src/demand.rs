//! The demand reads of one [`ExpertStore::fetch`](crate::ExpertStore::fetch):
//! the missing records of a layer step, read through the backend in one
//! batch and handed to the caller as they become usable.
//!
//! A record is usable once its digest has been checked. Checking runs at
//! about one core's memory speed (~17 GB/s here), slower than four NVMe
//! drives deliver, so on the computing thread it would serialise behind
//! compute. With more than one thread in the rayon pool, each completed
//! read's digest is instead checked as a task on that pool, beside the
//! kernels: several records are checked at once, and the computing thread
//! keeps computing the records already checked. A record reaches the
//! caller and the cache only after its digest matched (fail closed); the
//! order records reach the caller in never changes results, because the
//! MoE step sums experts in canonical router order.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use crate::io::ReadResult;
use crate::shared::{ExpertRecord, Shared};
use crate::StoreError;

/// The caller's callback: `ready(i, record)` for `ids[i]`.
pub(crate) type Ready<'a, E> = &'a mut dyn FnMut(usize, Arc<ExpertRecord>) -> Result<(), E>;

/// What one fetch spent and read, and its first error.
pub(crate) struct Tally<E> {
    /// Seconds inside the caller's callback (computing).
    pub in_ready: f64,
    /// Seconds the computing thread itself spent checking digests.
    pub verify_inline_s: f64,
    /// Seconds pool tasks spent checking digests (beside the computing thread).
    pub verify_pool_s: f64,
    /// Payload bytes of the records read.
    pub bytes: u64,
    /// The first error: a read, a digest, or the callback's.
    pub failure: Option<E>,
}

impl<E: From<StoreError>> Tally<E> {
    pub(crate) fn new() -> Tally<E> {
        Tally {
            in_ready: 0.0,
            verify_inline_s: 0.0,
            verify_pool_s: 0.0,
            bytes: 0,
            failure: None,
        }
    }

    /// Hands `record` (or its error) for `ids[i]` to `ready`, timing the call;
    /// nothing after the first failure.
    pub(crate) fn hand(&mut self, ready: Ready<'_, E>, i: usize, outcome: Result<(Arc<ExpertRecord>, u64), StoreError>) {
        if self.failure.is_some() {
            return;
        }
        let outcome = outcome.map_err(E::from).and_then(|(record, n)| {
            self.bytes += n;
            let t = Instant::now();
            let r = ready(i, record);
            self.in_ready += t.elapsed().as_secs_f64();
            r
        });
        if let Err(e) = outcome {
            self.failure = Some(e);
        }
    }

    /// Hands every record of `cached` to `ready` (they cost no read).
    pub(crate) fn hand_cached(&mut self, ready: Ready<'_, E>, cached: &mut Vec<(usize, Arc<ExpertRecord>)>) {
        for (i, rec) in cached.drain(..) {
            if self.failure.is_some() {
                return;
            }
            let t = Instant::now();
            let r = ready(i, rec);
            self.in_ready += t.elapsed().as_secs_f64();
            if let Err(e) = r {
                self.failure = Some(e);
            }
        }
    }
}

/// Reads `ids[misses[..]]` of `layer` in one backend batch and hands each
/// to `ready` once checked; `cached` goes first, when the first read
/// completes (the other reads are in flight then, so computing it overlaps them).
pub(crate) fn read_misses<E: From<StoreError>>(
    sh: &Shared,
    layer: usize,
    ids: &[usize],
    misses: &[usize],
    cached: &mut Vec<(usize, Arc<ExpertRecord>)>,
    ready: Ready<'_, E>,
    tally: &mut Tally<E>,
) {
    let (copies, jobs, mut tickets) = sh.plan_reads(misses.iter().map(|&i| (layer, ids[i])));
    // Records whose mirror copy failed: read from the primary once the batch is in.
    let mut again: Vec<(usize, StoreError)> = Vec::new();
    if !(sh.verify && rayon::current_num_threads() > 1) {
        sh.backend.read(&jobs, &mut |job, result| {
            tickets[job] = None;
            tally.hand_cached(ready, cached);
            if tally.failure.is_none() {
                let i = misses[job];
                let mut secs = 0.0;
                let outcome = result.and_then(|views| sh.record(layer, ids[i], copies[job], &views, &mut secs, false));
                tally.verify_inline_s += secs;
                match outcome {
                    Err(e) if copies[job] > 0 => again.push((i, e)),
                    outcome => tally.hand(ready, i, outcome),
                }
            }
        });
        read_primaries(sh, layer, ids, again, ready, tally);
        return;
    }
    let (tx, rx) = mpsc::channel::<(usize, Result<(Arc<ExpertRecord>, u64), StoreError>, f64)>();
    let take = |tally: &mut Tally<E>, ready: Ready<'_, E>, rx: &mpsc::Receiver<_>, again: &mut Vec<(usize, StoreError)>| {
        for (job, outcome, secs) in rx.try_iter() {
            tally.verify_pool_s += secs;
            match outcome {
                Err(e) if copies[job] > 0 => again.push((misses[job], e)),
                outcome => tally.hand(ready, misses[job], outcome),
            }
        }
    };
    // Tasks borrow `sh`; the scope ends when every check has run (the
    // computing thread helps rather than blocks, so a one-worker pool
    // cannot deadlock), then the last checked records are handed over.
    rayon::in_place_scope(|scope| {
        sh.backend.read(&jobs, &mut |job, result: ReadResult| {
            tickets[job] = None;
            tally.hand_cached(ready, cached);
            if tally.failure.is_some() {
                return;
            }
            let (expert, copy, tx) = (ids[misses[job]], copies[job], tx.clone());
            scope.spawn(move |_| {
                let mut secs = 0.0;
                let outcome = result.and_then(|views| sh.record(layer, expert, copy, &views, &mut secs, false));
                // The receiver outlives the scope: a send cannot fail.
                let _ = tx.send((job, outcome, secs));
            });
            take(tally, ready, &rx, &mut again);
        });
    });
    drop(tx);
    take(tally, ready, &rx, &mut again);
    read_primaries(sh, layer, ids, again, ready, tally);
}

/// Reads from the primary each record whose mirror copy failed, and hands it over.
fn read_primaries<E: From<StoreError>>(
    sh: &Shared,
    layer: usize,
    ids: &[usize],
    again: Vec<(usize, StoreError)>,
    ready: Ready<'_, E>,
    tally: &mut Tally<E>,
) {
    for (i, failed) in again {
        if tally.failure.is_some() {
            return;
        }
        let mut secs = 0.0;
        let outcome = sh.read_primary(layer, ids[i], &failed, &mut secs, false);
        tally.verify_inline_s += secs;
        tally.hand(ready, i, outcome);
    }
}
