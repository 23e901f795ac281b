//! The demo's fallback: the random-weight fixture `fixtures/qwen3_moe_tok`
//! (a 2-layer Qwen3-MoE with Qwen's tokenizer and chat template), built into
//! the binary and written out when it is needed, so the fallback works
//! wherever larder runs, not only from its source tree. It goes to
//! `<cache>/demo/fixture-qwen3_moe_tok` (kept and reused while its files are
//! the built-in ones), or, when the cache cannot be written, to a temporary
//! folder removed after the run.

use std::path::{Path, PathBuf};

use crate::{Result, ToolsError};

/// The fixture's name, as the demo reports it.
pub const NAME: &str = "qwen3_moe_tok";

macro_rules! fixture_file {
    ($name:literal) => {
        (
            $name,
            include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/qwen3_moe_tok/", $name)).as_slice(),
        )
    };
}

/// The files a run of the fixture needs, by name.
const FILES: [(&str, &[u8]); 7] = [
    fixture_file!("config.json"),
    fixture_file!("generation_config.json"),
    fixture_file!("model-00001-of-00002.safetensors"),
    fixture_file!("model-00002-of-00002.safetensors"),
    fixture_file!("model.safetensors.index.json"),
    fixture_file!("tokenizer.json"),
    fixture_file!("tokenizer_config.json"),
];

/// The fixture written out; a temporary copy is removed when this is dropped.
#[derive(Debug)]
pub struct Fixture {
    dir: PathBuf,
    temporary: bool,
}

impl Fixture {
    /// The checkpoint folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `<cache>/demo/fixture-qwen3_moe_tok`.
pub fn cache_dir(cache: &Path) -> PathBuf {
    cache.join("demo").join(format!("fixture-{NAME}"))
}

/// Whether `dir` holds exactly the built-in files.
fn is_current(dir: &Path) -> bool {
    FILES.iter().all(|(name, bytes)| {
        let path = dir.join(name);
        std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() == bytes.len() as u64)
            && std::fs::read(&path).is_ok_and(|have| have == *bytes)
    })
}

/// Writes the files into `dir` through `<dir>.tmp-PID`, renamed into place last.
fn write_into(dir: &Path) -> std::io::Result<()> {
    let tmp = PathBuf::from(format!("{}.tmp-{}", dir.display(), std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    std::fs::create_dir_all(&tmp)?;
    for (name, bytes) in FILES {
        std::fs::write(tmp.join(name), bytes)?;
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    match std::fs::rename(&tmp, dir) {
        Ok(()) => Ok(()),
        // Another demo wrote it first.
        Err(_) if is_current(dir) => std::fs::remove_dir_all(&tmp),
        Err(e) => Err(e),
    }
}

/// The fixture in `<cache>/demo` when `cache` can hold it, else in a
/// temporary folder; `reason` is why the demo falls back (named in the error
/// when the fixture cannot be written at all).
pub fn materialize(cache: Option<&Path>, reason: &str) -> Result<Fixture> {
    if let Some(cache) = cache {
        let dir = cache_dir(cache);
        if is_current(&dir) || write_into(&dir).is_ok() {
            return Ok(Fixture { dir, temporary: false });
        }
    }
    let dir = std::env::temp_dir().join(format!("larder-demo-fixture-{}", std::process::id()));
    match write_into(&dir) {
        Ok(()) => Ok(Fixture { dir, temporary: true }),
        Err(source) => {
            let _ = std::fs::remove_dir_all(&dir);
            Err(ToolsError::Fixture {
                reason: reason.to_string(),
                dir,
                source,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_once_then_reused_and_a_changed_file_is_rewritten() {
        let tmp = tempfile::tempdir().unwrap();
        let f = materialize(Some(tmp.path()), "test").unwrap();
        assert_eq!(f.dir(), cache_dir(tmp.path()));
        assert!(is_current(f.dir()));
        std::fs::write(f.dir().join("config.json"), b"{}").unwrap();
        assert!(!is_current(f.dir()));
        let again = materialize(Some(tmp.path()), "test").unwrap();
        assert!(is_current(again.dir()));
    }

    #[test]
    fn an_unwritable_cache_gets_a_temporary_copy_removed_after() {
        let f = materialize(Some(Path::new("/proc/forbidden")), "test").unwrap();
        let dir = f.dir().to_path_buf();
        assert!(is_current(&dir) && dir.starts_with(std::env::temp_dir()));
        drop(f);
        assert!(!dir.exists());
    }
}
