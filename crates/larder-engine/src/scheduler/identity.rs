//! A model's identity, the key of saved conversation state: two models
//! share saved states only when their configs and weights are the same
//! bytes, so a fine-tune never resumes another fine-tune's conversation
//! (equal configs and headers are not enough).
//!
//! - **Packed store:** `manifest.json` (its record, spine and carried-file
//!   digests cover every weight, and the store is checked against them as
//!   it is read).
//! - **Lazy cache:** `lazy.json` (the source files' sizes and published
//!   sha256, the spine's digests) and, when every file was streamed and
//!   checked, `lazy-sources.log` (every expert record's source digest).
//! - **Checkpoint folder:** `config.json` and every `*.safetensors` file's
//!   content digest (XXH3-128 of all its bytes). Hashing a large checkpoint
//!   takes a while, so the digests are cached in the state folder
//!   (`.content-digests.json`, keyed by path, size, device, inode, mtime and
//!   ctime): a restart re-reads only files that changed. An unreadable
//!   cache is rebuilt.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::EngineError;

/// The content-digest cache's file in the state folder.
pub(super) const CONTENT_DIGESTS: &str = ".content-digests.json";

/// Files whose bytes are the identity of a store or a lazy cache.
const DESCRIPTIONS: [&str; 3] = ["config.json", "manifest.json", "lazy.json"];

/// The identity of the model in `dir` (see the module docs); content
/// digests of a checkpoint's weights are cached in `cache_dir`.
pub(super) fn model_identity(dir: &Path, cache_dir: &Path) -> Result<u128, EngineError> {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut described = false;
    for name in DESCRIPTIONS {
        if let Some(bytes) = read_if_present(&dir.join(name))? {
            add(&mut h, name.as_bytes(), &bytes);
            described |= name != "config.json";
        }
    }
    if let Some(lazy) = read_if_present(&dir.join("lazy.json"))? {
        let streamed = serde_json::from_slice::<serde_json::Value>(&lazy).is_ok_and(|v| v["check"] == "stream");
        if streamed {
            if let Some(bytes) = read_if_present(&dir.join("lazy-sources.log"))? {
                add(&mut h, b"lazy-sources.log", &bytes);
            }
        }
    }
    if !described {
        let mut cache = DigestCache::load(cache_dir);
        for path in weight_files(dir)? {
            let digest = cache.digest_of(&path)?;
            let name = path.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default();
            add(&mut h, name, &digest.to_le_bytes());
        }
        cache.save();
    }
    Ok(h.digest128())
}

fn add(h: &mut xxhash_rust::xxh3::Xxh3, name: &[u8], bytes: &[u8]) {
    h.update(name);
    h.update(&(bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

fn read_if_present(path: &Path) -> Result<Option<Vec<u8>>, EngineError> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(file_err(path, e)),
    }
}

/// The folder's top-level `*.safetensors` files, sorted.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, EngineError> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|e| file_err(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    Ok(files)
}

/// What a cached digest was computed from: a file whose metadata differs
/// in any of these is hashed again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    size: u64,
    dev: u64,
    ino: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stamp {
    fn of(meta: &fs::Metadata) -> Stamp {
        Stamp {
            size: meta.len(),
            dev: meta.dev(),
            ino: meta.ino(),
            mtime_ns: meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128,
            ctime_ns: meta.ctime() as i128 * 1_000_000_000 + meta.ctime_nsec() as i128,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Cached {
    stamp: Stamp,
    /// XXH3-128 of the file's bytes, as 32 hex digits.
    digest: String,
}

/// The content digests of weight files, by canonical path.
struct DigestCache {
    path: PathBuf,
    entries: BTreeMap<PathBuf, Cached>,
    changed: bool,
}

impl DigestCache {
    fn load(dir: &Path) -> DigestCache {
        let path = dir.join(CONTENT_DIGESTS);
        let entries = fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        DigestCache {
            path,
            entries,
            changed: false,
        }
    }

    /// The digest of `path`'s bytes: the cached one while its stamp holds.
    fn digest_of(&mut self, path: &Path) -> Result<u128, EngineError> {
        let key = fs::canonicalize(path).map_err(|e| file_err(path, e))?;
        let meta = fs::metadata(&key).map_err(|e| file_err(path, e))?;
        let stamp = Stamp::of(&meta);
        let hit = self.entries.get(&key).filter(|c| c.stamp == stamp);
        if let Some(d) = hit.and_then(|c| u128::from_str_radix(&c.digest, 16).ok()) {
            return Ok(d);
        }
        let digest = hash_file(path)?;
        self.entries.insert(
            key,
            Cached {
                stamp,
                digest: format!("{digest:032x}"),
            },
        );
        self.changed = true;
        Ok(digest)
    }

    /// Saves the cache when it changed; a cache that cannot be written only
    /// costs hashing again next time.
    fn save(&self) {
        if !self.changed {
            return;
        }
        let Ok(text) = serde_json::to_vec(&self.entries) else { return };
        let tmp = self.path.with_extension(format!("{}.tmp", std::process::id()));
        if fs::write(&tmp, text).is_ok() && fs::rename(&tmp, &self.path).is_err() {
            let _ = fs::remove_file(&tmp);
        }
    }
}

fn hash_file(path: &Path) -> Result<u128, EngineError> {
    let mut f = File::open(path).map_err(|e| file_err(path, e))?;
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = vec![0u8; 8 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| file_err(path, e))?;
        if n == 0 {
            return Ok(h.digest128());
        }
        h.update(&buf[..n]);
    }
}

fn file_err(path: &Path, source: std::io::Error) -> EngineError {
    EngineError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("larder-identity-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn equal_configs_and_headers_with_other_weights_are_another_model() {
        let (a, b, states) = (scratch("a"), scratch("b"), scratch("states"));
        for dir in [&a, &b] {
            fs::write(dir.join("config.json"), b"{\"model_type\":\"x\"}").unwrap();
            fs::write(dir.join("model.safetensors"), b"HEADERweights-1").unwrap();
        }
        let same = model_identity(&a, &states).unwrap();
        assert_eq!(same, model_identity(&b, &states).unwrap());
        fs::write(b.join("model.safetensors"), b"HEADERweights-2").unwrap();
        assert_ne!(same, model_identity(&b, &states).unwrap(), "one weight byte differs");
        // Cached by stamp: a second look at an unchanged file reads the cache.
        assert!(states.join(CONTENT_DIGESTS).is_file());
        assert_eq!(same, model_identity(&a, &states).unwrap());
        // A junk cache is rebuilt.
        fs::write(states.join(CONTENT_DIGESTS), b"not json").unwrap();
        assert_eq!(same, model_identity(&a, &states).unwrap());
        for d in [a, b, states] {
            let _ = fs::remove_dir_all(d);
        }
    }
}
