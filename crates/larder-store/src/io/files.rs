//! The open files a backend reads, with their sizes.

use std::fs::File;
use std::path::PathBuf;

use crate::StoreError;

/// Files opened once for the backend's lifetime.
pub struct FileTable {
    pub paths: Vec<PathBuf>,
    pub files: Vec<File>,
    pub sizes: Vec<u64>,
    pub direct: bool,
}

impl FileTable {
    /// Opens every path read-only, with O_DIRECT when `direct` (Linux).
    pub fn open(paths: &[PathBuf], direct: bool) -> Result<FileTable, StoreError> {
        let mut files = Vec::with_capacity(paths.len());
        let mut sizes = Vec::with_capacity(paths.len());
        for p in paths {
            let mut opts = std::fs::OpenOptions::new();
            opts.read(true);
            #[cfg(target_os = "linux")]
            if direct {
                use std::os::unix::fs::OpenOptionsExt;
                opts.custom_flags(libc::O_DIRECT);
            }
            let f = opts.open(p).map_err(|e| {
                if direct && e.raw_os_error() == Some(libc::EINVAL) {
                    StoreError::io(
                        p,
                        std::io::Error::new(e.kind(), "this file system does not support O_DIRECT; use --no-direct"),
                    )
                } else {
                    StoreError::io(p, e)
                }
            })?;
            sizes.push(f.metadata().map_err(|e| StoreError::io(p, e))?.len());
            files.push(f);
        }
        Ok(FileTable {
            paths: paths.to_vec(),
            files,
            sizes,
            direct: direct && cfg!(target_os = "linux"),
        })
    }

    pub(crate) fn read_error(&self, file: usize, offset: u64, len: u64, source: std::io::Error) -> StoreError {
        StoreError::Read {
            path: self.paths[file].clone(),
            offset,
            len,
            source,
        }
    }

    pub(crate) fn truncated(&self, file: usize, needed: u64) -> StoreError {
        StoreError::Truncated {
            path: self.paths[file].clone(),
            needed,
            size: self.sizes[file],
        }
    }
}
