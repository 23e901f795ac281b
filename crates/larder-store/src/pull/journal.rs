//! The progress of a pull, saved atomically in the store folder
//! (`pull-state.json`) after the bytes it counts are on the drive: per
//! source file, how far its stream got and whether it finished with its
//! sha256 checked. A resumed pull fetches each file from where it stopped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};

use crate::fsutil::write_atomic;
use crate::StoreError;

/// The journal's file in the store folder.
pub const PULL_STATE: &str = "pull-state.json";

/// One source file's progress.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FileProgress {
    /// Bytes from the start that are on the drive.
    pub offset: u64,
    pub done: bool,
    /// Whether its sha256 was checked against the one the source published.
    pub verified: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct State {
    store_id: String,
    files: BTreeMap<String, FileProgress>,
}

/// The journal, shared by the streams of a pull.
pub(crate) struct Journal {
    path: PathBuf,
    state: Mutex<State>,
}

impl Journal {
    /// The journal of store `store_id` in `out`: the saved one, or empty
    /// when there is none or it belongs to another store.
    pub(crate) fn open(out: &Path, store_id: &str) -> Result<Journal, StoreError> {
        let path = out.join(PULL_STATE);
        let saved = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice::<State>(&bytes).ok(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(StoreError::io(&path, e)),
        };
        let state = saved.filter(|s| s.store_id == store_id).unwrap_or_else(|| State {
            store_id: store_id.to_string(),
            files: BTreeMap::new(),
        });
        Ok(Journal {
            path,
            state: Mutex::new(state),
        })
    }

    /// `file`'s progress (none yet: offset 0).
    pub(crate) fn get(&self, file: &str) -> FileProgress {
        self.lock().files.get(file).cloned().unwrap_or_default()
    }

    /// Forgets every file's progress (its bytes are no longer on the drive).
    pub(crate) fn reset(&self) -> Result<(), StoreError> {
        let mut s = self.lock();
        s.files.clear();
        self.save(&s)
    }

    /// Records `file`'s progress (the caller has synced its bytes).
    pub(crate) fn set(&self, file: &str, progress: FileProgress) -> Result<(), StoreError> {
        let mut s = self.lock();
        s.files.insert(file.to_string(), progress);
        self.save(&s)
    }

    /// Raises the saved offset of each unfinished `(file, offset)` that
    /// went further (the caller has synced their bytes); one save.
    pub(crate) fn advance<'a>(&self, reached: impl Iterator<Item = (&'a str, u64)>) -> Result<(), StoreError> {
        let mut s = self.lock();
        for (file, offset) in reached {
            let p = s.files.entry(file.to_string()).or_default();
            if !p.done && offset > p.offset {
                p.offset = offset;
            }
        }
        self.save(&s)
    }

    /// Removes the journal (the store is complete).
    pub(crate) fn remove(&self) -> Result<(), StoreError> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError::io(&self.path, e)),
        }
    }

    fn save(&self, s: &State) -> Result<(), StoreError> {
        let text = serde_json::to_vec_pretty(s).map_err(|e| StoreError::Invalid(e.to_string()))?;
        write_atomic(&self.path, &text)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
