//! What a folder given as `--model` (or to `verify`) is, before anything is
//! loaded from it: a lazy cache (complete, or its first open unfinished), or
//! an unfinished `pack` or `pull` (a plan but no manifest.json yet), with
//! what to run to finish it.

use std::path::Path;

/// Where a lazy cache keeps the description of its source.
pub(crate) const LAZY_STAGING: &str = ".lazy-source";

/// Where a pull keeps the fetched config, tokenizer and index files until
/// its store is complete.
pub(crate) const PULL_STAGING: &str = ".pull";

/// Whether `dir` is a lazy cache, complete or with its first open unfinished.
pub fn is_lazy_cache(dir: &Path) -> bool {
    dir.join("lazy.json").is_file() || (dir.join(LAZY_STAGING).is_dir() && !dir.join("manifest.json").exists())
}

/// What an unfinished store folder is and how to finish it: the first open
/// of a lazy cache, a `pull` (its journal or staging folder), or a `pack`;
/// `None` for any other folder.
pub fn unfinished_store(dir: &Path) -> Option<String> {
    if !larder_store::pack::is_unfinished(dir) {
        return None;
    }
    if is_lazy_cache(dir) {
        return Some(
            "a lazy cache whose first open did not finish (no lazy.json yet): run it with `--model SOURCE \
             --cache-dir DIR` again to resume it"
                .into(),
        );
    }
    if dir.join("pull-state.json").exists() || dir.join(PULL_STAGING).is_dir() {
        return Some(
            "an unfinished `larder pull` (no manifest.json yet): run the same `larder pull SOURCE --out DIR` again \
             to resume it; only what is missing is fetched"
                .into(),
        );
    }
    Some("an unfinished `larder pack` (no manifest.json yet); re-run the same pack command to finish it".into())
}
