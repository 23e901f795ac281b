//! The store's error type: every variant names the file, layer or expert it
//! is about, so a user can tell which drive or record is at fault.
//!
//! Messages are whole on their own (`{}` prints the I/O error too: the server
//! and logs print errors that way), while `source()` still hands out the
//! wrapped error; printers of the chain (the CLI's, the server's 500s) skip a
//! cause whose text the message already holds, so nothing is said twice.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: read of {len} bytes at offset {offset} failed: {source}")]
    Read {
        path: PathBuf,
        offset: u64,
        len: u64,
        source: std::io::Error,
    },
    #[error("{path}: file ends before byte {needed} (it holds {size}); truncated?")]
    Truncated { path: PathBuf, needed: u64, size: u64 },
    #[error(
        "layer {layer} expert {expert}: digest mismatch in {path} at offset {offset} (expected {expected}, got {got}); \
         the store is corrupt: `larder verify STORE` lists every bad record and `larder pack --model CHECKPOINT --out STORE --repair` \
         rewrites exactly those; or check the drive"
    )]
    Digest {
        layer: usize,
        expert: usize,
        path: PathBuf,
        offset: u64,
        expected: String,
        got: String,
    },
    #[error("{path}: {message}")]
    Manifest { path: PathBuf, message: String },
    #[error("layer {layer} expert {expert}: not in the store")]
    MissingExpert { layer: usize, expert: usize },
    #[error("{path}: {message}")]
    Locked { path: PathBuf, message: String },
    #[error("{what} = {value} is out of range: use {min} to {max}")]
    OutOfRange {
        what: &'static str,
        value: usize,
        min: usize,
        max: usize,
    },
    #[error("cannot start a {what} thread ({source}); use fewer threads or raise the process's thread limit")]
    Spawn { what: &'static str, source: std::io::Error },
    #[error(
        "a RAM budget (--ram-budget) of {budget} bytes cannot hold one expert record: the smallest usable budget is \
         {smallest} bytes ({}, the largest record), or 0 for no cache", crate::size::format_size(*smallest)
    )]
    BudgetTooSmall { budget: u64, smallest: u64 },
    /// A lazy store's source cannot be reached now: what needs it fails
    /// fast until `retry_after_s` passes; what is cached is still served.
    #[error("{message}")]
    SourceUnavailable { message: String, retry_after_s: u64 },
    #[error("{0}")]
    Invalid(String),
}

impl StoreError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StoreError::Io { path: path.into(), source }
    }

    pub(crate) fn manifest(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        StoreError::Manifest {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl From<larder_tensor::safetensors_write::SafetensorsWriteError> for StoreError {
    fn from(e: larder_tensor::safetensors_write::SafetensorsWriteError) -> Self {
        use larder_tensor::safetensors_write::SafetensorsWriteError as W;
        match e {
            W::Io { path, source } => StoreError::Io { path, source },
            other => StoreError::Invalid(other.to_string()),
        }
    }
}
