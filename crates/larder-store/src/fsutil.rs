//! Small file-system helpers: atomic writes (temp file, fsync, rename, fsync
//! of the directory) so a crash never leaves a half-written file under its
//! final name.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::StoreError;

/// The temporary name a file is written under before it is renamed.
/// (`<name>.partial`, the name larder-tensor's safetensors writer uses too).
pub(crate) fn temp_path(path: &Path) -> PathBuf {
    larder_tensor::safetensors_write::partial_path(path)
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

/// An advisory exclusive lock (`flock`) on a file, held until dropped.
#[derive(Debug)]
pub struct FileLock {
    _file: std::fs::File,
}

/// Takes the exclusive lock `path` (created if missing) without waiting;
/// `holder` says who holds it when it is taken (e.g. "another `larder pack`
/// into this --out").
pub fn lock_exclusive(path: &Path, holder: &str) -> Result<FileLock, StoreError> {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| StoreError::io(path, e))?;
    // SAFETY: flock on a descriptor this function owns; no memory is shared.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(StoreError::Locked {
                path: path.to_path_buf(),
                message: format!("{holder} is running (it holds this lock); wait for it to finish"),
            });
        }
        return Err(StoreError::io(path, err));
    }
    Ok(FileLock { _file: file })
}
