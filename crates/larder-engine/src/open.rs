//! Opening a model as every larder command does, from one options value
//! ([`OpenOptions`]): where routed experts live and how much RAM their cache
//! may take (`RamBudget::Auto`: sized from this model and the memory
//! available, then kept under memory pressure), how prompts are split into
//! passes, whether the cache is warmed from the store's heat, and lazy mode.
//! [`open`] checks the budget against one expert record and the run against
//! this process's cgroup memory limit before reading a weight, loads the
//! checkpoint, packed store or lazy cache, then warms the cache and starts
//! the memory watcher. What a caller should tell the user comes back as
//! [`Note`]s (the library prints nothing).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use larder_model::MlaCache;
use larder_store::{format_size, IoKind, IoOptions, Manifest, StoreOptions};

use crate::engine::{Engine, ExpertMode, LoadOptions, LoadProgress};
use crate::error::{store_err, EngineError};
use crate::memory_watch::WatchConfig;
use crate::prefill::PrefillChunk;

/// The RAM budget of the expert cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RamBudget {
    /// Sized from the memory available at start (minus headroom, the spine
    /// and the prefill memory, capped at the experts' size), then shrunk
    /// under memory pressure and grown back ([`crate::memory_watch`]).
    Auto,
    /// At most this many bytes (0: no cache).
    Bytes(u64),
}

/// Lazy mode: the model is a SOURCE (hub repo, hub-layout URL or folder)
/// fetched into `cache_dir` ([`crate::lazy`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LazyOpen {
    pub cache_dir: PathBuf,
    /// Most bytes the cache folder may hold.
    pub disk_quota: Option<u64>,
    /// How the source is checked (`None`: the cache's own, or streaming for a new one).
    #[cfg(feature = "remote")]
    pub source_check: Option<larder_store::lazy::SourceCheck>,
    /// The longest one request to the source may take, retries included.
    pub source_timeout: Duration,
}

impl LazyOpen {
    pub fn new(cache_dir: impl Into<PathBuf>) -> LazyOpen {
        LazyOpen {
            cache_dir: cache_dir.into(),
            disk_quota: None,
            #[cfg(feature = "remote")]
            source_check: None,
            source_timeout: Duration::from_secs(20),
        }
    }
}

/// How to open a model (see the module docs); build it with the methods.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct OpenOptions {
    /// `None`: experts stay in RAM for a checkpoint folder (unless `io` asks
    /// to stream), and are streamed with [`RamBudget::Auto`] from a packed store.
    pub ram_budget: Option<RamBudget>,
    /// The I/O backend (`None`: the best this machine has); setting it streams.
    pub io: Option<IoKind>,
    pub direct: bool,
    pub io_depth: usize,
    /// Check each expert record's digest when it is read.
    pub verify: bool,
    /// Threads reading predicted experts in the background.
    pub prefetch: usize,
    pub prefill: PrefillChunk,
    pub mla_cache: MlaCache,
    /// Warm the cache with the store's hottest experts at start.
    pub warm: bool,
    pub lazy: Option<LazyOpen>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            ram_budget: None,
            io: None,
            direct: true,
            io_depth: 8,
            verify: true,
            prefetch: 2,
            prefill: PrefillChunk::default(),
            mla_cache: MlaCache::default(),
            warm: false,
            lazy: None,
        }
    }
}

impl OpenOptions {
    pub fn new() -> OpenOptions {
        OpenOptions::default()
    }

    pub fn ram_budget(mut self, budget: RamBudget) -> Self {
        self.ram_budget = Some(budget);
        self
    }

    pub fn io(mut self, kind: IoKind, direct: bool, depth: usize) -> Self {
        (self.io, self.direct, self.io_depth) = (Some(kind), direct, depth);
        self
    }

    pub fn verify(mut self, on: bool) -> Self {
        self.verify = on;
        self
    }

    pub fn prefetch(mut self, threads: usize) -> Self {
        self.prefetch = threads;
        self
    }

    pub fn prefill(mut self, prefill: PrefillChunk) -> Self {
        self.prefill = prefill;
        self
    }

    pub fn mla_cache(mut self, cache: MlaCache) -> Self {
        self.mla_cache = cache;
        self
    }

    pub fn warm(mut self, on: bool) -> Self {
        self.warm = on;
        self
    }

    pub fn lazy(mut self, lazy: LazyOpen) -> Self {
        self.lazy = Some(lazy);
        self
    }

    /// Whether the cache is sized from memory (and follows pressure).
    pub(crate) fn budget_is_auto(&self) -> bool {
        !matches!(self.ram_budget, Some(RamBudget::Bytes(_)))
    }

    /// The store options for experts streamed from `model`.
    pub(crate) fn store_options(&self, model: &Path) -> StoreOptions {
        StoreOptions {
            io: IoOptions {
                kind: self.io.unwrap_or_else(IoKind::best),
                direct: self.direct,
                depth: self.io_depth,
            },
            ram_budget: match self.ram_budget {
                Some(RamBudget::Bytes(b)) => b,
                _ => self.auto_budget(model).map_or_else(default_budget, |(budget, _)| budget),
            },
            verify: self.verify,
            prefetch_threads: self.prefetch,
        }
    }

    /// The load options for the model at `model` (not lazy).
    pub fn load_options(&self, model: &Path) -> LoadOptions {
        let streams = Manifest::is_store(model) || self.ram_budget.is_some() || self.io.is_some();
        LoadOptions {
            experts: match streams {
                true => ExpertMode::Stream(self.store_options(model)),
                false => ExpertMode::InRam,
            },
            mla_cache: self.mla_cache,
        }
    }

    /// The budget [`RamBudget::Auto`] gives `model` and how the watcher keeps
    /// it (`None` where the model's sizes or the memory available cannot be read).
    pub(crate) fn auto_budget(&self, model: &Path) -> Option<(u64, WatchConfig)> {
        let sizes = crate::sizing::inspect(model).ok()?.sizes;
        let available = crate::memory_watch::available()?;
        let prefill = match self.prefill {
            PrefillChunk::Auto { memory } => memory,
            PrefillChunk::Rows(_) => 0,
        };
        // Records are read in whole 4 KiB blocks: a tiny model's record can
        // outgrow its logical expert bytes, and a budget must hold one.
        let one_record = crate::sizing::expert_index(model).map_or(0, |index| larder_store::smallest_budget(&index, self.direct));
        let floor = sizes.min_cache_bytes().max(one_record);
        let bank = sizes.bank_bytes.max(one_record);
        let budget = crate::memory_watch::auto_budget(available, sizes.spine_bytes, prefill, bank, floor);
        let config = WatchConfig {
            ceiling: budget,
            floor,
            headroom: crate::plan::headroom(available),
            period: Duration::from_secs(1),
        };
        Some((budget, config))
    }
}

/// Half of the memory available now (the cache size when `auto` cannot read the model's sizes).
fn default_budget() -> u64 {
    crate::prefill::mem_available().map_or(4 << 30, |bytes| bytes / 2)
}

/// Something to tell the user about an open.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Note {
    Info(String),
    Warning(String),
}

/// What to show while a model opens: the spine's load (bytes done, total),
/// in lazy mode the fetch of the source, and the notes as they arise (a
/// warning about memory comes before the load the kernel might kill).
#[derive(Default)]
pub struct OpenProgress {
    pub load: Option<Arc<LoadProgress>>,
    #[cfg(feature = "remote")]
    pub fetch: Option<FetchHook>,
    pub notes: Option<NoteHook>,
}

/// Called with each note as it arises.
pub type NoteHook = Box<dyn Fn(&Note) + Sync>;
/// Called with each event of a lazy source's fetch.
#[cfg(feature = "remote")]
pub type FetchHook = Box<dyn Fn(larder_store::lazy::LazyEvent) + Sync>;

/// An open model and the notes no callback took.
pub struct Opened {
    pub engine: Engine,
    pub notes: Vec<Note>,
}

/// Opens the model at `model` with `opts` (see the module docs).
pub fn open(model: &Path, opts: &OpenOptions, mut progress: OpenProgress) -> Result<Opened, EngineError> {
    let mut notes = Vec::new();
    let said = progress.notes.take();
    let mut say = |note: Note| match &said {
        Some(f) => f(&note),
        None => notes.push(note),
    };
    let mut engine = match &opts.lazy {
        Some(lazy) => open_lazy(model, lazy, opts, progress)?,
        None => {
            let load = opts.load_options(model);
            check_budget(model, &load)?;
            if let Some(warning) = crate::memory_check::check(model, opts.budget_is_auto(), opts.prefill, &load)? {
                say(Note::Warning(warning));
            }
            match progress.load {
                Some(hook) => Engine::load_with_progress(model, &load, hook)?,
                None => Engine::load_with(model, &load)?,
            }
        }
    };
    engine.set_prefill(opts.prefill);
    for w in engine.take_warnings() {
        say(Note::Warning(w));
    }
    if opts.warm {
        if let Err(e) = larder_store::heat::read_saved(model) {
            say(Note::Warning(format!("--warm: {e}; nothing to warm by")));
        }
        let (n, bytes) = engine.warm()?;
        say(Note::Info(format!("warmed {n} experts ({})", format_size(bytes))));
    }
    if opts.budget_is_auto() && opts.lazy.is_none() {
        if let Some((_, config)) = opts.auto_budget(model) {
            engine.watch_memory(config);
        }
    }
    Ok(Opened { engine, notes })
}

/// Refuses a streaming RAM budget that cannot hold one expert record of
/// `model` (0, no cache, is accepted), before anything heavy is loaded. An
/// index that cannot be read fails the load itself, with its own error.
pub fn check_budget(model: &Path, load: &LoadOptions) -> Result<(), EngineError> {
    let ExpertMode::Stream(o) = &load.experts else {
        return Ok(());
    };
    let Ok(index) = crate::sizing::expert_index(model) else {
        return Ok(());
    };
    o.check_budget(&index).map_err(store_err)
}

#[cfg(feature = "remote")]
fn open_lazy(source: &Path, lazy: &LazyOpen, opts: &OpenOptions, progress: OpenProgress) -> Result<Engine, EngineError> {
    use larder_store::remote::{HubEnv, RemoteOptions};
    let store = opts.store_options(source);
    let load = crate::lazy::LazyLoad {
        source: source.to_string_lossy().into_owned(),
        cache_dir: lazy.cache_dir.clone(),
        lazy: larder_store::lazy::LazyOptions {
            disk_quota: lazy.disk_quota,
            io: store.io,
            check: lazy.source_check,
            ..larder_store::lazy::LazyOptions::default()
        },
        store,
        remote: RemoteOptions {
            deadline: Some(lazy.source_timeout),
            ..RemoteOptions::default()
        },
        env: HubEnv::from_process(),
        mla_cache: opts.mla_cache,
    };
    let quiet = |_| {};
    let events: &(dyn Fn(larder_store::lazy::LazyEvent) + Sync) = match &progress.fetch {
        Some(f) => f.as_ref(),
        None => &quiet,
    };
    Engine::load_lazy(&load, progress.load, events)
}

#[cfg(not(feature = "remote"))]
fn open_lazy(_: &Path, lazy: &LazyOpen, _: &OpenOptions, _: OpenProgress) -> Result<Engine, EngineError> {
    Err(EngineError::File {
        path: lazy.cache_dir.clone(),
        message: "lazy mode needs larder-engine's `remote` feature".into(),
    })
}
