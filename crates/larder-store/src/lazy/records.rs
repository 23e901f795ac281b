//! Which expert records a lazy store holds on its drive, the digest each
//! was written with, how often each was read (its heat), and the disk
//! quota they share.
//!
//! Kept in `lazy-records.log`, one JSON line per change: a record is
//! present once its line is on the drive, and its line is written only
//! after its bytes are synced, so a crash at any point leaves records
//! either absent (fetched again) or whole. An eviction's line is written
//! before its hole is punched. A torn last line (a crash while appending)
//! is ignored. On open the log is rewritten as one line per present record
//! (with its heat), atomically.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::fsutil::write_atomic;
use crate::StoreError;

/// The log's file in the lazy store's folder.
pub const RECORDS_LOG: &str = "lazy-records.log";

/// (model layer, expert).
pub(crate) type Key = (usize, usize);

#[derive(Debug, Serialize, Deserialize)]
struct Line {
    layer: usize,
    expert: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    digest: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    evicted: bool,
    #[serde(default, skip_serializing_if = "is_zero")]
    heat: u64,
}

impl Line {
    fn evicted(key: Key) -> Line {
        Line {
            layer: key.0,
            expert: key.1,
            digest: None,
            evicted: true,
            heat: 0,
        }
    }

    fn present(key: Key, digest: Digest, heat: u64) -> Line {
        Line {
            layer: key.0,
            expert: key.1,
            digest: Some(digest.to_string()),
            evicted: false,
            heat,
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

struct Entry {
    digest: Digest,
    bytes: u64,
    heat: u64,
    last_use: u64,
}

/// The present records and the log that keeps them.
pub(crate) struct Records {
    path: PathBuf,
    log: File,
    present: HashMap<Key, Entry>,
    /// Bytes of present records, and of records being written.
    used: u64,
    reserved: u64,
    /// Bytes records may take on the drive (`None`: no limit).
    budget: Option<u64>,
    tick: u64,
    /// Lines in the log (it is compacted when far longer than the present set).
    lines: usize,
}

impl Records {
    /// The log in `root`, replayed: records whose key `size` does not know
    /// (another layout) or that `dropped` names (their file was created
    /// anew) are left out. `size(key)` is a record's bytes on the drive.
    pub(crate) fn open(
        root: &Path,
        budget: Option<u64>,
        size: &dyn Fn(Key) -> Option<u64>,
        dropped: &dyn Fn(Key) -> bool,
    ) -> Result<Records, StoreError> {
        let path = root.join(RECORDS_LOG);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(StoreError::io(&path, e)),
        };
        let mut present = HashMap::new();
        let mut tick = 0;
        for line in text.lines() {
            // A line that does not parse was torn by a crash: its record is absent.
            let Ok(l) = serde_json::from_str::<Line>(line) else { continue };
            let key = (l.layer, l.expert);
            match (l.evicted, l.digest.as_deref().and_then(Digest::parse), size(key)) {
                (false, Some(digest), Some(bytes)) if !dropped(key) => {
                    tick += 1;
                    present.insert(
                        key,
                        Entry {
                            digest,
                            bytes,
                            heat: l.heat,
                            last_use: tick,
                        },
                    );
                }
                _ => {
                    present.remove(&key);
                }
            }
        }
        let used = present.values().map(|e| e.bytes).sum();
        let log = write_snapshot(&path, &present)?;
        Ok(Records {
            log,
            lines: present.len(),
            path,
            present,
            used,
            reserved: 0,
            budget,
            tick,
        })
    }

    /// Rewrites the log as one line per present record with its heat (kept
    /// across restarts), atomically.
    pub(crate) fn compact(&mut self) -> Result<(), StoreError> {
        self.log = write_snapshot(&self.path, &self.present)?;
        self.lines = self.present.len();
        Ok(())
    }

    /// The digest a present record was written with.
    pub(crate) fn digest(&self, key: Key) -> Option<Digest> {
        self.present.get(&key).map(|e| e.digest)
    }

    pub(crate) fn touch(&mut self, key: Key) {
        self.tick += 1;
        if let Some(e) = self.present.get_mut(&key) {
            e.heat += 1;
            e.last_use = self.tick;
        }
    }

    /// Present records and their bytes.
    pub(crate) fn held(&self) -> (usize, u64) {
        (self.present.len(), self.used)
    }

    /// Makes room for a record of `bytes` about to be written: evicts the
    /// coldest present records (least read, then least recently) outside
    /// `keep`, logging each eviction, and reserves the bytes. The evicted
    /// keys, whose holes the caller punches; `None` (nothing evicted or
    /// reserved) when even evicting everything else would not make room.
    pub(crate) fn reserve(&mut self, bytes: u64, keep: &HashSet<Key>) -> Result<Option<Vec<Key>>, StoreError> {
        let Some(budget) = self.budget else {
            self.reserved += bytes;
            return Ok(Some(Vec::new()));
        };
        let evictable: u64 = self.present.iter().filter(|(k, _)| !keep.contains(k)).map(|(_, e)| e.bytes).sum();
        if self.used + self.reserved + bytes > budget + evictable {
            return Ok(None);
        }
        let mut victims = Vec::new();
        while self.used + self.reserved + bytes > budget {
            let Some(key) = self
                .present
                .iter()
                .filter(|(k, _)| !keep.contains(k))
                .min_by_key(|(k, e)| (e.heat, e.last_use, **k))
                .map(|(k, _)| *k)
            else {
                break;
            };
            self.append(&Line::evicted(key))?;
            if let Some(e) = self.present.remove(&key) {
                self.used -= e.bytes;
            }
            victims.push(key);
        }
        if !victims.is_empty() {
            self.sync()?;
            self.maybe_compact()?;
        }
        self.reserved += bytes;
        Ok(Some(victims))
    }

    /// Gives back a reservation whose record was not written.
    pub(crate) fn release(&mut self, bytes: u64) {
        self.reserved = self.reserved.saturating_sub(bytes);
    }

    /// Records written and synced: logs them present (one sync for all).
    pub(crate) fn add(&mut self, written: &[(Key, Digest, u64)]) -> Result<(), StoreError> {
        for &(key, digest, _) in written {
            self.append(&Line::present(key, digest, 0))?;
        }
        if !written.is_empty() {
            self.sync()?;
        }
        for &(key, digest, bytes) in written {
            self.reserved = self.reserved.saturating_sub(bytes);
            self.tick += 1;
            let old = self.present.insert(
                key,
                Entry {
                    digest,
                    bytes,
                    heat: 1,
                    last_use: self.tick,
                },
            );
            self.used += bytes;
            if let Some(old) = old {
                self.used -= old.bytes;
            }
        }
        self.maybe_compact()
    }

    /// Forgets a record (its bytes failed their digest), logging it;
    /// whether it was present.
    pub(crate) fn remove(&mut self, key: Key) -> Result<bool, StoreError> {
        let Some(e) = self.present.remove(&key) else { return Ok(false) };
        {
            self.used -= e.bytes;
            self.append(&Line::evicted(key))?;
            self.sync()?;
        }
        Ok(true)
    }

    fn append(&mut self, line: &Line) -> Result<(), StoreError> {
        let mut text = serde_json::to_string(line).map_err(|e| StoreError::Invalid(e.to_string()))?;
        text.push('\n');
        self.lines += 1;
        self.log.write_all(text.as_bytes()).map_err(|e| StoreError::io(&self.path, e))
    }

    fn sync(&mut self) -> Result<(), StoreError> {
        self.log.sync_data().map_err(|e| StoreError::io(&self.path, e))
    }

    /// Compacts a log grown far past the present set (a long run with
    /// evictions); called once the present set matches the log.
    fn maybe_compact(&mut self) -> Result<(), StoreError> {
        if self.lines > 2 * self.present.len() + 10_000 {
            self.compact()?;
        }
        Ok(())
    }
}

/// Writes one line per present record to `path` atomically; the log
/// opened for appending.
fn write_snapshot(path: &Path, present: &HashMap<Key, Entry>) -> Result<File, StoreError> {
    let mut keys: Vec<&Key> = present.keys().collect();
    keys.sort();
    let mut text = String::new();
    for k in keys {
        let e = &present[k];
        let line = Line::present(*k, e.digest, e.heat);
        text.push_str(&serde_json::to_string(&line).map_err(|e| StoreError::Invalid(e.to_string()))?);
        text.push('\n');
    }
    write_atomic(path, text.as_bytes())?;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(|e| StoreError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("larder-lazy-records-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn d(n: u8) -> Digest {
        Digest::of(&[n])
    }

    #[test]
    fn present_records_survive_reopen_and_a_torn_line_is_ignored() {
        let dir = scratch("reopen");
        let mut r = Records::open(&dir, None, &|_| Some(10), &|_| false).unwrap();
        r.reserve(10, &HashSet::new()).unwrap().unwrap();
        r.reserve(10, &HashSet::new()).unwrap().unwrap();
        r.add(&[((0, 1), d(1), 10), ((2, 3), d(2), 10)]).unwrap();
        r.remove((0, 1)).unwrap();
        drop(r);
        let mut log = std::fs::OpenOptions::new().append(true).open(dir.join(RECORDS_LOG)).unwrap();
        log.write_all(b"{\"layer\":5,\"expert\":5,\"dig").unwrap();
        let r = Records::open(&dir, None, &|_| Some(10), &|_| false).unwrap();
        assert_eq!(r.digest((2, 3)), Some(d(2)));
        assert_eq!(r.digest((0, 1)), None);
        assert_eq!(r.held(), (1, 10));
        // Records of a file made anew are dropped.
        let r = Records::open(&dir, None, &|_| Some(10), &|k| k.0 == 2).unwrap();
        assert_eq!(r.held(), (0, 0));
    }

    #[test]
    fn quota_evicts_the_coldest_records_outside_the_batch() {
        let dir = scratch("quota");
        let mut r = Records::open(&dir, Some(30), &|_| Some(10), &|_| false).unwrap();
        for e in 0..3 {
            assert_eq!(r.reserve(10, &HashSet::new()).unwrap(), Some(vec![]));
            r.add(&[((0, e), d(e as u8), 10)]).unwrap();
        }
        r.touch((0, 0));
        r.touch((0, 2));
        // Expert 1 is the coldest.
        assert_eq!(r.reserve(10, &HashSet::new()).unwrap(), Some(vec![(0, 1)]));
        r.add(&[((0, 3), d(3), 10)]).unwrap();
        // Nothing can be evicted when all are kept.
        let keep: HashSet<Key> = [(0, 0), (0, 2), (0, 3)].into();
        assert_eq!(r.reserve(10, &keep).unwrap(), None);
        assert_eq!(r.held(), (3, 30));
        drop(r);
        let r = Records::open(&dir, Some(30), &|_| Some(10), &|_| false).unwrap();
        assert_eq!(r.digest((0, 1)), None);
        assert_eq!(r.held(), (3, 30));
    }
}
