//! [`Shared`]: the state of an [`ExpertStore`](crate::ExpertStore) that its
//! computing thread, the pool tasks checking demand reads ([`crate::demand`])
//! and the prefetch threads ([`crate::prefetch`]) share, and what every read
//! of a record does with it: choose the copy to read ([`Shared::plan_reads`]),
//! check the digest and fill the cache ([`Shared::record`]), fall back to the
//! primary copy when a mirror copy fails ([`Shared::read_primary`]).
//!
//! # Locks
//!
//! The mutable parts each sit behind their own mutex, private to this module
//! and locked only inside one of [`Shared`]'s methods:
//!
//! - `stats`: the counters of [`StoreStats`];
//! - `demand_heat` and `read_heat`: demands and drive reads per expert;
//! - `prefetched`: records a prefetch cached that no demand has used yet;
//! - `prefetch_skipped`: prefetch requests skipped per layer;
//! - `bad_mirrors`: records whose mirror copy failed;
//! - `warnings`: problems that failed no read, for the caller.
//!
//! The prefetches on their way are [`PendingReads`] (`pending.rs`): one
//! lock for the map and each entry's state (queued or started), one per
//! pending read for its outcome. The [`ExpertCache`] and the prefetch queue
//! have one lock each, inside their methods.
//!
//! **Lock order: none; no two of these are ever held together.** Each
//! method takes one of them, reads or updates what it needs, and lets go
//! before taking another (the cache's included: a prefetch request checks
//! the pending map, then the cache, then the pending map again, never one
//! inside the other; a pending entry's state lives under the map's lock, so
//! taking a prefetch back needs no second lock). `plan_reads` holds
//! `bad_mirrors` while choosing copies, which [`DriveLoad`] does with
//! atomics. None of them is held while calling into the I/O backend or a
//! caller's callback.
//!
//! Two nestings involve locks outside the list, both one way only: a
//! backend may hold its own lock while it calls a read's callback (io_uring
//! holds its ring's), and the callback then takes the locks above one at a
//! time (none of them is held when the backend is called, so never the
//! other way round); the cache's lock may take the buffer pool's
//! ([`crate::buf`]) when it frees an evicted buffer, and the pool's lock
//! takes no other. Keep it so: a new method locks one field, copies or
//! updates what it needs, and lets go.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::buf::SharedBytes;
use crate::cache::{ExpertCache, Key};
use crate::digest::Digest;
use crate::drive_load::{DriveLoad, Ticket};
use crate::heat::Heat;
use crate::io::IoBackend;
use crate::location::{ExpertIndex, Extent};
use crate::locks::lock;
use crate::pending::PendingReads;
use crate::stats::{LayerCounts, StoreStats};
use crate::StoreError;

/// One expert's component bytes, in component order.
pub struct ExpertRecord {
    pub parts: Vec<SharedBytes>,
    /// RAM this record holds (buffer sizes; 0 for mapped views).
    pub bytes: u64,
}

/// What one [`ExpertStore::fetch`](crate::ExpertStore::fetch) counts, added
/// to the store's stats at once.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DemandCounts {
    pub hits: u64,
    pub misses: u64,
    pub prefetch_hits: u64,
    /// Payload bytes read on demand.
    pub bytes: u64,
    pub io_wait_s: f64,
    pub verify_s: f64,
}

/// State shared by the computing thread and the prefetch threads (locks:
/// see the module documentation).
pub(crate) struct Shared {
    pub(crate) index: ExpertIndex,
    pub(crate) backend: Arc<dyn IoBackend>,
    pub(crate) cache: ExpertCache<ExpertRecord>,
    /// Check each record's digest when it is read (where the index has one).
    pub(crate) verify: bool,
    /// Prefetches queued or running, by key.
    pub(crate) pending: PendingReads<ExpertRecord>,
    /// Bytes in flight per drive: which copy of a mirrored record to read.
    drives: DriveLoad,
    stats: Mutex<StoreStats>,
    /// Keys a prefetch put in the cache that no demand has used yet.
    prefetched: Mutex<HashSet<Key>>,
    /// Per layer: prefetch requests skipped for low precision.
    prefetch_skipped: Mutex<HashMap<usize, u64>>,
    /// Demands per (layer, expert) since the store was opened.
    demand_heat: Mutex<Heat>,
    /// Reads from the drives per (layer, expert) since the store was opened.
    read_heat: Mutex<Heat>,
    /// Records whose mirror copy failed a read or its digest: read from
    /// the primary from then on.
    bad_mirrors: Mutex<HashSet<Key>>,
    /// Problems that failed no read (a damaged mirror copy), for the caller
    /// to report ([`ExpertStore::take_warnings`](crate::ExpertStore::take_warnings)).
    warnings: Mutex<Vec<String>>,
}

impl Shared {
    /// The state of a store over `index` read through `backend`, its cache
    /// holding up to `ram_budget` bytes, nothing counted yet.
    pub(crate) fn new(index: ExpertIndex, backend: Arc<dyn IoBackend>, ram_budget: u64, verify: bool) -> Shared {
        let stats = StoreStats {
            layers: vec![Default::default(); index.layers.len()],
            ..Default::default()
        };
        Shared {
            cache: ExpertCache::new(ram_budget, index.expert_layers()),
            drives: DriveLoad::new(&index),
            index,
            backend,
            verify,
            pending: PendingReads::new(),
            stats: Mutex::new(stats),
            prefetched: Mutex::new(HashSet::new()),
            prefetch_skipped: Mutex::new(HashMap::new()),
            demand_heat: Mutex::new(HashMap::new()),
            read_heat: Mutex::new(HashMap::new()),
            bad_mirrors: Mutex::new(HashSet::new()),
            warnings: Mutex::new(Vec::new()),
        }
    }

    /// The counters so far, with the bytes read from each drive.
    pub(crate) fn stats(&self) -> StoreStats {
        let mut s = lock(&self.stats).clone();
        s.drive_bytes = self.drives.bytes_read();
        s
    }

    /// The counts of `layer` so far (`None` beyond the index's layers).
    pub(crate) fn layer_counts(&self, layer: usize) -> Option<LayerCounts> {
        lock(&self.stats).layers.get(layer).copied()
    }

    /// Adds one fetch of `layer`.
    pub(crate) fn count_demand(&self, layer: usize, c: DemandCounts) {
        let mut s = lock(&self.stats);
        s.hits += c.hits;
        s.misses += c.misses;
        s.prefetch_hits += c.prefetch_hits;
        if let Some(l) = s.layers.get_mut(layer) {
            l.hits += c.hits;
            l.misses += c.misses;
            l.prefetch_hits += c.prefetch_hits;
        }
        s.bytes_read += c.bytes;
        s.reads += c.misses;
        s.io_wait_s += c.io_wait_s;
        s.verify_s += c.verify_s;
    }

    /// Adds one finished prefetch of `layer`: its digest time, and its
    /// payload bytes when it was read and checked (`None`: it failed).
    pub(crate) fn count_prefetch(&self, layer: usize, verify_s: f64, read: Option<u64>) {
        let mut s = lock(&self.stats);
        s.verify_s += verify_s;
        if let Some(bytes) = read {
            s.bytes_read += bytes;
            s.prefetch_reads += 1;
            if let Some(l) = s.layers.get_mut(layer) {
                l.prefetch_reads += 1;
            }
        }
    }

    /// Adds `n` predictions cancelled before being read.
    pub(crate) fn count_cancelled(&self, n: u64) {
        lock(&self.stats).prefetch_cancelled += n;
    }

    /// Adds the bytes and digest time of warming the cache.
    pub(crate) fn count_warmed(&self, bytes: u64, verify_s: f64) {
        let mut s = lock(&self.stats);
        s.bytes_read += bytes;
        s.verify_s += verify_s;
    }

    /// Counts one skipped prefetch request of `layer`; returns how many so far.
    pub(crate) fn count_prefetch_skipped(&self, layer: usize) -> u64 {
        let mut skipped = lock(&self.prefetch_skipped);
        let n = skipped.entry(layer).or_insert(0);
        *n += 1;
        *n
    }

    /// Prefetch requests skipped per layer because its precision was low.
    pub(crate) fn prefetch_skipped(&self) -> HashMap<usize, u64> {
        lock(&self.prefetch_skipped).clone()
    }

    /// Notes that a prefetch put `key` in the cache.
    pub(crate) fn note_prefetched(&self, key: Key) {
        lock(&self.prefetched).insert(key);
    }

    /// Whether `key` was cached by a prefetch no demand had used yet (a
    /// demand uses it now: true at most once per prefetch).
    pub(crate) fn take_prefetched(&self, key: Key) -> bool {
        lock(&self.prefetched).remove(&key)
    }

    /// Counts a demand of each of `ids` of `layer`.
    pub(crate) fn count_demands(&self, layer: usize, ids: &[usize]) {
        let mut heat = lock(&self.demand_heat);
        for &e in ids {
            *heat.entry((layer, e)).or_insert(0) += 1;
        }
    }

    /// Demands per (layer, expert) since the store was opened.
    pub(crate) fn demand_heat(&self) -> Heat {
        lock(&self.demand_heat).clone()
    }

    /// Reads from the drives per (layer, expert) since the store was opened.
    pub(crate) fn read_heat(&self) -> Heat {
        lock(&self.read_heat).clone()
    }

    /// Problems that failed no read since the last call, each said once.
    pub(crate) fn take_warnings(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.warnings))
    }

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
        let first = lock(&self.bad_mirrors).insert(key);
        if !first {
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
        *lock(&self.read_heat).entry((layer, expert)).or_insert(0) += 1;
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
