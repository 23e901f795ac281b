//! Drives: measuring a directory's read bandwidth, and placing each layer's
//! experts over drives in proportion to it.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use crate::buf::AlignedBuf;
use crate::io::open_checking;
use crate::location::Extent;
use crate::StoreError;

/// Bytes written and read back to measure a drive.
pub(crate) const PROBE_BYTES: u64 = 256 << 20;
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
    let pool = open_checking(&[path.to_path_buf()], 4)?;
    let extents = Extent::tiling(0, PROBE_BYTES, PROBE_READ);
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

/// Size and type of the file system holding a directory (`statfs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsSpace {
    /// Bytes an unprivileged user may still write.
    pub free: u64,
    pub total: u64,
    /// `f_type`: the file system's magic number (e.g. 0xEF53 for ext4).
    pub magic: u64,
}

/// [`FsSpace`] of the file system holding `dir`.
#[cfg(target_os = "linux")]
pub fn fs_space(dir: &Path) -> Result<FsSpace, StoreError> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| StoreError::Invalid(format!("{}: path holds a NUL byte", dir.display())))?;
    // SAFETY: a valid NUL-terminated path and a zeroed out-struct the call fills.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(path.as_ptr(), &mut st) } != 0 {
        return Err(StoreError::io(dir, std::io::Error::last_os_error()));
    }
    let block = st.f_bsize as u64;
    Ok(FsSpace {
        free: (st.f_bavail as u64).saturating_mul(block),
        total: (st.f_blocks as u64).saturating_mul(block),
        magic: st.f_type as u64,
    })
}

/// [`FsSpace`] of the file system holding `dir` (Linux only).
#[cfg(not(target_os = "linux"))]
pub fn fs_space(dir: &Path) -> Result<FsSpace, StoreError> {
    Err(StoreError::Invalid(format!(
        "{}: file system figures are read on Linux only",
        dir.display()
    )))
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

    #[cfg(target_os = "linux")]
    #[test]
    fn fs_space_of_the_temp_dir() {
        let s = fs_space(&std::env::temp_dir()).unwrap();
        assert!(s.total > 0 && s.free <= s.total && s.magic != 0, "{s:?}");
        assert!(fs_space(Path::new("/no/such/folder"))
            .unwrap_err()
            .to_string()
            .contains("/no/such/folder"));
    }

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
