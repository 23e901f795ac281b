//! Drives: measuring a directory's read bandwidth, and placing each layer's
//! experts over drives in proportion to it.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use crate::buf::AlignedBuf;
use crate::io::{FileTable, IoBackend, PreadPool};
use crate::location::Extent;
use crate::StoreError;

/// Bytes written and read back to measure a drive.
pub const PROBE_BYTES: u64 = 256 << 20;
/// Read size of the probe (expert-record-sized reads reach the limit).
const PROBE_READ: u64 = 16 << 20;

/// Read bandwidth of the file system holding `dir`, in GB/s: writes a probe
/// file, then reads it back with O_DIRECT (page cache bypassed) from several
/// threads; the file is removed afterwards.
pub fn measure_read_gbps(dir: &Path) -> Result<f64, StoreError> {
    let path = dir.join(".larder-probe");
    let result = probe(&path);
    let _ = std::fs::remove_file(&path);
    result
}

fn probe(path: &Path) -> Result<f64, StoreError> {
    {
        let mut f = std::fs::File::create(path).map_err(|e| StoreError::io(path, e))?;
        let mut chunk = AlignedBuf::new(PROBE_READ as usize);
        // Incompressible-ish bytes so no layer below can shortcut the probe.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for b in chunk.as_mut_slice().chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b.copy_from_slice(&x.to_le_bytes());
        }
        for _ in 0..PROBE_BYTES / PROBE_READ {
            f.write_all(chunk.as_ref()).map_err(|e| StoreError::io(path, e))?;
        }
        f.sync_all().map_err(|e| StoreError::io(path, e))?;
    }
    let files = match FileTable::open(&[path.to_path_buf()], true) {
        Ok(f) => f,
        Err(_) => FileTable::open(&[path.to_path_buf()], false)?,
    };
    let pool = PreadPool::new(files, 4)?;
    let extents: Vec<Extent> = (0..PROBE_BYTES / PROBE_READ)
        .map(|i| Extent {
            file: 0,
            offset: i * PROBE_READ,
            len: PROBE_READ,
        })
        .collect();
    let jobs: Vec<&[Extent]> = extents.iter().map(std::slice::from_ref).collect();
    let t = Instant::now();
    let mut err = None;
    pool.read(&jobs, &mut |_, r| {
        if let Err(e) = r {
            err.get_or_insert(e);
        }
    });
    let secs = t.elapsed().as_secs_f64();
    if let Some(e) = err {
        return Err(e);
    }
    Ok(PROBE_BYTES as f64 / secs / 1e9)
}

/// Assigns `count` experts to drives with weights `gbps`: smooth weighted
/// round-robin, so every prefix of experts is spread in proportion too
/// (deterministic for the same inputs).
pub fn place(count: usize, gbps: &[f64]) -> Vec<usize> {
    let total: f64 = gbps.iter().sum();
    let mut current = vec![0.0f64; gbps.len()];
    (0..count)
        .map(|_| {
            for (c, w) in current.iter_mut().zip(gbps) {
                *c += w;
            }
            let best = (0..gbps.len())
                .max_by(|&a, &b| current[a].total_cmp(&current[b]).then(b.cmp(&a)))
                .unwrap_or(0);
            current[best] -= total;
            best
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_follows_weights() {
        let p = place(64, &[1.0, 1.0]);
        assert_eq!(p.iter().filter(|&&d| d == 0).count(), 32);
        let p = place(60, &[2.0, 1.0]);
        assert_eq!(p.iter().filter(|&&d| d == 0).count(), 40);
        assert_eq!(&p[..3], &[0, 1, 0]);
        let p = place(10, &[3.0]);
        assert!(p.iter().all(|&d| d == 0));
        let p = place(90, &[1.0, 2.0, 3.0]);
        let counts: Vec<usize> = (0..3).map(|d| p.iter().filter(|&&x| x == d).count()).collect();
        assert_eq!(counts, vec![15, 30, 45]);
    }
}
