//! I/O backends: how an expert's extents become bytes in RAM.
//!
//! [`IoBackend::read`] takes a batch of jobs (one per expert, each a list of
//! extents) and reports each job on the **calling thread** as soon as it
//! completes, in completion order, so the caller can compute on early
//! arrivals while later reads are still in flight. Three implementations:
//! - [`PreadPool`]: a persistent pool of threads doing `pread` (portable);
//! - `UringBackend`: io_uring on Linux, many reads in flight from one thread;
//! - `MmapBackend`: views into memory-mapped files (opt-in: no copy, page
//!   faults are the reads, evicted records' pages are dropped with
//!   `MADV_DONTNEED`; unsafe against files truncated underneath: SIGBUS).
//!
//! With `direct` (O_DIRECT), reads bypass the page cache: every read covers
//! whole 4 KiB blocks into 4 KiB-aligned buffers, and views skip the padding.

mod files;
mod mmap;
mod pread;
#[cfg(target_os = "linux")]
mod uring;

pub use files::FileTable;
pub(crate) use mmap::MmapBackend;
pub(crate) use pread::{check_depth, check_range, spawn};
pub use pread::{PreadPool, MAX_IO_DEPTH};
#[cfg(target_os = "linux")]
pub(crate) use uring::UringBackend;

use std::path::PathBuf;
use std::sync::Arc;

use crate::buf::SharedBytes;
use crate::location::Extent;
use crate::StoreError;

/// One view per extent of the job, in extent order.
pub(crate) type ReadResult = Result<Vec<SharedBytes>, StoreError>;

/// Reads extents of a fixed set of files.
pub trait IoBackend: Send + Sync {
    /// `pread`, `uring` or `mmap`.
    fn name(&self) -> &'static str;
    /// Reads every job, calling `done(job, result)` on this thread as each
    /// completes (any order; every job exactly once).
    fn read(&self, jobs: &[&[Extent]], done: &mut dyn FnMut(usize, ReadResult));
    /// Reads one job on this thread, queueing behind no other caller's
    /// batch (prefetch threads read this way, beside demand batches).
    fn read_blocking(&self, extents: &[Extent]) -> ReadResult;
    /// Reads a batch in the background (prefetch) without holding up demand
    /// batches: io_uring submits it on a ring of its own; by default each
    /// job is read with [`read_blocking`](Self::read_blocking) in turn.
    fn read_background(&self, jobs: &[&[Extent]], done: &mut dyn FnMut(usize, ReadResult)) {
        for (job, extents) in jobs.iter().enumerate() {
            done(job, self.read_blocking(extents));
        }
    }
    /// Whether views are not RAM the process holds (then the RAM cache does
    /// not count them). No backend here says so: even mmap views own the
    /// pages they touched until evicted.
    fn is_mapped(&self) -> bool {
        false
    }
    /// Whether reads bypass the page cache.
    fn is_direct(&self) -> bool;
}

/// Which backend to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoKind {
    Pread,
    Uring,
    Mmap,
}

impl IoKind {
    pub fn parse(s: &str) -> Option<IoKind> {
        match s {
            "pread" => Some(IoKind::Pread),
            "uring" | "io_uring" => Some(IoKind::Uring),
            "mmap" => Some(IoKind::Mmap),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            IoKind::Pread => "pread",
            IoKind::Uring => "uring",
            IoKind::Mmap => "mmap",
        }
    }

    /// The default: io_uring where the kernel allows it, else pread.
    pub fn best() -> IoKind {
        #[cfg(target_os = "linux")]
        if uring::available() {
            return IoKind::Uring;
        }
        IoKind::Pread
    }
}

/// Backend options.
#[derive(Debug, Clone, Copy)]
pub struct IoOptions {
    pub kind: IoKind,
    /// O_DIRECT (ignored by mmap).
    pub direct: bool,
    /// pread threads, or io_uring reads in flight.
    pub depth: usize,
}

impl Default for IoOptions {
    fn default() -> Self {
        IoOptions {
            kind: IoKind::best(),
            direct: true,
            depth: 8,
        }
    }
}

/// Opens `paths` with the chosen backend.
pub fn open_backend(paths: &[PathBuf], opts: IoOptions) -> Result<Arc<dyn IoBackend>, StoreError> {
    Ok(match opts.kind {
        IoKind::Mmap => Arc::new(MmapBackend::open(paths)?),
        IoKind::Pread => Arc::new(PreadPool::new(FileTable::open(paths, opts.direct)?, opts.depth)?),
        #[cfg(target_os = "linux")]
        IoKind::Uring => Arc::new(UringBackend::new(FileTable::open(paths, opts.direct)?, opts.depth)?),
        #[cfg(not(target_os = "linux"))]
        IoKind::Uring => return Err(StoreError::Invalid("io_uring is only available on Linux; use --io pread".into())),
    })
}

/// A pread backend over `paths` that reads with O_DIRECT where their file
/// system allows it, else through the page cache: how checks read what was
/// written (verify, pack's read-back, drive probes), so the drive is what
/// they see wherever it can be.
pub(crate) fn open_checking(paths: &[PathBuf], depth: usize) -> Result<Arc<dyn IoBackend>, StoreError> {
    let direct = IoOptions {
        kind: IoKind::Pread,
        direct: true,
        depth,
    };
    open_backend(paths, direct).or_else(|_| open_backend(paths, IoOptions { direct: false, ..direct }))
}

/// Where an extent's bytes go in a job buffer: the span read from the file
/// (block-aligned when direct) and where the extent starts inside it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    pub file: usize,
    pub file_offset: u64,
    pub len: u64,
    /// Offset of the span in the job buffer.
    pub buf_offset: u64,
    /// Offset of the extent's first byte in the span.
    pub skip: u64,
    /// Bytes of the span that must be read (skip + extent length).
    pub needed: u64,
}

/// Lays out a job's extents in one buffer; returns the spans and buffer size.
pub(crate) fn plan(extents: &[Extent], direct: bool) -> (Vec<Span>, u64) {
    let mut pos = 0;
    let spans = extents
        .iter()
        .map(|x| {
            let (start, end) = if direct {
                (crate::buf::align_down(x.offset), crate::buf::align_up(x.offset + x.len))
            } else {
                (x.offset, x.offset + x.len)
            };
            let s = Span {
                file: x.file,
                file_offset: start,
                len: end - start,
                buf_offset: pos,
                skip: x.offset - start,
                needed: x.offset + x.len - start,
            };
            pos += crate::buf::align_up(s.len);
            s
        })
        .collect();
    (spans, pos)
}

/// The views of a filled job buffer.
pub(crate) fn views(buf: crate::buf::AlignedBuf, spans: &[Span], extents: &[Extent]) -> Vec<SharedBytes> {
    let owner: crate::buf::ByteOwner = Arc::new(buf);
    spans
        .iter()
        .zip(extents)
        .map(|(s, x)| SharedBytes::new(owner.clone(), (s.buf_offset + s.skip) as usize, x.len as usize))
        .collect()
}

#[cfg(test)]
mod tests;
