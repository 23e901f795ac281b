//! Lazy mode for every command that loads a model (`--model SOURCE
//! --cache-dir DIR [--disk-quota SIZE]`, opened by `larder_engine::open`):
//! the source's fetch shown as progress, and what the cache holds once loaded.

use std::path::Path;
use std::sync::Arc;

use larder_engine::Engine;
use larder_store::format_size;
use larder_store::lazy::LazyEvent;

use super::progress::{Progress, Unit};
use super::ExpertArgs;

/// The progress bar of a lazy cache's fetch (the spine's ranges, or every
/// source file streamed once and checked).
pub struct FetchProgress(Arc<Progress>);

impl FetchProgress {
    pub fn new(json: bool) -> FetchProgress {
        FetchProgress(Arc::new(Progress::new("spine", 0, Unit::Bytes, json)))
    }

    /// The callback `larder_engine::open` reports the fetch to.
    pub fn events(&self) -> Box<dyn Fn(LazyEvent) + Sync> {
        let fetch = self.0.clone();
        Box::new(move |e: LazyEvent| match e {
            LazyEvent::Started {
                total_bytes,
                done_bytes,
                whole_files,
            } => {
                if whole_files {
                    fetch.set_message("checking every source file against its sha256 (once per cache)");
                }
                fetch.set_total(total_bytes);
                fetch.set(done_bytes);
            }
            LazyEvent::Advanced { bytes } => fetch.inc(bytes),
            LazyEvent::FileChecked { file, verified } => {
                if !verified {
                    tracing::warn!("{file}: the source publishes no sha256; its bytes are trusted as they streamed");
                }
            }
            LazyEvent::Done => fetch.finish(),
        })
    }
}

impl Drop for FetchProgress {
    fn drop(&mut self) {
        self.0.finish();
    }
}

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
