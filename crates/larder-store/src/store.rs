//! [`ExpertStore`]: the RAM cache in front of an I/O backend over an
//! [`ExpertIndex`]. `fetch` hands out each requested expert as soon as it is
//! available (hits at once, misses as their reads complete and their digests
//! are checked, several at once on the rayon pool),
//! fills the cache and counts everything in [`StoreStats`]; `prefetch`
//! starts background reads of experts the model expects to need next
//! (see [`crate::prefetch`]).
//!
//! The state the store shares with its prefetch threads and digest tasks,
//! and the rule that no two of its locks are ever held together, are
//! `shared.rs`'s; this file locks nothing itself.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::cache::{ExpertCache, Key};
use crate::demand::Tally;
use crate::io::{open_backend, IoBackend, IoKind, IoOptions};
use crate::location::ExpertIndex;
use crate::pending::PendingRead;
use crate::prefetch::Prefetcher;
pub(crate) use crate::prefetch::{MAX_PREFETCH_THREADS, PREFETCH_MIN_PRECISION, PREFETCH_PROBE};
pub(crate) use crate::shared::ExpertRecord;
use crate::shared::{DemandCounts, Shared};
use crate::stats::StoreStats;
use crate::StoreError;

/// How to open a store.
#[derive(Debug, Clone, Copy)]
pub struct StoreOptions {
    pub io: IoOptions,
    /// Bytes the expert cache may hold (0: no cache; see [`smallest_budget`]).
    pub ram_budget: u64,
    /// Check each record's digest when it is read (where the index has one).
    pub verify: bool,
    /// Background threads reading predicted experts, at most
    /// [`MAX_PREFETCH_THREADS`] (0: no prefetch; mmap never prefetches).
    pub prefetch_threads: usize,
}

impl StoreOptions {
    /// Refuses option values the store cannot honour (library users bypass
    /// the command line's checks): I/O depth and prefetch threads out of range.
    pub fn check(&self) -> Result<(), StoreError> {
        crate::io::check_depth(self.io.depth)?;
        crate::io::check_range("prefetch threads (--prefetch)", self.prefetch_threads, 0, MAX_PREFETCH_THREADS)
    }

    /// Refuses a RAM budget that is above 0 but smaller than the largest
    /// record of `index` (such a cache could never hold anything, so every
    /// read would be paid again); 0 means "no cache" and is accepted.
    pub fn check_budget(&self, index: &ExpertIndex) -> Result<(), StoreError> {
        let smallest = smallest_budget(index, self.io.direct && self.io.kind != IoKind::Mmap);
        if self.ram_budget == 0 || self.ram_budget >= smallest {
            return Ok(());
        }
        Err(StoreError::BudgetTooSmall {
            budget: self.ram_budget,
            smallest,
        })
    }
}

/// The smallest RAM budget that holds one record of `index`: its largest
/// record as read (whole 4 KiB blocks, more with O_DIRECT padding).
pub fn smallest_budget(index: &ExpertIndex, direct: bool) -> u64 {
    index
        .layers
        .iter()
        .flatten()
        .map(|loc| crate::buf::align_up(crate::io::plan(&loc.extents, direct).1).max(crate::buf::ALIGN as u64))
        .max()
        .unwrap_or(0)
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            io: IoOptions::default(),
            ram_budget: 4 << 30,
            verify: true,
            prefetch_threads: 2,
        }
    }
}

pub struct ExpertStore {
    shared: Arc<Shared>,
    prefetcher: Option<Prefetcher>,
}

impl ExpertStore {
    /// Opens the index's files with the chosen backend; an error for
    /// options out of range ([`StoreOptions::check`]), a RAM budget that
    /// cannot hold one record ([`StoreOptions::check_budget`]) or threads
    /// that cannot start.
    pub fn open(index: ExpertIndex, opts: StoreOptions) -> Result<ExpertStore, StoreError> {
        opts.check()?;
        opts.check_budget(&index)?;
        let backend = open_backend(&index.files, opts.io)?;
        let prefetch = if opts.io.kind == IoKind::Mmap { 0 } else { opts.prefetch_threads };
        Self::with_backend_and_prefetch(index, backend, opts.ram_budget, opts.verify, prefetch)
    }

    /// A store over a given backend (a lazy store's, say) with `prefetch`
    /// background threads reading through it; options checked as in [`open`](Self::open).
    pub fn over_backend(index: ExpertIndex, backend: Arc<dyn IoBackend>, opts: StoreOptions) -> Result<ExpertStore, StoreError> {
        opts.check()?;
        opts.check_budget(&index)?;
        Self::with_backend_and_prefetch(index, backend, opts.ram_budget, opts.verify, opts.prefetch_threads)
    }

    fn with_backend_and_prefetch(
        index: ExpertIndex,
        backend: Arc<dyn IoBackend>,
        ram_budget: u64,
        verify: bool,
        prefetch: usize,
    ) -> Result<ExpertStore, StoreError> {
        let mut store = Self::with_backend(index, backend, ram_budget, verify);
        if prefetch > 0 {
            store.prefetcher = Some(Prefetcher::start(store.shared.clone(), prefetch)?);
        }
        Ok(store)
    }

    /// A store without prefetching over a given backend.
    pub fn with_backend(index: ExpertIndex, backend: Arc<dyn IoBackend>, ram_budget: u64, verify: bool) -> ExpertStore {
        ExpertStore {
            shared: Arc::new(Shared::new(index, backend, ram_budget, verify)),
            prefetcher: None,
        }
    }

    pub fn index(&self) -> &ExpertIndex {
        &self.shared.index
    }

    pub fn backend(&self) -> &dyn IoBackend {
        &*self.shared.backend
    }

    pub fn cache(&self) -> &ExpertCache<ExpertRecord> {
        &self.shared.cache
    }

    /// Problems that failed no read since the last call (a damaged mirror
    /// copy, read from the primary instead), each said once.
    pub fn take_warnings(&self) -> Vec<String> {
        self.shared.take_warnings()
    }

    pub fn stats(&self) -> StoreStats {
        self.shared.stats()
    }

    /// Starts background reads of `ids` of `layer` that are neither cached
    /// nor already on their way. Never blocks on I/O; a no-op without prefetch threads.
    ///
    /// A layer whose predictions are mostly wrong stops prefetching: once it
    /// has read [`PREFETCH_PROBE`] records in the background and fewer than
    /// `PREFETCH_MIN_PRECISION` of them were used (each wasted read then
    /// costs more bandwidth than a useful one saves), only every
    /// [`PREFETCH_PROBE`]th request goes through, so the figure keeps being
    /// measured and prefetch resumes if predictions improve.
    pub fn prefetch(&self, layer: usize, ids: &[usize]) {
        if let Some(p) = &self.prefetcher {
            p.request(layer, ids);
        }
    }

    /// Prefetch requests skipped per layer because its precision was low.
    pub fn prefetch_skipped(&self) -> HashMap<usize, u64> {
        self.shared.prefetch_skipped()
    }

    /// Calls `ready(i, record)` for each `ids[i]` of `layer` as soon as its
    /// bytes are available and checked (digests of demand reads are checked
    /// on the rayon pool, see `crate::demand`): reads in about completion order, then ones a prefetch
    /// is still reading. Cached ones are handed over when the first read
    /// completes (the other reads are in flight then, so computing the
    /// cached experts overlaps them), or at once when nothing is read.
    /// Stops at the first error (a read, a digest, or one `ready` returned).
    pub fn fetch<E: From<StoreError>>(
        &self,
        layer: usize,
        ids: &[usize],
        ready: &mut dyn FnMut(usize, Arc<ExpertRecord>) -> Result<(), E>,
    ) -> Result<(), E> {
        let sh = &*self.shared;
        if let Some(p) = &self.prefetcher {
            p.cancel_stale(layer);
        }
        sh.count_demands(layer, ids);
        let mut misses: Vec<usize> = Vec::new();
        let mut waits: Vec<(usize, Arc<PendingRead<ExpertRecord>>)> = Vec::new();
        let mut cached: Vec<(usize, Arc<ExpertRecord>)> = Vec::new();
        let (mut hits, mut from_prefetch) = (0u64, 0u64);
        for (i, &e) in ids.iter().enumerate() {
            if sh.index.get(layer, e).is_none() {
                return Err(StoreError::MissingExpert { layer, expert: e }.into());
            }
            let key = (layer, e);
            if let Some(rec) = sh.cache.get(key) {
                hits += 1;
                from_prefetch += sh.take_prefetched(key) as u64;
                cached.push((i, rec));
                continue;
            }
            // A prefetch being read is waited for; one only queued is taken
            // back and read now, on demand.
            match sh.pending.take_back(key) {
                Some(p) => waits.push((i, p)),
                None => misses.push(i),
            }
        }
        let started = Instant::now();
        let mut tally = Tally::new();
        if misses.is_empty() {
            tally.hand_cached(ready, &mut cached);
        } else {
            crate::demand::read_misses(sh, layer, ids, &misses, &mut cached, ready, &mut tally);
        }
        for (i, p) in waits {
            if tally.failure.is_some() {
                break;
            }
            let outcome = match p.wait() {
                Ok(record) => {
                    hits += 1;
                    from_prefetch += 1;
                    sh.take_prefetched((layer, ids[i]));
                    Ok((record, 0))
                }
                // The prefetch failed: read it on demand (reporting that read's error if any).
                Err(_) => self.read_one(layer, ids[i], &mut tally.verify_inline_s).inspect(|_| misses.push(i)),
            };
            tally.hand(ready, i, outcome);
        }
        // Waiting: the computing thread neither computing nor checking digests
        // (it waits for reads, and for checks running on the pool).
        let waited = (started.elapsed().as_secs_f64() - tally.in_ready - tally.verify_inline_s).max(0.0);
        sh.count_demand(
            layer,
            DemandCounts {
                hits,
                misses: misses.len() as u64,
                prefetch_hits: from_prefetch,
                bytes: tally.bytes,
                io_wait_s: waited,
                verify_s: tally.verify_inline_s + tally.verify_pool_s,
            },
        );
        match tally.failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Demands per (layer, expert) since the store was opened.
    pub fn heat(&self) -> crate::heat::Heat {
        self.shared.demand_heat()
    }

    /// Reads from the drives per (layer, expert) since the store was opened
    /// (demand misses, prefetches and warming).
    pub fn read_heat(&self) -> crate::heat::Heat {
        self.shared.read_heat()
    }

    /// Reads the hottest of `heat`'s experts into the cache, hottest first,
    /// until the next would not fit the budget (or `limit` bytes), 16 at a
    /// time through the I/O backend, digests checked. Returns the experts and
    /// bytes read. Counts no demand and no hit: warming decides when bytes
    /// arrive, never what is computed.
    pub fn warm(&self, heat: &crate::heat::Heat, limit: u64) -> Result<(usize, u64), StoreError> {
        let sh = &*self.shared;
        let room = sh.cache.budget().min(limit);
        let mut chosen: Vec<Key> = Vec::new();
        let mut total = 0u64;
        for key in crate::heat::hottest(heat) {
            let Some(loc) = sh.index.get(key.0, key.1) else { continue };
            if sh.cache.contains(key) {
                continue;
            }
            let bytes = loc.payload_len();
            if total + bytes > room {
                break;
            }
            total += bytes;
            chosen.push(key);
        }
        let (mut count, mut bytes, mut verify_s) = (0usize, 0u64, 0.0);
        for batch in chosen.chunks(16) {
            let (copies, jobs, mut tickets) = sh.plan_reads(batch.iter().copied());
            let mut failure = None;
            let mut again = Vec::new();
            sh.backend.read(&jobs, &mut |job, result| {
                tickets[job] = None;
                let (l, e) = batch[job];
                match result.and_then(|views| sh.record(l, e, copies[job], &views, &mut verify_s, true)) {
                    Ok((_, n)) => {
                        count += 1;
                        bytes += n;
                    }
                    Err(err) if copies[job] > 0 => again.push((job, err)),
                    Err(err) => {
                        failure.get_or_insert(err);
                    }
                }
            });
            for (job, err) in again {
                let (l, e) = batch[job];
                match sh.read_primary(l, e, &err, &mut verify_s, true) {
                    Ok((_, n)) => {
                        count += 1;
                        bytes += n;
                    }
                    Err(err) => {
                        failure.get_or_insert(err);
                    }
                }
            }
            if let Some(e) = failure {
                return Err(e);
            }
        }
        sh.count_warmed(bytes, verify_s);
        Ok((count, bytes))
    }

    /// Reads one record on this thread: its read's record and payload bytes.
    fn read_one(&self, layer: usize, expert: usize, verify_s: &mut f64) -> Result<(Arc<ExpertRecord>, u64), StoreError> {
        let sh = &*self.shared;
        let (copies, jobs, mut tickets) = sh.plan_reads(std::iter::once((layer, expert)));
        if jobs[0].is_empty() {
            return Err(StoreError::MissingExpert { layer, expert });
        }
        let mut out = None;
        sh.backend.read(&jobs, &mut |_, r| out = Some(r));
        tickets[0] = None;
        let views = out.unwrap_or_else(|| Err(StoreError::Invalid("backend reported nothing".into())));
        match views.and_then(|views| sh.record(layer, expert, copies[0], &views, verify_s, false)) {
            Err(e) if copies[0] > 0 => sh.read_primary(layer, expert, &e, verify_s, false),
            outcome => outcome,
        }
    }
}
