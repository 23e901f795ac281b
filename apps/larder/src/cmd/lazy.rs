//! Lazy mode for every command that loads a model (`--model SOURCE
//! --cache-dir DIR [--disk-quota SIZE]`, opened by `larder_engine::open`):
//! what the cache holds once loaded (its fetch is shown by
//! `larder_tools::progress::FetchProgress`).

use std::path::Path;

use larder_engine::Engine;
use larder_store::format_size;

use super::ExpertArgs;

/// Says what the lazy cache in `dir` holds, once `engine` loaded from `source`.
pub fn loaded(engine: &Engine, source: &Path, dir: &Path, experts: &ExpertArgs, started: std::time::Instant) {
    if let Some(c) = engine.lazy_counts() {
        tracing::info!(
            "loaded {} lazily into {} in {:.2}s: {} experts ({}) on the drive{}",
            source.display(),
            dir.display(),
            started.elapsed().as_secs_f64(),
            c.present_records,
            format_size(c.present_bytes),
            experts
                .disk_quota
                .map_or(String::new(), |q| format!(" of a {} quota", format_size(q)))
        );
    }
}
