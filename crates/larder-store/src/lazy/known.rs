//! What each expert record of a lazy store must be: its *source digest*, a
//! digest over its components' bytes as the source served them when they
//! were checked. With [`SourceCheck::Stream`](super::SourceCheck) that is
//! while each source file streamed whole with its sha256 checked; with
//! [`SourceCheck::FirstFetch`](super::SourceCheck) it is the record's first
//! fetch. Every later fetch of the record (after an eviction, a repair or a
//! restart) is checked against it, so bytes that differ in transit or at
//! the source are refused and never cached.
//!
//! Kept in `lazy-sources.log`, one JSON line per record, appended once and
//! synced before the record is used; a line that does not parse (torn by a
//! crash) is ignored: that record is simply not known yet.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::records::Key;
use crate::digest::Digest;
use crate::fsutil::write_atomic;
use crate::StoreError;

/// The log's file in the lazy store's folder.
pub(crate) const SOURCES_LOG: &str = "lazy-sources.log";

#[derive(Debug, Serialize, Deserialize)]
struct Line {
    layer: usize,
    expert: usize,
    source: String,
}

/// A record's source digest from its components' digests (each the XXH3-128
/// of one component's bytes), in the record's part order, bound to the
/// record by its digest `seed`.
pub(crate) fn source_digest(seed: u64, components: impl IntoIterator<Item = Digest>) -> Digest {
    let mut h = xxhash_rust::xxh3::Xxh3::with_seed(seed);
    for c in components {
        h.update(&c.0.to_le_bytes());
    }
    Digest(h.digest128())
}

/// The digest of one component's bytes.
pub(crate) fn component_digest(bytes: &[u8]) -> Digest {
    Digest::of(bytes)
}

/// The known source digests and the log that keeps them.
pub(crate) struct Known {
    path: PathBuf,
    log: Option<File>,
    digests: HashMap<Key, Digest>,
}

impl Known {
    /// The log in `root`, read (absent: nothing known).
    pub(crate) fn open(root: &Path) -> Result<Known, StoreError> {
        let path = root.join(SOURCES_LOG);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(StoreError::io(&path, e)),
        };
        let mut digests = HashMap::new();
        for line in text.lines() {
            let Ok(l) = serde_json::from_str::<Line>(line) else { continue };
            if let Some(d) = Digest::parse(&l.source) {
                digests.insert((l.layer, l.expert), d);
            }
        }
        Ok(Known { path, log: None, digests })
    }

    /// Replaces the log with `entries` (a cache made anew), atomically.
    pub(crate) fn write_all(root: &Path, entries: &[(Key, Digest)]) -> Result<(), StoreError> {
        let mut text = String::with_capacity(entries.len() * 80);
        for &(key, digest) in entries {
            text.push_str(&line_of(key, digest)?);
        }
        write_atomic(&root.join(SOURCES_LOG), text.as_bytes())
    }

    pub(crate) fn get(&self, key: Key) -> Option<Digest> {
        self.digests.get(&key).copied()
    }

    /// Records known now.
    pub(crate) fn len(&self) -> usize {
        self.digests.len()
    }

    /// Learns `entries` (first fetches), appended and synced.
    pub(crate) fn add(&mut self, entries: &[(Key, Digest)]) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut text = String::new();
        for &(key, digest) in entries {
            text.push_str(&line_of(key, digest)?);
        }
        let io = |e| StoreError::io(&self.path, e);
        if self.log.is_none() {
            let f = std::fs::OpenOptions::new().create(true).append(true).open(&self.path).map_err(io)?;
            self.log = Some(f);
        }
        if let Some(log) = self.log.as_mut() {
            log.write_all(text.as_bytes()).map_err(io)?;
            log.sync_data().map_err(io)?;
        }
        self.digests.extend(entries.iter().copied());
        Ok(())
    }
}

fn line_of(key: Key, digest: Digest) -> Result<String, StoreError> {
    let line = Line {
        layer: key.0,
        expert: key.1,
        source: digest.to_string(),
    };
    let mut text = serde_json::to_string(&line).map_err(|e| StoreError::Invalid(e.to_string()))?;
    text.push('\n');
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digests_survive_reopen_and_a_torn_line_is_ignored() {
        let dir = std::env::temp_dir().join(format!("larder-lazy-known-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Known::write_all(&dir, &[((0, 1), Digest(1))]).unwrap();
        let mut k = Known::open(&dir).unwrap();
        k.add(&[((2, 3), Digest(2))]).unwrap();
        drop(k);
        let mut log = std::fs::OpenOptions::new().append(true).open(dir.join(SOURCES_LOG)).unwrap();
        log.write_all(b"{\"layer\":5,\"expert\":5,\"sou").unwrap();
        let k = Known::open(&dir).unwrap();
        assert_eq!(
            (k.get((0, 1)), k.get((2, 3)), k.get((5, 5)), k.len()),
            (Some(Digest(1)), Some(Digest(2)), None, 2)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_source_digest_depends_on_every_component_its_order_and_the_seed() {
        let (a, b) = (component_digest(b"gate"), component_digest(b"up"));
        let d = source_digest(7, [a, b]);
        assert_ne!(d, source_digest(7, [b, a]));
        assert_ne!(d, source_digest(8, [a, b]));
        assert_ne!(d, source_digest(7, [a]));
    }
}
