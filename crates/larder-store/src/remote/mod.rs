//! Remote checkpoint sources (issue 22): reading a checkpoint's files from
//! the Hugging Face hub, any `http(s)://` base URL serving the hub layout,
//! or a local folder, by byte range or as a whole file with its sha256
//! checked while it streams. `larder pull` and lazy expert fetching build
//! on [`FileSource`]; this module does not know the store format.
//!
//! - [`source`]: parsing a `SOURCE` argument ([`CheckpointSource`]),
//!   `HF_ENDPOINT` / `HF_TOKEN` ([`HubEnv`]), hub URLs;
//! - [`listing`]: the hub's file listing and a safetensors index;
//! - [`client`]: the HTTP agent, retries with backoff and jitter, status
//!   and failure sorting, transfer counters;
//! - [`http`]: `HttpSource` (metadata, ETag-pinned ranges, streaming);
//! - [`local`]: `LocalSource` (the same API over a folder);
//! - [`error`]: every failure, as [`RemoteError`].
//!
//! Why `ureq` 3 and not an async client: the store's readers are blocking
//! threads (pread pool, io_uring completions on the caller), so a blocking
//! client with a connection-pooling `Agent` fits without a runtime in the
//! library; it is already the workspace's HTTP client (apps/larder downloads
//! tokenizers with it), with rustls and the platform verifier (no OpenSSL).
//! Parallel range requests are scoped threads sharing the agent's pool.
//!
//! Integrity: every range response must be 206 with the Content-Range asked
//! for and the ETag first seen for that file (sent back as `If-Range`), so a
//! file replaced between requests is an error naming it, never mixed bytes;
//! whole files are hashed while streaming and checked against the hub's LFS
//! sha256 (`X-Linked-Etag`, or the listing's `lfs.sha256`).

pub mod backend;
pub mod client;
pub mod error;
pub mod http;
pub mod listing;
pub mod local;
pub mod source;

use std::io::Write;

use sha2::{Digest, Sha256};

pub use backend::RangeBackend;
pub use client::{RemoteOptions, RetryPolicy, Transferred};
pub use error::RemoteError;
pub(crate) use http::HttpSource;
pub use listing::{ListedFile, Listing};
pub(crate) use local::LocalSource;
pub use source::{CheckpointSource, HubEnv};

/// What a source says about one file before it is read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileMeta {
    pub size: u64,
    /// Lowercase hex sha256 of the content, when the source publishes it
    /// (the hub does for LFS files).
    pub sha256: Option<String>,
    /// The ETag of the file as served (the hub's `ETag`, not the LFS one).
    pub etag: Option<String>,
    /// The commit the file was resolved at (`X-Repo-Commit`).
    pub commit: Option<String>,
}

/// Progress of a whole-file stream: the offset reached and the sha256 of
/// the bytes before it. A failed [`FileSource::stream_file`] leaves it at
/// the last byte written, and calling again with it fetches only the rest.
#[derive(Clone, Debug, Default)]
pub struct StreamState {
    pub offset: u64,
    hasher: Sha256,
}

impl StreamState {
    /// Resuming from bytes already on disk (a `.part` file): hashes them
    /// so the final sha256 covers the whole file.
    pub fn from_prefix(mut prefix: impl std::io::Read) -> std::io::Result<Self> {
        let mut state = StreamState::default();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = prefix.read(&mut buf)?;
            if n == 0 {
                return Ok(state);
            }
            state.consume(&buf[..n]);
        }
    }

    pub(crate) fn consume(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
        self.offset += bytes.len() as u64;
    }

    pub(crate) fn sha256_hex(&self) -> String {
        hex(&self.hasher.clone().finalize())
    }
}

/// A finished whole-file stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamReport {
    pub size: u64,
    pub sha256: String,
    /// Whether the sha256 was checked against one the source published.
    pub verified: bool,
}

/// A checkpoint's files, readable by range or as a stream. Implemented over
/// HTTP (`HttpSource`) and a folder (`LocalSource`).
pub trait FileSource: Send + Sync {
    /// Every file of the checkpoint (names relative to its root).
    fn list_files(&self) -> Result<Listing, RemoteError>;

    /// Size, published sha256 and ETag of `file`; an error when the source
    /// contradicts its own listing.
    fn file_meta(&self, file: &str) -> Result<FileMeta, RemoteError>;

    /// Exactly `len` bytes of `file` from `offset`, all from one version of
    /// the file.
    fn read_range(&self, file: &str, offset: u64, len: u64) -> Result<Vec<u8>, RemoteError>;

    /// Writes `file` from `state.offset` to its end into `sink`, hashing as
    /// it goes, and checks the sha256 when the source publishes one. On
    /// error `state` says how far it got (bytes already written to `sink`
    /// are good; on a sha256 mismatch the whole file is not).
    fn stream_file(&self, file: &str, sink: &mut dyn Write, state: &mut StreamState) -> Result<StreamReport, RemoteError>;

    /// Requests, retries and bytes so far.
    fn transferred(&self) -> Transferred;

    /// [`read_range`](Self::read_range) into `out` (its old contents
    /// dropped, its allocation reused: a stream reading range after range
    /// touches no fresh pages).
    fn read_range_into(&self, file: &str, offset: u64, len: u64, out: &mut Vec<u8>) -> Result<(), RemoteError> {
        *out = self.read_range(file, offset, len)?;
        Ok(())
    }

    /// Several ranges of `file` at once (up to `parallel` in flight), in
    /// the order asked; the first error ends the read.
    fn read_ranges(&self, file: &str, ranges: &[(u64, u64)], parallel: usize) -> Result<Vec<Vec<u8>>, RemoteError> {
        self.read_ranges_into(file, ranges, parallel, Vec::new())
    }

    /// [`read_ranges`](Self::read_ranges) reusing the buffers `spare` (one
    /// per range as far as they go) for the bytes.
    fn read_ranges_into(
        &self,
        file: &str,
        ranges: &[(u64, u64)],
        parallel: usize,
        mut spare: Vec<Vec<u8>>,
    ) -> Result<Vec<Vec<u8>>, RemoteError> {
        let workers = parallel.clamp(1, ranges.len().max(1));
        let next = std::sync::atomic::AtomicUsize::new(0);
        let buffers: Vec<std::sync::Mutex<Vec<u8>>> = ranges
            .iter()
            .map(|_| std::sync::Mutex::new(spare.pop().unwrap_or_default()))
            .collect();
        let results: Vec<RangeSlot> = ranges.iter().map(|_| std::sync::Mutex::new(None)).collect();
        std::thread::scope(|scope| {
            for _ in 0..workers {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&(offset, len)) = ranges.get(i) else { return };
                    let mut buf = std::mem::take(&mut *buffers[i].lock().unwrap_or_else(|p| p.into_inner()));
                    let got = self.read_range_into(file, offset, len, &mut buf).map(|()| buf);
                    let failed = got.is_err();
                    *results[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(got);
                    if failed {
                        next.store(ranges.len(), std::sync::atomic::Ordering::Relaxed);
                    }
                });
            }
        });
        let mut out = Vec::with_capacity(ranges.len());
        for slot in results {
            match slot.into_inner().unwrap_or_else(|p| p.into_inner()) {
                Some(Ok(bytes)) => out.push(bytes),
                Some(Err(e)) => return Err(e),
                None => {}
            }
        }
        Ok(out)
    }
}

/// One range's result in `read_ranges`, filled by whichever worker read it.
type RangeSlot = std::sync::Mutex<Option<Result<Vec<u8>, RemoteError>>>;

/// Opens `source` for reading (no request is sent yet).
pub fn open_source(source: &CheckpointSource, env: &HubEnv, options: &RemoteOptions) -> Result<Box<dyn FileSource>, RemoteError> {
    Ok(match source {
        CheckpointSource::Hub { .. } | CheckpointSource::Http { .. } => Box::new(HttpSource::new(source, env, options)?),
        CheckpointSource::Local { path } => Box::new(LocalSource::new(path)),
    })
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
