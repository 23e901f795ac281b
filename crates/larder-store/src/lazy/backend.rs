//! [`LazyBackend`]: the I/O backend of a lazy store, over two backends: a
//! record on the drive is read through the local one and checked against
//! the digest it was written with; a missing one is read through the
//! source's [`RangeBackend`] (its components, several in flight), checked
//! for length, digested,
//! written in place into its layer file, synced and logged present, and
//! handed to the caller from the bytes that arrived. Under a disk quota the
//! coldest records make room (their holes punched). The store above it
//! (cache, prefetch) does not know the difference.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::known::{component_digest, source_digest, Known};
use super::records::{Key, Records};
use super::{SourceCheck, SourceFileMeta};
use crate::buf::{AlignedBuf, ByteOwner, SharedBytes};
use crate::digest::Digest;
use crate::io::{IoBackend, ReadResult};
use crate::location::Extent;
use crate::locks::lock;
use crate::remote::{FileSource, RangeBackend};
use crate::StoreError;

/// One record of the lazy store: where it lies and where it comes from.
pub(crate) struct Rec {
    pub key: Key,
    /// Index of its layer file, and its place there.
    pub file: usize,
    pub offset: u64,
    pub len: u64,
    pub payload: u64,
    pub seed: u64,
    /// Each component: its extent in a source file and its offset in the record.
    pub parts: Vec<(Extent, u64)>,
}

/// What a lazy store did since it opened.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct LazyCounts {
    /// Records fetched from the source, and their payload bytes.
    pub fetched_records: u64,
    pub fetched_bytes: u64,
    /// Records read from the drive.
    pub local_reads: u64,
    /// Records evicted to stay under the quota.
    pub evicted: u64,
    /// Fetched records not kept on the drive (the quota had no room while
    /// the batch needing them ran).
    pub not_kept: u64,
    /// Records on the drive that failed their digest and were fetched again.
    pub repaired: u64,
    /// Records on the drive now, and their bytes.
    pub present_records: u64,
    pub present_bytes: u64,
}

pub struct LazyBackend {
    pub(crate) local: Arc<dyn IoBackend>,
    pub(crate) writers: Vec<File>,
    pub(crate) paths: Vec<PathBuf>,
    pub(crate) recs: Vec<Rec>,
    pub(crate) by_extent: HashMap<(usize, u64), usize>,
    pub(crate) by_key: HashMap<Key, usize>,
    pub(crate) records: Mutex<Records>,
    /// What each record's components must digest to when fetched.
    pub(crate) known: Mutex<Known>,
    pub(crate) check: SourceCheck,
    /// Records being fetched by some thread; the condvar wakes waiters.
    pub(crate) fetching: Mutex<HashSet<Key>>,
    pub(crate) fetched: Condvar,
    /// The source's files, read by range (named as in `sources`).
    pub(crate) source: RangeBackend,
    pub(crate) remote: Arc<dyn FileSource>,
    pub(crate) sources: Vec<SourceFileMeta>,
    /// Per source file: whether it is still the file the cache was made from
    /// (answered once per run, at its first fetch that reaches the source).
    pub(crate) checked: Vec<OnceLock<Result<(), String>>>,
    pub(crate) counts: Mutex<LazyCounts>,
    /// Problems that failed no read (records not kept: a full disk, say),
    /// not yet taken by [`take_problems`](Self::take_problems), and the last one noted.
    pub(crate) problems: Mutex<(Vec<String>, Option<String>)>,
    /// Whether the source is known to be down, and how long to wait
    /// before asking it again.
    pub(crate) breaker: Mutex<Breaker>,
    pub(crate) cooldown: Duration,
}

/// The source's circuit breaker: once a fetch finds the source unreachable
/// (after its retries, within the source's deadline), fetches fail at once
/// for `cooldown` instead of each waiting out its own retries; then one
/// fetch goes through as a probe, and its outcome closes or reopens it.
#[derive(Default)]
pub(crate) struct Breaker {
    /// When it opened, until when it stays open, and why.
    open: Option<(Instant, Instant, String)>,
    probing: bool,
}

/// A fetched record ready to hand out, and what must be logged for it.
struct Fetched {
    views: Vec<SharedBytes>,
    written: Option<(Key, Digest, u64)>,
    /// Its source digest, when this first fetch sets it.
    learned: Option<(Key, Digest)>,
}

impl LazyBackend {
    pub fn counts(&self) -> LazyCounts {
        let mut c = *lock(&self.counts);
        let (n, bytes) = lock(&self.records).held();
        c.present_records = n as u64;
        c.present_bytes = bytes;
        c
    }

    /// The last problem that cost a kept record but failed no read (a
    /// write or sync error).
    pub fn last_problem(&self) -> Option<String> {
        lock(&self.problems).1.clone()
    }

    /// Problems noted since the last call, for the caller to report (each
    /// one once while it repeats: a full disk is said once, not per record).
    pub fn take_problems(&self) -> Vec<String> {
        std::mem::take(&mut lock(&self.problems).0)
    }

    pub(crate) fn note(&self, problem: String) {
        let mut p = lock(&self.problems);
        if p.1.as_deref() != Some(problem.as_str()) {
            p.0.push(problem.clone());
        }
        p.1 = Some(problem);
    }

    /// Logs present the records a streaming first open wrote (synced, and
    /// read back against the stream's digests).
    pub(crate) fn adopt(&self, kept: &[(Key, Digest, u64)]) -> Result<(), StoreError> {
        lock(&self.records).add(kept)
    }

    /// Checks a fetched record's components against its source digest:
    /// `Ok(Some(digest))` when this first fetch sets it, `Ok(None)` when
    /// it matched the known one.
    fn check_fetched(&self, r: &Rec, parts: &[SharedBytes]) -> Result<Option<(Key, Digest)>, String> {
        let got = source_digest(r.seed, parts.iter().map(|v| component_digest(v.as_slice())));
        match (lock(&self.known).get(r.key), self.check) {
            (Some(want), _) if want == got => Ok(None),
            (Some(_), check) => Err(format!(
                "the bytes the source sent differ from the ones {} when this cache was made \
                 (changed in transit, or at the source): refused, nothing kept; if the source changed, use a new --cache-dir",
                match check {
                    SourceCheck::Stream => "streamed with their file's sha256 checked",
                    SourceCheck::FirstFetch => "first fetched",
                }
            )),
            (None, SourceCheck::FirstFetch) => Ok(Some((r.key, got))),
            (None, SourceCheck::Stream) => Err(format!(
                "no digest of it was kept when the cache was made ({} is damaged): use a new --cache-dir",
                super::known::SOURCES_LOG
            )),
        }
    }

    /// The record a job reads (a lazy store's jobs are one whole record each).
    fn rec_of(&self, extents: &[Extent]) -> Result<usize, StoreError> {
        match extents {
            [x] => self
                .by_extent
                .get(&(x.file, x.offset))
                .copied()
                .filter(|&r| self.recs[r].len == x.len)
                .ok_or_else(|| StoreError::Invalid(format!("lazy store: no record at {}:{}", x.file, x.offset))),
            _ => Err(StoreError::Invalid("lazy store: a read must be one whole record".into())),
        }
    }

    /// Claims `key` for fetching; `false` when another thread holds it.
    /// Never waits: a thread waits for others' claims only after releasing
    /// its own ([`wait_unclaimed`](Self::wait_unclaimed)), so two batches
    /// needing each other's records cannot deadlock.
    fn try_claim(&self, key: Key) -> bool {
        lock(&self.fetching).insert(key)
    }

    /// Waits until no thread is fetching `key`.
    fn wait_unclaimed(&self, key: Key) {
        let mut f = lock(&self.fetching);
        while f.contains(&key) {
            f = self.fetched.wait(f).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn unclaim(&self, keys: impl IntoIterator<Item = Key>) {
        let mut f = lock(&self.fetching);
        for k in keys {
            f.remove(&k);
        }
        self.fetched.notify_all();
    }

    /// Checks a record read from the drive against its logged digest.
    fn check_local(&self, r: &Rec, views: &[SharedBytes]) -> bool {
        let want = lock(&self.records).digest(r.key);
        let got = Digest::of_parts_seeded(r.seed, [&views[0].as_slice()[..r.payload as usize]]);
        want == Some(got)
    }

    /// Whether a fetch may go to the source now: `Err((why, seconds to
    /// wait))` while the breaker is open (or another fetch is its probe).
    fn may_fetch(&self) -> Result<(), (String, u64)> {
        let mut b = lock(&self.breaker);
        let Some((since, until, why)) = b.open.clone() else { return Ok(()) };
        let now = Instant::now();
        if now >= until && !b.probing {
            b.probing = true;
            return Ok(());
        }
        let wait = until.saturating_duration_since(now).as_secs().max(1);
        Err((
            format!(
                "the source has been unreachable for {}s ({why}); it is asked again in {wait}s, and requests that need \
                 only cached experts are served meanwhile",
                since.elapsed().as_secs()
            ),
            wait,
        ))
    }

    /// Records a fetch's outcome in the breaker.
    fn source_reached(&self, unreachable: Option<String>) {
        let mut b = lock(&self.breaker);
        b.probing = false;
        match unreachable {
            Some(why) => {
                let now = Instant::now();
                let since = b.open.as_ref().map_or(now, |o| o.0);
                b.open = Some((since, now + self.cooldown, why));
            }
            None => b.open = None,
        }
    }

    /// The error of a record the source could not send.
    fn unavailable(&self, key: Key, why: &str, wait: u64) -> StoreError {
        StoreError::SourceUnavailable {
            message: format!(
                "layer {} expert {}: not in the lazy cache yet, and the source is unreachable: {why}",
                key.0, key.1
            ),
            retry_after_s: wait,
        }
    }

    /// Whether source file `f` is still the one the cache was made from.
    fn check_source(&self, f: usize) -> Result<(), StoreError> {
        if let Some(answer) = self.checked[f].get() {
            return answer.clone().map_err(StoreError::Invalid);
        }
        let want = &self.sources[f];
        // A source that cannot be reached now may be later: not remembered.
        let meta = self.remote.file_meta(&want.name).map_err(|e| e.into_store())?;
        let same_sha = match (&meta.sha256, &want.sha256) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        let answer = if meta.size != want.size || !same_sha {
            Err(format!(
                "{} changed at the source since this cache was made ({} bytes, sha256 {:?}; now {} bytes, sha256 {:?}): \
                 use a new --cache-dir",
                want.name, want.size, want.sha256, meta.size, meta.sha256
            ))
        } else {
            Ok(())
        };
        self.checked[f].get_or_init(|| answer).clone().map_err(StoreError::Invalid)
    }

    /// Fetches the records `todo` (claimed) through the source's range
    /// backend, calling `done(i, result)` for `todo[i]` as each record
    /// completes; writes and logs the ones kept, then releases the claims.
    fn fetch(&self, todo: &[usize], batch: &HashSet<Key>, done: &mut dyn FnMut(usize, ReadResult)) {
        if let Err((why, wait)) = self.may_fetch() {
            for (i, &r) in todo.iter().enumerate() {
                done(i, Err(self.unavailable(self.recs[r].key, &why, wait)));
            }
            self.unclaim(todo.iter().map(|&r| self.recs[r].key));
            return;
        }
        let wait = self.cooldown.as_secs().max(1);
        let mut unreachable: Option<String> = None;
        let mut fetching: Vec<usize> = Vec::with_capacity(todo.len());
        for (i, &r) in todo.iter().enumerate() {
            // Once the source proved unreachable, the rest fail without asking it again.
            let checked = match &unreachable {
                Some(why) => Err(StoreError::SourceUnavailable {
                    message: why.clone(),
                    retry_after_s: wait,
                }),
                None => self.recs[r].parts.iter().try_for_each(|(x, _)| self.check_source(x.file)),
            };
            match checked {
                Ok(()) => fetching.push(i),
                Err(StoreError::SourceUnavailable { message, .. }) => {
                    done(i, Err(self.unavailable(self.recs[r].key, &message, wait)));
                    unreachable.get_or_insert(message);
                }
                Err(e) => done(i, Err(fetch_error(self.recs[r].key, e.to_string()))),
            }
        }
        if unreachable.is_some() {
            // Records checked before the source failed are not fetched either.
            let why = unreachable.clone().unwrap_or_default();
            for &i in &fetching {
                done(i, Err(self.unavailable(self.recs[todo[i]].key, &why, wait)));
            }
            fetching.clear();
        }
        let jobs: Vec<Vec<Extent>> = fetching
            .iter()
            .map(|&i| self.recs[todo[i]].parts.iter().map(|p| p.0).collect())
            .collect();
        let refs: Vec<&[Extent]> = jobs.iter().map(|j| j.as_slice()).collect();
        let mut written = Vec::new();
        let mut learned = Vec::new();
        let (mut records, mut bytes) = (0u64, 0u64);
        self.source.read(&refs, &mut |f, result| {
            let i = fetching[f];
            let r = &self.recs[todo[i]];
            let outcome = result
                .map_err(|e| match e {
                    StoreError::SourceUnavailable { message, .. } => {
                        let e = self.unavailable(r.key, &message, wait);
                        unreachable.get_or_insert(message);
                        e
                    }
                    e => fetch_error(r.key, e.to_string()),
                })
                .and_then(|parts| {
                    records += 1;
                    bytes += r.payload;
                    let first = self.check_fetched(r, &parts).map_err(|m| fetch_error(r.key, m))?;
                    // The components back to back, as the record holds them.
                    let mut buf = AlignedBuf::new(r.len as usize);
                    for (view, (_, at)) in parts.iter().zip(&r.parts) {
                        let at = *at as usize;
                        buf.as_mut_slice()[at..at + view.len()].copy_from_slice(view.as_slice());
                    }
                    let mut kept = self.keep(r, buf, batch)?;
                    kept.learned = first;
                    Ok(kept)
                });
            match outcome {
                Ok(kept) => {
                    written.extend(kept.written);
                    learned.extend(kept.learned);
                    done(i, Ok(kept.views));
                }
                Err(e) => done(i, Err(e)),
            }
        });
        self.source_reached(unreachable);
        {
            let mut c = lock(&self.counts);
            c.fetched_records += records;
            c.fetched_bytes += bytes;
        }
        if let Err(e) = lock(&self.known).add(&learned) {
            self.note(format!("first-fetch digests not kept: {e}"));
        }
        if let Err(e) = self.log_written(&written) {
            lock(&self.counts).not_kept += written.len() as u64;
            self.note(format!("records fetched but not kept: {e}"));
        }
        self.unclaim(todo.iter().map(|&r| self.recs[r].key));
    }

    /// Digests a fetched record and writes it in place when the quota has
    /// room (evicting colder records); its views either way.
    fn keep(&self, r: &Rec, buf: AlignedBuf, batch: &HashSet<Key>) -> Result<Fetched, StoreError> {
        let digest = Digest::of_parts_seeded(r.seed, [&buf.as_ref()[..r.payload as usize]]);
        let victims = lock(&self.records).reserve(r.len, batch)?;
        let mut written = None;
        match victims {
            Some(victims) => {
                self.punch(&victims)?;
                let path = &self.paths[r.file];
                let wrote = self.writers[r.file].write_all_at(buf.as_ref(), r.offset);
                match wrote {
                    Ok(()) => written = Some((r.key, digest, r.len)),
                    Err(e) => {
                        lock(&self.records).release(r.len);
                        let what = match e.raw_os_error() {
                            Some(libc::ENOSPC) | Some(libc::EDQUOT) => "the drive is full",
                            _ => "writing failed",
                        };
                        self.note(format!(
                            "lazy cache: experts fetched are not kept ({what}: {}: {e}); they are used from RAM and fetched \
                             again next time: free space there, or lower --disk-quota",
                            path.display()
                        ));
                        lock(&self.counts).not_kept += 1;
                    }
                }
            }
            None => lock(&self.counts).not_kept += 1,
        }
        let owner: ByteOwner = Arc::new(buf);
        Ok(Fetched {
            views: vec![SharedBytes::new(owner, 0, r.len as usize)],
            written,
            learned: None,
        })
    }

    /// Syncs the layer files written, then logs their records present.
    fn log_written(&self, written: &[(Key, Digest, u64)]) -> Result<(), StoreError> {
        if written.is_empty() {
            return Ok(());
        }
        let files: HashSet<usize> = written
            .iter()
            .filter_map(|w| self.rec_by_key(w.0))
            .map(|r| self.recs[r].file)
            .collect();
        let synced = files
            .iter()
            .try_for_each(|&f| self.writers[f].sync_data().map_err(|e| StoreError::io(&self.paths[f], e)));
        let mut records = lock(&self.records);
        if let Err(e) = synced {
            for w in written {
                records.release(w.2);
            }
            return Err(e);
        }
        records.add(written)
    }

    fn rec_by_key(&self, key: Key) -> Option<usize> {
        self.by_key.get(&key).copied()
    }

    /// Punches the holes of evicted records (their eviction is logged).
    pub(crate) fn punch(&self, victims: &[Key]) -> Result<(), StoreError> {
        for &key in victims {
            let Some(r) = self.rec_by_key(key) else { continue };
            let r = &self.recs[r];
            punch_hole(&self.writers[r.file], r.offset, r.len).map_err(|e| StoreError::io(&self.paths[r.file], e))?;
        }
        lock(&self.counts).evicted += victims.len() as u64;
        Ok(())
    }
}

impl IoBackend for LazyBackend {
    fn name(&self) -> &'static str {
        "lazy"
    }

    fn is_direct(&self) -> bool {
        self.local.is_direct()
    }

    fn read_blocking(&self, extents: &[Extent]) -> ReadResult {
        let mut out = None;
        self.read(&[extents], &mut |_, r| out = Some(r));
        out.unwrap_or_else(|| Err(StoreError::Invalid("lazy store: a read reported nothing".into())))
    }

    fn read(&self, jobs: &[&[Extent]], done: &mut dyn FnMut(usize, ReadResult)) {
        // Per job (job, record): on the drive (read), claimed here
        // (fetched), or being fetched by another thread (read after it finishes).
        let mut local: Vec<(usize, usize)> = Vec::new();
        let mut todo: Vec<(usize, usize)> = Vec::new();
        let mut waits: Vec<(usize, usize)> = Vec::new();
        for (j, extents) in jobs.iter().enumerate() {
            let r = match self.rec_of(extents) {
                Ok(r) => r,
                Err(e) => {
                    done(j, Err(e));
                    continue;
                }
            };
            let key = self.recs[r].key;
            let present = {
                let mut records = lock(&self.records);
                records.touch(key);
                records.digest(key).is_some()
            };
            if present {
                local.push((j, r));
            } else if !self.try_claim(key) {
                waits.push((j, r));
            } else if lock(&self.records).digest(key).is_some() {
                // Logged by another thread between the two looks.
                self.unclaim([key]);
                local.push((j, r));
            } else {
                todo.push((j, r));
            }
        }
        let batch: HashSet<Key> = local.iter().chain(&todo).chain(&waits).map(|&(_, r)| self.recs[r].key).collect();
        // Local records that fail their digest are fetched again.
        let mut again: Vec<(usize, usize)> = Vec::new();
        if !local.is_empty() {
            let extents: Vec<&[Extent]> = local.iter().map(|&(j, _)| jobs[j]).collect();
            self.local.read(&extents, &mut |i, result| {
                let (j, r) = local[i];
                match result {
                    Ok(views) if self.check_local(&self.recs[r], &views) => {
                        lock(&self.counts).local_reads += 1;
                        done(j, Ok(views));
                    }
                    _ => again.push((j, r)),
                }
            });
        }
        for (j, r) in again {
            let key = self.recs[r].key;
            match lock(&self.records).remove(key) {
                Ok(true) => lock(&self.counts).repaired += 1,
                Ok(false) => {}
                Err(e) => self.note(e.to_string()),
            }
            if self.try_claim(key) {
                todo.push((j, r));
            } else {
                waits.push((j, r));
            }
        }
        if !todo.is_empty() {
            let recs: Vec<usize> = todo.iter().map(|&(_, r)| r).collect();
            self.fetch(&recs, &batch, &mut |i, result| done(todo[i].0, result));
        }
        // This thread holds no claim now: wait for the others', then read.
        for (j, r) in waits {
            self.wait_unclaimed(self.recs[r].key);
            done(j, self.read_blocking(jobs[j]));
        }
    }
}

fn fetch_error(key: Key, message: String) -> StoreError {
    StoreError::Invalid(format!(
        "layer {} expert {}: not in the lazy cache yet, and fetching it failed: {message}",
        key.0, key.1
    ))
}

/// Frees a record's blocks, keeping the file's length.
fn punch_hole(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: fallocate on an open file descriptor with plain integer arguments.
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        let e = std::io::Error::last_os_error();
        // A file system without hole punching keeps the bytes (the record is
        // still absent: its log line says so).
        match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) => Ok(()),
            _ => Err(e),
        }
    }
}

impl Drop for LazyBackend {
    /// Keeps the heat of this run for the next one.
    fn drop(&mut self) {
        let _ = lock(&self.records).compact();
    }
}
