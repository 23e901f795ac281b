//! A drive folder's probe (`larder doctor`): what its file system is, how
//! much room it has, whether O_DIRECT and io_uring work there, and how fast
//! it reads expert-sized records through the backend larder streams with.
//!
//! The probe writes a temporary file (`.larder-doctor-probe-PID`) of
//! the size asked for, fsyncs it, reads it back in records of up to 16 MiB
//! and removes it: on success, on error (a drop guard), and, when a run was
//! killed (Ctrl-C), at the next doctor run in that folder (a probe file
//! whose process no longer exists is removed).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use larder_store::bench::drop_page_cache;
use larder_store::io::{open_backend, IoKind, IoOptions};
use larder_store::{AlignedBuf, Extent, IoBackend, StoreError};

use crate::error::{store_err, EngineError};

/// Largest read of the probe: an expert record of a big model is 10-45 MiB.
const RECORD_BYTES: u64 = 16 << 20;
/// Reads in flight while measuring (the streaming default, `--io-depth 8`).
const DEPTH: usize = 8;
/// Name of a probe file, before the process id.
const PROBE_PREFIX: &str = ".larder-doctor-probe-";

/// What the probe found out about one folder.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DriveReport {
    pub path: PathBuf,
    /// `ext4`, `xfs`, `tmpfs`, ... (from /proc/self/mountinfo, else statfs).
    pub filesystem: String,
    pub free_bytes: u64,
    pub total_bytes: u64,
    /// Reads with O_DIRECT (page cache bypassed) work here.
    pub o_direct: bool,
    /// io_uring reads work here.
    pub io_uring: bool,
    /// The backend the figure was measured with (`uring` or `pread`).
    pub backend: &'static str,
    pub probe_bytes: u64,
    pub record_bytes: u64,
    pub read_gbps: f64,
    /// The figure is RAM (page cache or tmpfs) speed, not a disk's.
    pub page_cache_only: bool,
}

/// Removes the probe file when dropped (errors and panics included).
struct ProbeFile(PathBuf);

impl Drop for ProbeFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Probes `dir` with a file of `probe_mib` MiB (see the module doc);
/// `progress(bytes)` as the probe file is written and read back (twice its
/// size in all).
pub fn probe(dir: &Path, probe_mib: usize, progress: &dyn Fn(u64)) -> Result<DriveReport, EngineError> {
    let folder = |message: String| EngineError::File {
        path: dir.to_path_buf(),
        message: format!("drive folder: {message}"),
    };
    let meta = std::fs::metadata(dir).map_err(|e| folder(format!("cannot read it ({e}); name an existing folder")))?;
    if !meta.is_dir() {
        return Err(folder("not a folder; name the folder the model lives (or will live) in".into()));
    }
    remove_stale_probes(dir);
    let space = larder_store::drive::fs_space(dir).map_err(store_err)?;
    let probe_bytes = probe_mib as u64 * (1 << 20);
    let record = RECORD_BYTES.min(probe_bytes);
    let file = ProbeFile(dir.join(format!("{PROBE_PREFIX}{}", std::process::id())));
    write_probe(&file.0, probe_bytes, record, progress).map_err(|e| {
        folder(format!(
            "cannot write a {probe_mib} MiB probe file there ({} free: {e}); pick a folder you can write, or a \
             smaller --probe-mib",
            larder_store::format_size(space.free)
        ))
    })?;
    let paths = [file.0.clone()];
    let o_direct = reads_one_block(&paths, IoKind::Pread, true);
    let io_uring = IoKind::best() == IoKind::Uring && reads_one_block(&paths, IoKind::Uring, o_direct);
    let kind = if io_uring { IoKind::Uring } else { IoKind::Pread };
    let read_gbps =
        measure(&paths, kind, o_direct, probe_bytes, record, progress).map_err(|e| folder(format!("reading the probe file back: {e}")))?;
    let filesystem = fs_name(dir, space.magic);
    Ok(DriveReport {
        path: dir.to_path_buf(),
        page_cache_only: !o_direct || matches!(filesystem.as_str(), "tmpfs" | "ramfs"),
        filesystem,
        free_bytes: space.free,
        total_bytes: space.total,
        o_direct,
        io_uring,
        backend: kind.name(),
        probe_bytes,
        record_bytes: record,
        read_gbps,
    })
}

/// Writes `bytes` of pseudo-random data (nothing below can shortcut it) and fsyncs.
fn write_probe(path: &Path, bytes: u64, record: u64, progress: &dyn Fn(u64)) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(path)?;
    let mut chunk = AlignedBuf::new(record as usize);
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(std::process::id());
    for b in chunk.as_mut_slice().chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b.copy_from_slice(&x.to_le_bytes());
    }
    let mut left = bytes;
    while left > 0 {
        let n = left.min(record);
        f.write_all(&chunk.as_mut_slice()[..n as usize])?;
        progress(n);
        left -= n;
    }
    f.sync_all()
}

/// Whether a backend of `kind` opens the probe file and reads its first block.
fn reads_one_block(paths: &[PathBuf], kind: IoKind, direct: bool) -> bool {
    let Ok(backend) = open_backend(paths, IoOptions { kind, direct, depth: 1 }) else {
        return false;
    };
    let extent = [Extent {
        file: 0,
        offset: 0,
        len: 4096,
    }];
    let mut ok = false;
    backend.read(&[&extent], &mut |_, r| {
        ok = r.is_ok_and(|v| v.first().is_some_and(|b| b.len() == 4096))
    });
    ok
}

/// Reads the probe file back in `record`-sized reads, `DEPTH` at a time; GB/s.
fn measure(paths: &[PathBuf], kind: IoKind, direct: bool, bytes: u64, record: u64, progress: &dyn Fn(u64)) -> Result<f64, StoreError> {
    let backend = open_backend(
        paths,
        IoOptions {
            kind,
            direct,
            depth: DEPTH,
        },
    )?;
    if !direct {
        drop_page_cache(paths);
    }
    let extents = Extent::tiling(0, bytes, record);
    let jobs: Vec<&[Extent]> = extents.iter().map(std::slice::from_ref).collect();
    let mut failure = None;
    let t = Instant::now();
    for batch in jobs.chunks(DEPTH) {
        read_batch(&*backend, batch, progress, &mut failure);
    }
    let secs = t.elapsed().as_secs_f64();
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(bytes as f64 / secs.max(1e-9) / 1e9)
}

fn read_batch(backend: &dyn IoBackend, batch: &[&[Extent]], progress: &dyn Fn(u64), failure: &mut Option<StoreError>) {
    backend.read(batch, &mut |_, r| match r {
        Ok(views) => progress(views.iter().map(|v| v.len() as u64).sum()),
        Err(e) => {
            failure.get_or_insert(e);
        }
    });
}

/// Removes probe files left by doctor runs that were killed (their process is gone).
fn remove_stale_probes(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(PROBE_PREFIX)) else {
            continue;
        };
        let alive = pid.parse::<u32>().is_ok_and(|p| Path::new(&format!("/proc/{p}")).exists());
        if !alive {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The file system type of `dir`: the mount holding it in
/// /proc/self/mountinfo, else a name for statfs's magic number.
pub(crate) fn fs_name(dir: &Path, magic: u64) -> String {
    let canonical = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let from_mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|text| mount_fs_type(&text, &canonical));
    from_mounts.unwrap_or_else(|| magic_name(magic))
}

/// The type of the last-mounted, deepest mount point holding `path`.
fn mount_fs_type(mountinfo: &str, path: &Path) -> Option<String> {
    let mut best: Option<(usize, String)> = None;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let (Some(point), Some(fstype)) = (left.split(' ').nth(4), right.split(' ').next()) else {
            continue;
        };
        let point = unescape(point);
        let depth = Path::new(&point).components().count();
        if path.starts_with(&point) && best.as_ref().is_none_or(|(d, _)| depth >= *d) {
            best = Some((depth, fstype.to_string()));
        }
    }
    best.map(|(_, t)| t)
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 4).and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(c) => {
                out.push(c as char);
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Names of the statfs magic numbers of common file systems.
fn magic_name(magic: u64) -> String {
    let name = match magic {
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x0102_1994 => "tmpfs",
        0x8584_58F6 => "ramfs",
        0x794C_7630 => "overlay",
        0x2FC1_2FC1 => "zfs",
        0xF2F5_2010 => "f2fs",
        0x6969 => "nfs",
        0x6573_5546 => "fuse",
        0x0102_1997 => "9p",
        0x4D44 => "vfat",
        0x2011_BAB0 => "exfat",
        _ => return format!("unknown (statfs magic {magic:#x})"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
        30 22 0:25 / /dev/shm rw shared:2 - tmpfs tmpfs rw\n\
        31 22 8:2 / /mnt/my\\040disk rw shared:3 - xfs /dev/sdb1 rw\n\
        32 22 0:26 / /mnt/my\\040disk rw shared:4 - overlay overlay rw\n";

    #[test]
    fn deepest_and_latest_mount_wins() {
        assert_eq!(mount_fs_type(MOUNTINFO, Path::new("/home/x")).as_deref(), Some("ext4"));
        assert_eq!(mount_fs_type(MOUNTINFO, Path::new("/dev/shm/a")).as_deref(), Some("tmpfs"));
        assert_eq!(mount_fs_type(MOUNTINFO, Path::new("/mnt/my disk/m")).as_deref(), Some("overlay"));
        assert_eq!(mount_fs_type(MOUNTINFO, Path::new("/dev/shmx")).as_deref(), Some("ext4"));
    }

    #[test]
    fn magic_numbers_have_names() {
        assert_eq!(magic_name(0xEF53), "ext4");
        assert_eq!(magic_name(0x0102_1994), "tmpfs");
        assert!(magic_name(7).contains("0x7"));
        assert_eq!(unescape("a\\040b\\\\"), "a b\\\\");
    }
}
