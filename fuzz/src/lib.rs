//! Shared helpers of larder's fuzz targets: a scratch folder on tmpfs
//! (`/dev/shm`, falling back to the temp dir) that each target refills with
//! the fuzzed files, and the splitting of one fuzz input into several files.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Separates the files packed into one fuzz input (see [`split_files`]).
pub const FILE_SEPARATOR: &[u8] = b"\n\0FILE\0\n";

/// A per-process scratch folder named after `target`, emptied on each call.
pub fn scratch_dir(target: &str) -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        base.join(format!("larder-fuzz-{target}-{}", std::process::id()))
    });
    let _ = std::fs::remove_dir_all(dir);
    if let Err(e) = std::fs::create_dir_all(dir) {
        // Not an input-dependent failure: the harness cannot run at all.
        panic!("cannot create the fuzz scratch folder {}: {e}", dir.display());
    }
    dir
}

/// Writes `bytes` to `dir/name`, panicking only on a harness failure.
pub fn write(dir: &Path, name: &str, bytes: &[u8]) {
    let path = dir.join(name);
    if let Err(e) = std::fs::write(&path, bytes) {
        panic!("cannot write {}: {e}", path.display());
    }
}

/// Splits `data` at every [`FILE_SEPARATOR`].
pub fn split_files(data: &[u8]) -> Vec<&[u8]> {
    let mut parts = Vec::new();
    let mut rest = data;
    while let Some(at) = find(rest, FILE_SEPARATOR) {
        parts.push(&rest[..at]);
        rest = &rest[at + FILE_SEPARATOR.len()..];
    }
    parts.push(rest);
    parts
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The repository's `fixtures/` folder (for real templates and tokenizers).
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}
