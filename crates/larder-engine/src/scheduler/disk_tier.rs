//! The prefix cache's disk tier: finished conversations' states (tokens,
//! [`SequenceState`], [`ReturnPoints`] snapshots) kept as files in a folder
//! under a byte quota, so a conversation survives a restart and a later
//! request sharing its prefix loads the state instead of prefilling it.
//!
//! - **Files** are larder-model's `state_io` format (`<hash of the
//!   tokens>.state`), tagged with the model's identity
//!   ([`model_identity`](super::identity::model_identity): config and
//!   weights, by content; equal headers are not enough) and
//!   digested whole; a file of another model is left alone and never used.
//! - **Saving** writes `.<name>.<pid>.tmp`, fsyncs it, renames it into place
//!   and fsyncs the folder, so no half-written file ever has a `.state`
//!   name; a failure (disk full, say) removes the temporary file, warns, and
//!   the request is unaffected. Before writing, least recently used files
//!   are removed until the new one fits the quota (a state larger than the
//!   quota is not saved). A new file replaces the files it extends.
//! - **Lookup** is the RAM tier's: the longest common prefix with the
//!   request's feed, capped so it still feeds its last token; a state that
//!   cannot roll back (recurrent layers) is reused whole or at a saved
//!   snapshot. The file stays (the state loaded is a copy).
//! - **Loading** checks identity, digest and dims; a file that fails is
//!   removed with a warning naming it, and the request prefills instead.
//!
//! Warnings are queued ([`take_warnings`](DiskTier::take_warnings)); the
//! engine has no logger of its own.

use std::fs::{self, File};
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use larder_model::state_io::{self, StateIoError};
use larder_model::{DecoderModel, SequenceState};
use serde::Serialize;

use crate::error::EngineError;
use crate::return_points::ReturnPoints;

/// Where and how much the disk tier keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskTierConfig {
    pub dir: PathBuf,
    /// Most bytes of state files kept (this model's).
    pub quota: u64,
}

/// What the disk tier did so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DiskTierStats {
    /// Requests that loaded a state from disk.
    pub hits: u64,
    /// Requests that looked on disk and found nothing longer than RAM had.
    pub misses: u64,
    pub bytes_written: u64,
    pub bytes_read: u64,
    /// Seconds spent loading states.
    pub load_s: f64,
    /// Saves that failed (disk full, I/O error): the state was not kept.
    pub save_failures: u64,
    /// Files found unusable (corrupt, truncated, wrong shape) and removed.
    pub bad_files: u64,
    /// This model's files and their bytes now.
    pub files: usize,
    pub bytes_on_disk: u64,
}

/// What a request would load from disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DiskHit {
    entry: usize,
    /// Positions reused.
    pub reuse: usize,
    /// Whether the whole saved state is reused (its snapshots come with it).
    pub whole: bool,
    /// Snapshots the request takes over (0 unless whole).
    pub snapshots: usize,
}

struct Entry {
    path: PathBuf,
    tokens: Vec<u32>,
    snapshot_lens: Vec<usize>,
    bytes: u64,
    last_used: u64,
}

/// The disk tier of one scheduler; see the module docs.
pub(super) struct DiskTier {
    config: DiskTierConfig,
    identity: u128,
    /// Whether the model's states roll back (no recurrent layer).
    rollable: bool,
    entries: Vec<Entry>,
    clock: u64,
    stats: DiskTierStats,
    warnings: Vec<String>,
}

const SUFFIX: &str = "state";

impl DiskTier {
    /// Opens (creating it if needed) `config.dir` for `model` loaded from
    /// `model_dir`: checks it is writable, removes leftover temporary files
    /// and unreadable state files (warning), indexes this model's files.
    pub(super) fn open(config: DiskTierConfig, model_dir: &Path, model: &DecoderModel) -> Result<Self, EngineError> {
        check_state_dir(&config.dir)?;
        let mut tier = DiskTier {
            identity: super::identity::model_identity(model_dir, &config.dir)?,
            rollable: model.new_state().can_rollback(),
            config,
            entries: Vec::new(),
            clock: 0,
            stats: DiskTierStats::default(),
            warnings: Vec::new(),
        };
        tier.scan()?;
        tier.fit(0);
        Ok(tier)
    }

    fn scan(&mut self) -> Result<(), EngineError> {
        let read = fs::read_dir(&self.config.dir).map_err(|e| file_err(&self.config.dir, e))?;
        let mut found = Vec::new();
        for path in read.filter_map(|e| e.ok()).map(|e| e.path()) {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if name.starts_with('.') && name.ends_with(".tmp") {
                let _ = fs::remove_file(&path);
            } else if path.extension().is_some_and(|x| x == SUFFIX) {
                if let Some(e) = self.index(&path) {
                    found.push(e);
                }
            }
        }
        // Oldest first: modification times order the files' last use.
        found.sort_by_key(|(_, t)| *t);
        for (mut e, _) in found {
            self.clock += 1;
            e.last_used = self.clock;
            self.entries.push(e);
        }
        Ok(())
    }

    /// Reads a file's header; `None` (warned and removed when unreadable,
    /// skipped silently when another model's).
    fn index(&mut self, path: &Path) -> Option<(Entry, SystemTime)> {
        let header = File::open(path).and_then(|f| Ok((f.metadata()?, f))).map_err(StateIoError::from);
        let header = header.and_then(|(meta, f)| Ok((meta.clone(), state_io::read_header(BufReader::new(f), meta.len())?)));
        match header {
            Ok((meta, h)) if h.identity == self.identity => Some((
                Entry {
                    path: path.to_path_buf(),
                    tokens: h.tokens,
                    snapshot_lens: h.snapshot_lens,
                    bytes: meta.len(),
                    last_used: 0,
                },
                meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            )),
            Ok(_) => None,
            Err(e) => {
                self.drop_bad(path, &e);
                None
            }
        }
    }

    fn drop_bad(&mut self, path: &Path, e: &StateIoError) {
        self.stats.bad_files += 1;
        let removed = fs::remove_file(path).is_ok();
        self.warnings.push(format!(
            "state file {}: {e}; not used{}",
            path.display(),
            if removed { ", removed" } else { " (could not remove it)" }
        ));
    }

    /// Counters so far, with the files kept now.
    pub(super) fn stats(&self) -> DiskTierStats {
        DiskTierStats {
            files: self.entries.len(),
            bytes_on_disk: self.bytes(),
            ..self.stats.clone()
        }
    }

    /// Warnings since the last call (bad files, failed saves).
    pub(super) fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    /// Counts a request that found nothing on disk worth loading.
    pub(super) fn miss(&mut self) {
        self.stats.misses += 1;
    }

    /// The longest reuse for `feed` (at most `feed.len() - 1` positions).
    pub(super) fn lookup(&self, feed: &[u32]) -> Option<DiskHit> {
        let (entry, reuse) = super::prefix_cache::longest_reuse(
            feed,
            self.entries.iter().map(|e| (e.tokens.as_slice(), e.last_used)),
            |i, common| self.reachable(&self.entries[i], common),
        )?;
        let e = &self.entries[entry];
        let whole = reuse == e.tokens.len();
        (reuse > 0).then_some(DiskHit {
            entry,
            reuse,
            whole,
            snapshots: if whole { e.snapshot_lens.len() } else { 0 },
        })
    }

    /// As `ReturnPoints::reachable`, from the header alone.
    fn reachable(&self, e: &Entry, keep: usize) -> usize {
        if keep >= e.tokens.len() || self.rollable {
            return keep.min(e.tokens.len());
        }
        e.snapshot_lens.iter().copied().filter(|&n| n <= keep).max().unwrap_or(0)
    }

    /// Loads `hit` (from [`lookup`](Self::lookup), the tier unchanged since)
    /// for `model`, taken back to `hit.reuse` positions; `None` when the file
    /// is unusable (warned and removed).
    pub(super) fn load(&mut self, hit: DiskHit, model: &DecoderModel) -> Option<(SequenceState, ReturnPoints)> {
        let started = Instant::now();
        let e = self.entries.get(hit.entry)?;
        let path = e.path.clone();
        let identity = self.identity;
        let read = File::open(&path).map_err(StateIoError::from).and_then(|f| {
            let len = f.metadata()?.len();
            let saved = state_io::read_state(BufReader::with_capacity(1 << 20, f), len, model, identity)?;
            if saved.header.tokens != e.tokens {
                return Err(StateIoError::Malformed("its tokens changed since it was indexed".into()));
            }
            Ok((len, saved))
        });
        let (len, saved) = match read {
            Ok(read) => read,
            Err(err) => {
                self.entries.remove(hit.entry);
                self.drop_bad(&path, &err);
                return None;
            }
        };
        let mut state = saved.state;
        let mut points = ReturnPoints::from_snapshots(saved.snapshots);
        if !hit.whole {
            if points.keep_prefix(&mut state, hit.reuse).ok() != Some(hit.reuse) {
                return None;
            }
            points = ReturnPoints::new();
        }
        self.clock += 1;
        self.entries[hit.entry].last_used = self.clock;
        let _ = File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(SystemTime::now()));
        self.stats.hits += 1;
        self.stats.bytes_read += len;
        self.stats.load_s += started.elapsed().as_secs_f64();
        Some((state, points))
    }
}

impl DiskTier {
    /// Keeps a finished conversation on disk (see the module docs); a
    /// failure is warned about and counted, never returned.
    pub(super) fn save(&mut self, tokens: &[u32], state: &SequenceState, points: &ReturnPoints) {
        if state.is_empty() || tokens.len() != state.len() {
            return;
        }
        self.clock += 1;
        if let Some(e) = self.entries.iter_mut().find(|e| e.tokens.starts_with(tokens)) {
            e.last_used = self.clock;
            return;
        }
        let size = state_io::encoded_len(tokens, state, points.snapshots());
        if size > self.config.quota {
            return;
        }
        // The files it extends go: it holds all they do.
        let extended: Vec<usize> = (0..self.entries.len())
            .filter(|&i| tokens.starts_with(&self.entries[i].tokens))
            .collect();
        for i in extended.into_iter().rev() {
            let e = self.entries.swap_remove(i);
            let _ = fs::remove_file(&e.path);
        }
        self.fit(size);
        let name = format!("{:032x}.{SUFFIX}", name_hash(self.identity, tokens));
        let path = self.config.dir.join(&name);
        let tmp = self.config.dir.join(format!(".{name}.{}.tmp", std::process::id()));
        match write_atomically(&tmp, &path, |w| {
            state_io::write_state(w, self.identity, tokens, state, points.snapshots())
        }) {
            Ok(bytes) => {
                self.stats.bytes_written += bytes;
                self.entries.push(Entry {
                    path,
                    tokens: tokens.to_vec(),
                    snapshot_lens: points.snapshots().iter().map(|s| s.len()).collect(),
                    bytes,
                    last_used: self.clock,
                });
            }
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                self.stats.save_failures += 1;
                self.warnings.push(format!(
                    "state dir {}: could not save a state of {} positions ({e}); it is not kept on disk",
                    self.config.dir.display(),
                    tokens.len()
                ));
            }
        }
    }

    /// Removes least recently used files until `extra` more bytes fit the quota.
    fn fit(&mut self, extra: u64) {
        while !self.entries.is_empty() && self.bytes() + extra > self.config.quota {
            let Some(i) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used) else {
                return;
            };
            let e = self.entries.swap_remove(i);
            let _ = fs::remove_file(&e.path);
        }
    }
}

/// Writes `tmp` with `write`, fsyncs it, renames it to `path` and fsyncs
/// the folder; returns the bytes written.
fn write_atomically(
    tmp: &Path,
    path: &Path,
    write: impl FnOnce(&mut BufWriter<&File>) -> Result<u64, StateIoError>,
) -> Result<u64, StateIoError> {
    let file = File::create(tmp)?;
    let mut w = BufWriter::with_capacity(1 << 20, &file);
    let bytes = write(&mut w)?;
    w.flush()?;
    drop(w);
    file.sync_all()?;
    fs::rename(tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(bytes)
}

fn name_hash(identity: u128, tokens: &[u32]) -> u128 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&identity.to_le_bytes());
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    h.digest128()
}

/// The default quota of a disk tier in `dir` (`larder serve` without
/// `--state-quota`): a tenth of the free space there, at least 64 MiB; and
/// that free space (0 where the file system's figures cannot be read).
pub fn default_state_quota(dir: &Path) -> (u64, u64) {
    let free = larder_store::drive::fs_space(dir).map(|s| s.free).unwrap_or(0);
    (state_quota_of(free), free)
}

/// A tenth of `free`, at least 64 MiB.
fn state_quota_of(free: u64) -> u64 {
    (free / 10).max(64 << 20)
}

/// Creates `dir` if needed and checks a file can be written in it (what
/// opening a disk tier checks first; `larder serve` asks before loading).
pub fn check_state_dir(dir: &Path) -> Result<(), EngineError> {
    fs::create_dir_all(dir).map_err(|e| file_err(dir, e))?;
    let probe = dir.join(format!(".probe.{}.tmp", std::process::id()));
    let written = File::create(&probe).and_then(|mut f| f.write_all(b"larder"));
    let _ = fs::remove_file(&probe);
    written.map_err(|e| EngineError::File {
        path: dir.to_path_buf(),
        message: format!("the state folder is not writable: {e}"),
    })
}

fn file_err(path: &Path, e: std::io::Error) -> EngineError {
    EngineError::File {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

#[cfg(test)]
#[path = "disk_tier_tests.rs"]
mod tests;
