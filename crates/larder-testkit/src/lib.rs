//! What larder's tests share, so no test reaches into another crate's test
//! folder with `#[path]`: the fixture checkpoints' paths ([`fixture`]),
//! scratch folders ([`scratch_dir`]), the fault-injecting Hugging Face
//! hub-layout HTTP server ([`hub`]), and the workspace's architecture checks
//! ([`architecture`]: no import cycles between the files of a crate,
//! dependencies between crates pointing one way). A dev-dependency only:
//! no library crate depends on it.

pub mod architecture;
pub mod hub;

use std::path::{Path, PathBuf};

/// The repository root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The fixture checkpoint `name` (a folder under the repository's `fixtures/`).
pub fn fixture(name: &str) -> PathBuf {
    workspace_root().join("fixtures").join(name)
}

/// An empty scratch folder `larder-<name>-<pid>` under the temp dir (emptied
/// first if a previous run left it).
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("larder-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch folder under the temp dir");
    dir
}
