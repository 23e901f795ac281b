//! [`ExpertStore`]: the RAM cache in front of an I/O backend over an
//! [`ExpertIndex`]. `fetch` hands out each requested expert as soon as it is
//! available (hits at once, misses as their reads complete and their digests
//! are checked, several at once on the rayon pool),
//! fills the cache and counts everything in [`StoreStats`]; `prefetch`
//! starts background reads of experts the model expects to need next
//! (see [`crate::prefetch`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::buf::SharedBytes;
use crate::cache::{ExpertCache, Key};
use crate::demand::Tally;
use crate::digest::Digest;
use crate::drive_load::{DriveLoad, Ticket};
use crate::io::{open_backend, IoBackend, IoKind, IoOptions};
use crate::location::{ExpertIndex, Extent};
use crate::prefetch::{Pending, PendingState, Prefetcher};
use crate::stats::StoreStats;
use crate::StoreError;

/// One expert's component bytes, in component order.
pub struct ExpertRecord {
    pub parts: Vec<SharedBytes>,
    /// RAM this record holds (buffer sizes; 0 for mapped views).
    pub bytes: u64,
}

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

/// Most prefetch threads a store starts: prefetch reads one layer ahead
/// (top-k records), so more threads than that only add contention.
pub const MAX_PREFETCH_THREADS: usize = 64;
/// Background reads a layer makes before its precision can switch its
/// prefetch off, and the share of requests that still go through then.
pub const PREFETCH_PROBE: u64 = 64;
/// A layer whose prefetched records are used less often than this stops
/// prefetching (see [`ExpertStore::prefetch`]).
pub const PREFETCH_MIN_PRECISION: f64 = 0.5;

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

/// State shared by the computing thread and the prefetch threads.
pub(crate) struct Shared {
    pub(crate) index: ExpertIndex,
    pub(crate) backend: Arc<dyn IoBackend>,
    pub(crate) cache: ExpertCache<ExpertRecord>,
    pub(crate) verify: bool,
    pub(crate) stats: Mutex<StoreStats>,
    /// Prefetches queued or running, by key.
    pub(crate) pending: Mutex<HashMap<Key, Arc<Pending>>>,
    /// Keys a prefetch put in the cache that no demand has used yet.
    pub(crate) prefetched: Mutex<HashSet<Key>>,
    /// Per layer: prefetch requests skipped for low precision.
    pub(crate) prefetch_skipped: Mutex<HashMap<usize, u64>>,
    /// Demands per (layer, expert) since the store was opened.
    pub(crate) heat: Mutex<crate::heat::Heat>,
    /// Reads from the drives per (layer, expert) since the store was opened.
    pub(crate) reads: Mutex<crate::heat::Heat>,
    /// Bytes in flight per drive: which copy of a mirrored record to read.
    pub(crate) drives: DriveLoad,
    /// Records whose mirror copy failed a read or its digest: read from
    /// the primary from then on.
    pub(crate) bad_mirrors: Mutex<HashSet<Key>>,
    /// Problems that failed no read (a damaged mirror copy), for the caller
    /// to report ([`ExpertStore::take_warnings`]).
    pub(crate) warnings: Mutex<Vec<String>>,
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
        let layers = index.expert_layers();
        let stats = StoreStats {
            layers: vec![Default::default(); index.layers.len()],
            ..Default::default()
        };
        ExpertStore {
            shared: Arc::new(Shared {
                cache: ExpertCache::new(ram_budget, layers),
                drives: DriveLoad::new(&index),
                index,
                backend,
                verify,
                stats: Mutex::new(stats),
                pending: Mutex::new(HashMap::new()),
                prefetched: Mutex::new(HashSet::new()),
                prefetch_skipped: Mutex::new(HashMap::new()),
                heat: Mutex::new(HashMap::new()),
                reads: Mutex::new(HashMap::new()),
                bad_mirrors: Mutex::new(HashSet::new()),
                warnings: Mutex::new(Vec::new()),
            }),
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
        std::mem::take(&mut *lock(&self.shared.warnings))
    }

    pub fn stats(&self) -> StoreStats {
        let mut s = lock(&self.shared.stats).clone();
        s.drive_bytes = self.shared.drives.bytes_read();
        s
    }

    /// Starts background reads of `ids` of `layer` that are neither cached
    /// nor already on their way. Never blocks on I/O; a no-op without prefetch threads.
    ///
    /// A layer whose predictions are mostly wrong stops prefetching: once it
    /// has read [`PREFETCH_PROBE`] records in the background and fewer than
    /// [`PREFETCH_MIN_PRECISION`] of them were used (each wasted read then
    /// costs more bandwidth than a useful one saves), only every
    /// [`PREFETCH_PROBE`]th request goes through, so the figure keeps being
    /// measured and prefetch resumes if predictions improve.
    pub fn prefetch(&self, layer: usize, ids: &[usize]) {
        let Some(p) = &self.prefetcher else { return };
        let off = {
            let s = lock(&self.shared.stats);
            s.layers
                .get(layer)
                .is_some_and(|c| c.prefetch_reads >= PREFETCH_PROBE && c.prefetch_precision() < PREFETCH_MIN_PRECISION)
        };
        if off {
            let mut skipped = lock(&self.shared.prefetch_skipped);
            let n = skipped.entry(layer).or_insert(0);
            *n += 1;
            if !(*n).is_multiple_of(PREFETCH_PROBE) {
                return;
            }
        }
        p.request(layer, ids);
    }

    /// Prefetch requests skipped per layer because its precision was low.
    pub fn prefetch_skipped(&self) -> HashMap<usize, u64> {
        lock(&self.shared.prefetch_skipped).clone()
    }

    /// Calls `ready(i, record)` for each `ids[i]` of `layer` as soon as its
    /// bytes are available and checked (digests of demand reads are checked
    /// on the rayon pool, see [`crate::demand`]): reads in about completion order, then ones a prefetch
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
        if self.prefetcher.is_some() {
            let cancelled = crate::prefetch::cancel_stale(sh, layer);
            if cancelled > 0 {
                lock(&sh.stats).prefetch_cancelled += cancelled;
            }
        }
        {
            let mut heat = lock(&sh.heat);
            for &e in ids {
                *heat.entry((layer, e)).or_insert(0) += 1;
            }
        }
        let mut misses: Vec<usize> = Vec::new();
        let mut waits: Vec<(usize, Arc<Pending>)> = Vec::new();
        let mut cached: Vec<(usize, Arc<ExpertRecord>)> = Vec::new();
        let (mut hits, mut from_prefetch) = (0u64, 0u64);
        for (i, &e) in ids.iter().enumerate() {
            if sh.index.get(layer, e).is_none() {
                return Err(StoreError::MissingExpert { layer, expert: e }.into());
            }
            let key = (layer, e);
            if let Some(rec) = sh.cache.get(key) {
                hits += 1;
                from_prefetch += lock(&sh.prefetched).remove(&key) as u64;
                cached.push((i, rec));
                continue;
            }
            let mut pending = lock(&sh.pending);
            match pending.get(&key).cloned() {
                // Queued but not started: read it now, on demand.
                Some(p) if matches!(*lock(&p.state), PendingState::Queued) => {
                    pending.remove(&key);
                    misses.push(i);
                }
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
                    lock(&sh.prefetched).remove(&(layer, ids[i]));
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
        {
            let mut s = lock(&sh.stats);
            s.hits += hits;
            s.misses += misses.len() as u64;
            s.prefetch_hits += from_prefetch;
            if let Some(c) = s.layers.get_mut(layer) {
                c.hits += hits;
                c.misses += misses.len() as u64;
                c.prefetch_hits += from_prefetch;
            }
            s.bytes_read += tally.bytes;
            s.reads += misses.len() as u64;
            s.io_wait_s += waited;
            s.verify_s += tally.verify_inline_s + tally.verify_pool_s;
        }
        match tally.failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Demands per (layer, expert) since the store was opened.
    pub fn heat(&self) -> crate::heat::Heat {
        lock(&self.shared.heat).clone()
    }

    /// Reads from the drives per (layer, expert) since the store was opened
    /// (demand misses, prefetches and warming).
    pub fn read_heat(&self) -> crate::heat::Heat {
        lock(&self.shared.reads).clone()
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
        let mut s = lock(&sh.stats);
        s.bytes_read += bytes;
        s.verify_s += verify_s;
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

impl Shared {
    /// The reads of `keys`: per key, the copy chosen ([`DriveLoad::choose`]),
    /// its extents (none for an unknown key) and the ticket to give back
    /// when its read ends.
    #[allow(clippy::type_complexity)]
    pub(crate) fn plan_reads(&self, keys: impl Iterator<Item = Key>) -> (Vec<usize>, Vec<&[Extent]>, Vec<Option<Ticket<'_>>>) {
        let (mut copies, mut jobs, mut tickets) = (Vec::new(), Vec::new(), Vec::new());
        let bad = lock(&self.bad_mirrors);
        for (l, e) in keys {
            match self.index.get(l, e) {
                Some(loc) => {
                    let (c, t) = if bad.contains(&(l, e)) {
                        self.drives.primary(loc)
                    } else {
                        self.drives.choose(loc)
                    };
                    copies.push(c);
                    jobs.push(loc.copy(c));
                    tickets.push(Some(t));
                }
                None => {
                    copies.push(0);
                    jobs.push(&[][..]);
                    tickets.push(None);
                }
            }
        }
        (copies, jobs, tickets)
    }

    /// Reads the primary copy of a record whose mirror copy failed (`failed`:
    /// its read or digest error), noting the damage once; the mirror copy
    /// is not read again for it.
    pub(crate) fn read_primary(
        &self,
        layer: usize,
        expert: usize,
        failed: &StoreError,
        verify_s: &mut f64,
        expected: bool,
    ) -> Result<(Arc<ExpertRecord>, u64), StoreError> {
        self.note_bad_mirror((layer, expert), failed);
        let loc = self.index.get(layer, expert).ok_or(StoreError::MissingExpert { layer, expert })?;
        let (_, ticket) = self.drives.primary(loc);
        let mut out = None;
        self.backend.read(&[loc.copy(0)], &mut |_, r| out = Some(r));
        drop(ticket);
        let views = out.unwrap_or_else(|| Err(StoreError::Invalid("backend reported nothing".into())))?;
        self.record(layer, expert, 0, &views, verify_s, expected)
    }

    /// Remembers that `key`'s mirror copy failed, and says so once.
    pub(crate) fn note_bad_mirror(&self, key: Key, failed: &StoreError) {
        if !lock(&self.bad_mirrors).insert(key) {
            return;
        }
        let what = match failed {
            StoreError::Digest { path, .. } => format!("{}: digest mismatch", path.display()),
            other => other.to_string(),
        };
        lock(&self.warnings).push(format!(
            "layer {} expert {}: its mirror copy is damaged ({what}); read from the primary copy instead. \
             `larder verify STORE` lists damaged copies; `larder mirror STORE --size SIZE` writes the copies anew \
             (`--size 0` removes them)",
            key.0, key.1
        ));
    }

    /// Turns a read of copy `copy` into a record: component views, digest
    /// check, cache insertion (`expected`: a prefetch or warming, which the
    /// cache always admits). Returns the record and its payload bytes.
    pub(crate) fn record(
        &self,
        layer: usize,
        expert: usize,
        copy: usize,
        views: &[SharedBytes],
        verify_s: &mut f64,
        expected: bool,
    ) -> Result<(Arc<ExpertRecord>, u64), StoreError> {
        let loc = self.index.get(layer, expert).ok_or(StoreError::MissingExpert { layer, expert })?;
        let parts: Vec<SharedBytes> = loc
            .parts
            .iter()
            .map(|p| views[p.extent].slice(p.offset as usize, p.len as usize))
            .collect();
        if let (true, Some(want)) = (self.verify, loc.digest) {
            let t = Instant::now();
            let got = Digest::of_parts_seeded(loc.digest_seed, parts.iter().map(|p| p.as_slice()));
            *verify_s += t.elapsed().as_secs_f64();
            if got != want {
                let x = loc.copy(copy)[0];
                return Err(StoreError::Digest {
                    layer,
                    expert,
                    path: self.index.files[x.file].clone(),
                    offset: x.offset,
                    expected: want.to_string(),
                    got: got.to_string(),
                });
            }
        }
        *lock(&self.reads).entry((layer, expert)).or_insert(0) += 1;
        let mapped = self.backend.is_mapped();
        // Every view of a job shares the job's one buffer.
        let held = if mapped {
            0
        } else {
            views.first().map_or(0, |v| v.owner_len() as u64)
        };
        let record = Arc::new(ExpertRecord { parts, bytes: held });
        if !mapped {
            if expected {
                self.cache.insert_expected((layer, expert), record.clone(), held);
            } else {
                self.cache.insert((layer, expert), record.clone(), held);
            }
        }
        Ok((record, loc.payload_len()))
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
