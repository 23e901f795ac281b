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
//! (stale: [`cancel_stale`]). A wrong guess costs bandwidth and cache space,
//! never correctness: prefetch only decides when bytes arrive.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::cache::Key;
use crate::io::{check_range, spawn};
use crate::queue::WorkQueue;
use crate::store::{lock, ExpertRecord, Shared, MAX_PREFETCH_THREADS};
use crate::StoreError;

pub(crate) enum PendingState {
    Queued,
    Running,
    Done(Result<Arc<ExpertRecord>, String>),
}

/// One prefetch on its way.
pub(crate) struct Pending {
    pub(crate) state: Mutex<PendingState>,
    done: Condvar,
}

impl Pending {
    /// Blocks until the prefetch finishes.
    pub(crate) fn wait(&self) -> Result<Arc<ExpertRecord>, String> {
        let mut s = lock(&self.state);
        loop {
            if let PendingState::Done(r) = &*s {
                return r.clone();
            }
            s = self.done.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }
}

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

    /// Queues the ids that are neither cached nor pending.
    pub(crate) fn request(&self, layer: usize, ids: &[usize]) {
        let sh = &*self.shared;
        let mut keys = Vec::new();
        {
            let mut pending = lock(&sh.pending);
            for &e in ids {
                let key = (layer, e);
                if sh.index.get(layer, e).is_none() || pending.contains_key(&key) || sh.cache.contains(key) {
                    continue;
                }
                pending.insert(
                    key,
                    Arc::new(Pending {
                        state: Mutex::new(PendingState::Queued),
                        done: Condvar::new(),
                    }),
                );
                keys.push(key);
            }
        }
        if !keys.is_empty() {
            self.queue.push_all(keys);
        }
    }
}

/// Most predictions one worker reads in one batch: one, so the records a
/// demand waits for first arrive first (a batch read together finishes
/// together; see `io::uring`).
const BATCH: usize = 1;

/// Cancels queued (not started) predictions for layers up to `layer`: its
/// demand has arrived, so they can no longer be used before being read
/// again. Returns how many were cancelled.
pub(crate) fn cancel_stale(sh: &Shared, layer: usize) -> u64 {
    let mut pending = lock(&sh.pending);
    let stale: Vec<Key> = pending
        .iter()
        .filter(|(k, p)| k.0 <= layer && matches!(*lock(&p.state), PendingState::Queued))
        .map(|(k, _)| *k)
        .collect();
    for k in &stale {
        pending.remove(k);
    }
    stale.len() as u64
}

fn worker(sh: &Shared, queue: &WorkQueue<Key>) {
    loop {
        let keys = queue.pop_batch(BATCH - 1);
        if keys.is_empty() {
            return;
        }
        // Claim them, but for those a demand read took back or cancelled.
        let claimed: Vec<(Key, Arc<Pending>)> = {
            let map = lock(&sh.pending);
            keys.into_iter()
                .filter_map(|key| {
                    let p = map.get(&key).cloned()?;
                    *lock(&p.state) = PendingState::Running;
                    Some((key, p))
                })
                .collect()
        };
        let (copies, jobs, mut tickets) = sh.plan_reads(claimed.iter().map(|(k, _)| *k));
        sh.backend.read_background(&jobs, &mut |job, views| {
            tickets[job] = None;
            let ((layer, expert), pending) = &claimed[job];
            finish(sh, (*layer, *expert), copies[job], pending, views);
        });
    }
}

/// Checks and caches one prefetched record, counts it, and wakes its waiters.
fn finish(sh: &Shared, key: Key, copy: usize, pending: &Pending, views: crate::io::ReadResult) {
    let (layer, expert) = key;
    let mut verify_s = 0.0;
    let result = match sh.index.get(layer, expert) {
        Some(_) => views.and_then(|views| sh.record(layer, expert, copy, &views, &mut verify_s, true)),
        None => Err(crate::StoreError::MissingExpert { layer, expert }),
    };
    if let (Err(e), true) = (&result, copy > 0) {
        // The demand read that waits for it reads the primary.
        sh.note_bad_mirror(key, e);
    }
    {
        let mut s = lock(&sh.stats);
        s.verify_s += verify_s;
        if let Ok((_, n)) = &result {
            s.bytes_read += n;
            s.prefetch_reads += 1;
            if let Some(c) = s.layers.get_mut(layer) {
                c.prefetch_reads += 1;
            }
        }
    }
    if result.is_ok() {
        lock(&sh.prefetched).insert(key);
    }
    lock(&sh.pending).remove(&key);
    *lock(&pending.state) = PendingState::Done(result.map(|(r, _)| r).map_err(|e| e.to_string()));
    pending.done.notify_all();
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.queue.shut_down();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
