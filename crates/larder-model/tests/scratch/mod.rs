//! A fixture copied into a scratch folder for a test to edit, removed again
//! when the test is done (pass or panic), so test runs leave nothing in the
//! temp directory.

use std::ops::Deref;
use std::path::{Path, PathBuf};

/// A copy of `fixtures/<name>` under the temp directory; derefs to its path.
pub struct FixtureCopy(PathBuf);

impl FixtureCopy {
    /// Copies `fixtures/<name>` to `<tmp>/<prefix>-<pid>-<tag>` (replacing a stale copy).
    pub fn new(prefix: &str, name: &str, tag: &str) -> FixtureCopy {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name);
        let dst = std::env::temp_dir().join(format!("{prefix}-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dst);
        std::fs::create_dir_all(&dst).unwrap();
        for e in std::fs::read_dir(&src).unwrap().flatten() {
            std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
        }
        FixtureCopy(dst)
    }
}

impl Deref for FixtureCopy {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for FixtureCopy {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for FixtureCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
