//! Small file-system helpers: atomic writes (temp file, fsync, rename, fsync
//! of the directory) so a crash never leaves a half-written file under its
//! final name.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::StoreError;

/// The temporary name a file is written under before it is renamed.
pub fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".partial");
    path.with_file_name(name)
}

/// Writes `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let tmp = temp_path(path);
    let mut f = std::fs::File::create(&tmp).map_err(|e| StoreError::io(&tmp, e))?;
    f.write_all(bytes).map_err(|e| StoreError::io(&tmp, e))?;
    f.sync_all().map_err(|e| StoreError::io(&tmp, e))?;
    drop(f);
    commit(&tmp, path)
}

/// Renames a finished temp file into place and syncs the directory.
pub fn commit(tmp: &Path, path: &Path) -> Result<(), StoreError> {
    std::fs::rename(tmp, path).map_err(|e| StoreError::io(path, e))?;
    if let Some(dir) = path.parent() {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}
