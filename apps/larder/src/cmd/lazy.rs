//! Lazy mode for every command that loads a model (`--model SOURCE
//! --cache-dir DIR [--disk-quota SIZE]`): the spine's fetch and load shown
//! as progress, then an engine whose experts arrive on first use.

use std::path::Path;
use std::sync::Arc;

use larder_engine::lazy::LazyLoad;
use larder_engine::Engine;
use larder_store::format_size;
use larder_store::lazy::{LazyEvent, LazyOptions};
use larder_store::remote::{HubEnv, RemoteOptions};

use super::progress::{Progress, Unit};
use super::ExpertArgs;

/// Loads `source` lazily into `dir` with the expert flags of `experts`.
pub fn load(source: &Path, dir: &Path, experts: &ExpertArgs, json: bool) -> anyhow::Result<Engine> {
    let store = experts.store_options(source);
    let load = LazyLoad {
        source: source.to_string_lossy().into_owned(),
        cache_dir: dir.to_path_buf(),
        lazy: LazyOptions {
            disk_quota: experts.disk_quota,
            io: store.io,
            check: experts.source_check,
            ..LazyOptions::default()
        },
        store,
        remote: RemoteOptions {
            deadline: Some(std::time::Duration::from_secs(experts.source_timeout)),
            ..RemoteOptions::default()
        },
        env: HubEnv::from_process(),
        mla_cache: experts.load_options(source).mla_cache,
    };
    let started = std::time::Instant::now();
    let fetch = Progress::new("spine", 0, Unit::Bytes, json);
    let events = |e: LazyEvent| match e {
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
    };
    let shown = Arc::new(Progress::new("load", 0, Unit::Bytes, json));
    let hook = {
        let shown = shown.clone();
        Arc::new(move |done, total| {
            shown.set_total(total);
            shown.set(done);
        })
    };
    let loaded = Engine::load_lazy(&load, Some(hook), &events);
    fetch.finish();
    shown.finish();
    let engine = super::about(loaded, "cannot load lazily", dir)?;
    for w in engine.take_warnings() {
        tracing::warn!("{w}");
    }
    if let Some(c) = engine.lazy_counts() {
        tracing::info!(
            "loaded {} lazily into {} in {:.2}s: {} experts ({}) on the drive{}",
            load.source,
            dir.display(),
            started.elapsed().as_secs_f64(),
            c.present_records,
            format_size(c.present_bytes),
            experts
                .disk_quota
                .map_or(String::new(), |q| format!(" of a {} quota", format_size(q)))
        );
    }
    Ok(engine)
}
