//! Lazy mode (`--model SOURCE --cache-dir DIR`): an engine over a remote
//! checkpoint that fetches the small files and the spine, starts, and
//! fetches each routed expert the first time it is used into a partial
//! store in `DIR` ([`larder_store::lazy`]). The checkpoint is described as
//! `larder pull` describes it (and checked as `larder run` loads it) once;
//! later opens read the description saved in `DIR` and need the network
//! only for experts not fetched yet: offline, the engine serves what it
//! has and fails only the requests that need a missing expert.

use std::path::PathBuf;
use std::sync::Arc;

use larder_model::arch::read_spec;
use larder_model::{DecoderModel, ExpertProvider};
use larder_store::lazy::{self, LazyCounts, LazyEvent, LazyOptions, LazyStore};
use larder_store::remote::{open_source, CheckpointSource, FileSource, HubEnv, RemoteOptions};
use larder_store::{ExpertStore, StoreOptions};

use crate::engine::{report_reads, Engine, LoadProgress};
use crate::error::store_err;
use crate::error::EngineError;
use crate::experts::StoreExperts;
use crate::integrity::{check_carried, open_spine_files};
use crate::pull::{describe_remote, describe_staged};

/// Where the description of the source is kept inside the cache folder.
const STAGING: &str = crate::store_folder::LAZY_STAGING;

pub use crate::store_folder::is_lazy_cache;

/// How to load a model lazily.
#[derive(Debug, Clone)]
pub struct LazyLoad {
    /// The SOURCE: a hub repo id (`org/name[@rev]`), an http(s) base URL in
    /// the hub's layout, or a folder.
    pub source: String,
    pub cache_dir: PathBuf,
    pub lazy: LazyOptions,
    /// The RAM cache and prefetch in front of the lazy store.
    pub store: StoreOptions,
    pub remote: RemoteOptions,
    pub env: HubEnv,
    /// What MLA layers cache per position.
    pub mla_cache: larder_model::MlaCache,
}

/// Opens the lazy store `load` names: describes the source (or reads the
/// saved description), then fetches what is missing of the spine.
pub fn open_lazy(load: &LazyLoad, events: &(dyn Fn(LazyEvent) + Sync)) -> Result<LazyStore, EngineError> {
    let parsed = CheckpointSource::parse(&load.source, &load.env)?;
    let remote: Arc<dyn FileSource> = Arc::from(open_source(&parsed, &load.env, &load.remote)?);
    let staging = load.cache_dir.join(STAGING);
    let saved = if lazy::is_lazy(&load.cache_dir) {
        describe_staged(&staging)?
    } else {
        None
    };
    let described = match saved {
        Some(d) => d,
        None => describe_remote(remote.as_ref(), &staging)?,
    };
    lazy::open(
        remote,
        &load.source,
        &described.files,
        &described.source,
        &load.cache_dir,
        load.lazy,
        events,
    )
    .map_err(store_err)
}

/// Checks the lazy cache in `dir` without the network
/// ([`larder_store::lazy::verify`]), from the description it saved.
pub fn verify_lazy(dir: &std::path::Path) -> Result<lazy::LazyVerifyReport, EngineError> {
    let staging = dir.join(STAGING);
    let described = describe_staged(&staging)?.ok_or_else(|| EngineError::File {
        path: staging.clone(),
        message: "holds no description of the source: not a lazy cache, or its first open did not finish \
                  (run the same command with --cache-dir again to resume it)"
            .into(),
    })?;
    lazy::verify(dir, &described.source).map_err(store_err)
}

impl Engine {
    /// Loads a model lazily (see the module docs); `progress` sees the
    /// spine's load from the cache, `events` the spine's fetch.
    pub fn load_lazy(
        load: &LazyLoad,
        progress: Option<Arc<LoadProgress>>,
        events: &(dyn Fn(LazyEvent) + Sync),
    ) -> Result<Engine, EngineError> {
        let opened = open_lazy(load, events)?;
        let dir = opened.root.clone();
        check_carried(&dir, &opened.carried)?;
        let mut spec = read_spec(&dir)?;
        spec.mla_cache = load.mla_cache;
        let mut ckpt = open_spine_files(&dir, &opened.spine)?;
        let backend = opened.backend.clone();
        let store = Arc::new(ExpertStore::over_backend(opened.index, backend.clone(), load.store).map_err(store_err)?);
        let provider: Arc<dyn ExpertProvider> = Arc::new(StoreExperts::new(store.clone(), &spec)?);
        report_reads(&mut ckpt, &dir, &spec, Some(provider.clone()), progress);
        let model = DecoderModel::load(spec, &ckpt, Some(provider))?;
        let mut engine = Engine::assemble(&dir, model, Some(store))?;
        engine.lazy = Some((backend, opened.lock));
        Ok(engine)
    }

    /// What the lazy cache did since the engine loaded (`None`: not lazy).
    pub fn lazy_counts(&self) -> Option<LazyCounts> {
        self.lazy.as_ref().map(|(b, _)| b.counts())
    }

    /// A lazy cache's problems that failed no request (experts fetched but
    /// not kept: a full drive, say) since the last call.
    pub(crate) fn take_lazy_problems(&self) -> Vec<String> {
        self.lazy.as_ref().map(|(b, _)| b.take_problems()).unwrap_or_default()
    }
}
