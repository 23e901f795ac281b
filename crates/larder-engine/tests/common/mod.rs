//! Helpers shared by larder-engine's integration tests.

use std::path::{Path, PathBuf};

/// The SmolLM2-135M-Instruct checkpoint: `$LARDER_SMOLLM2`, else
/// `${LARDER_CACHE:-~/.cache/larder}/smollm2/checkpoint` when it exists
/// (made by `larder demo` or `scripts/fetch_smollm2.sh`).
pub fn smollm2_checkpoint() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("LARDER_SMOLLM2") {
        return Some(PathBuf::from(p));
    }
    let cache = std::env::var("LARDER_CACHE")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|h| Path::new(&h).join(".cache/larder")))
        .ok()?;
    let p = cache.join("smollm2/checkpoint");
    p.join("config.json").exists().then_some(p)
}
