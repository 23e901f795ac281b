//! `LocalSource`: the [`FileSource`] API over a local or mounted folder,
//! so `larder pull` treats a folder like any other source. Nothing is
//! published beside the files, so no sha256 is checked (one is computed).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::client::Transferred;
use super::error::RemoteError;
use super::listing::{ListedFile, Listing};
use super::source::check_file_name;
use super::{FileMeta, FileSource, StreamReport, StreamState};

/// A checkpoint folder.
pub(crate) struct LocalSource {
    root: PathBuf,
    bytes: AtomicU64,
}

impl LocalSource {
    pub(crate) fn new(root: &Path) -> Self {
        LocalSource {
            root: root.to_path_buf(),
            bytes: AtomicU64::new(0),
        }
    }

    fn path(&self, file: &str) -> Result<PathBuf, RemoteError> {
        check_file_name(file).map_err(|reason| RemoteError::BadSource {
            arg: file.to_string(),
            reason,
        })?;
        Ok(self.root.join(file))
    }

    fn open(&self, file: &str) -> Result<(File, PathBuf), RemoteError> {
        let path = self.path(file)?;
        let f = File::open(&path).map_err(|source| RemoteError::Local {
            path: path.clone(),
            source,
        })?;
        Ok((f, path))
    }

    /// Files under `dir` (relative to the root), hidden entries skipped.
    fn walk(&self, dir: &Path, out: &mut Vec<ListedFile>) -> Result<(), RemoteError> {
        let io = |source| RemoteError::Local {
            path: dir.to_path_buf(),
            source,
        };
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let meta = entry.metadata().map_err(io)?;
            if meta.is_dir() {
                self.walk(&entry.path(), out)?;
            } else if meta.is_file() {
                let rel = entry.path().strip_prefix(&self.root).unwrap_or(&entry.path()).to_path_buf();
                out.push(ListedFile {
                    name: rel.to_string_lossy().into_owned(),
                    size: Some(meta.len()),
                    sha256: None,
                });
            }
        }
        Ok(())
    }
}

impl FileSource for LocalSource {
    fn list_files(&self) -> Result<Listing, RemoteError> {
        let mut files = Vec::new();
        self.walk(&self.root, &mut files)?;
        files.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Listing { commit: None, files })
    }

    fn file_meta(&self, file: &str) -> Result<FileMeta, RemoteError> {
        let (f, path) = self.open(file)?;
        let meta = f.metadata().map_err(|source| RemoteError::Local { path, source })?;
        Ok(FileMeta {
            size: meta.len(),
            ..FileMeta::default()
        })
    }

    fn read_range(&self, file: &str, offset: u64, len: u64) -> Result<Vec<u8>, RemoteError> {
        let (f, path) = self.open(file)?;
        let size = f.metadata().map_err(|source| RemoteError::Local {
            path: path.clone(),
            source,
        })?;
        if offset.checked_add(len).is_none_or(|end| end > size.len()) {
            return Err(RemoteError::Local {
                path,
                source: std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("range {offset}+{len} is past the end of the file ({} bytes)", size.len()),
                ),
            });
        }
        let mut out = vec![0u8; len as usize];
        f.read_exact_at(&mut out, offset).map_err(|source| RemoteError::Local {
            path: path.clone(),
            source: std::io::Error::new(source.kind(), format!("cannot read {len} bytes at offset {offset}: {source}")),
        })?;
        self.bytes.fetch_add(len, Ordering::Relaxed);
        Ok(out)
    }

    fn stream_file(&self, file: &str, sink: &mut dyn Write, state: &mut StreamState) -> Result<StreamReport, RemoteError> {
        let (mut f, path) = self.open(file)?;
        let io = |source| RemoteError::Local {
            path: path.clone(),
            source,
        };
        f.seek(SeekFrom::Start(state.offset)).map_err(io)?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).map_err(io)?;
            if n == 0 {
                break;
            }
            sink.write_all(&buf[..n]).map_err(|source| RemoteError::Sink {
                file: file.to_string(),
                offset: state.offset,
                source,
            })?;
            state.consume(&buf[..n]);
            self.bytes.fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok(StreamReport {
            size: state.offset,
            sha256: state.sha256_hex(),
            verified: false,
        })
    }

    fn transferred(&self) -> Transferred {
        Transferred {
            bytes: self.bytes.load(Ordering::Relaxed),
            ..Transferred::default()
        }
    }
}
