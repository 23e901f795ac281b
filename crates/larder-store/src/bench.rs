//! The drive limit, measured the way decoding reads: random expert records
//! in batches (one batch per layer step), through a given backend, with the
//! page cache emptied first so buffered and mapped arms read the drive too.

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

use crate::io::IoBackend;
use crate::location::{ExpertIndex, Extent};
use crate::StoreError;

#[derive(Debug, Clone, Serialize)]
pub struct ReadMeasurement {
    pub backend: String,
    pub direct: bool,
    /// Records requested together (like one layer step's experts).
    pub batch: usize,
    pub records: usize,
    pub bytes: u64,
    pub seconds: f64,
    pub gbps: f64,
}

/// Asks the kernel to drop cached pages of `paths` (clean pages only; no
/// privileges needed). Used before cold measurements.
pub fn drop_page_cache(paths: &[PathBuf]) {
    #[cfg(target_os = "linux")]
    for p in paths {
        if let Ok(f) = std::fs::File::open(p) {
            use std::os::unix::io::AsRawFd;
            // SAFETY: plain syscall on a valid fd; advice only.
            unsafe {
                libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = paths;
}

/// `count` distinct (layer, expert) pairs in a seeded random order.
pub fn random_experts(index: &ExpertIndex, count: usize, seed: u64) -> Vec<(usize, usize)> {
    let mut all: Vec<(usize, usize)> = index
        .layers
        .iter()
        .enumerate()
        .flat_map(|(l, xs)| (0..xs.len()).map(move |e| (l, e)))
        .collect();
    let mut s = seed ^ 0x2545_f491_4f6c_dd1d;
    for i in (1..all.len()).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        all.swap(i, (s % (i as u64 + 1)) as usize);
    }
    all.truncate(count);
    all
}

/// Reads `experts` in batches of `batch` and measures the rate.
pub fn measure_reads(
    index: &ExpertIndex,
    backend: &dyn IoBackend,
    experts: &[(usize, usize)],
    batch: usize,
) -> Result<ReadMeasurement, StoreError> {
    drop_page_cache(&index.files);
    let mut bytes = 0u64;
    let mut failure = None;
    let mut sink = 0u8;
    let t = Instant::now();
    for group in experts.chunks(batch.max(1)) {
        let jobs: Vec<&[Extent]> = group
            .iter()
            .filter_map(|&(l, e)| index.get(l, e).map(|x| x.extents.as_slice()))
            .collect();
        backend.read(&jobs, &mut |job, r| match r {
            Ok(views) => {
                for v in &views {
                    bytes += v.len() as u64;
                    if backend.is_mapped() {
                        // A mapping reads nothing until touched: touch every page.
                        for b in v.as_slice().iter().step_by(4096) {
                            sink ^= *b;
                        }
                    }
                }
                let _ = job;
            }
            Err(e) => {
                failure.get_or_insert(e);
            }
        });
    }
    std::hint::black_box(sink);
    let seconds = t.elapsed().as_secs_f64();
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(ReadMeasurement {
        backend: backend.name().into(),
        direct: backend.is_direct(),
        batch,
        records: experts.len(),
        bytes,
        seconds,
        gbps: bytes as f64 / seconds.max(1e-9) / 1e9,
    })
}
