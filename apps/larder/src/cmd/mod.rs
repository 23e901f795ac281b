//! Subcommands of the `larder` binary, one file each, the options they
//! share (where routed experts come from, `--overwrite` of output files) and
//! the ranges every count, size and thread flag is checked against when
//! parsed ([`range`]). Every output file a flag names (`--trace FILE`,
//! `--out FILE`) is checked by `larder_engine::OutputFile` before any work.

pub mod bench;
pub mod bench_cache;
pub mod bench_lazy;
pub mod bench_pull;
pub mod bench_run;
pub mod bench_serve;
pub mod bench_store;
pub mod demo;
pub mod doctor;
pub mod forward;
pub mod lazy;
pub mod mirror;
pub mod pack;
pub mod plan;
pub mod pull;
pub mod run;
pub mod serve;
pub mod synth;
pub mod trace;
pub mod verify;
pub mod warm;

pub use larder_tools::progress;

use std::path::Path;

use anyhow::Context;
use larder_engine::open::{LazyOpen, Note, OpenOptions, OpenProgress, RamBudget};
use larder_engine::{Engine, LoadOptions, OutputFile, OutputKind, PrefillChunk, ReportKind, RunInputs};
use larder_model::MlaCache;
use larder_store::io::MAX_IO_DEPTH;
use larder_store::MAX_PREFETCH_THREADS;
use larder_store::{format_size, parse_size, IoKind};

/// Most threads a thread-count flag accepts (`bench kernels --threads`).
pub const MAX_THREADS: usize = 1024;
/// Most records or tokens a count flag accepts (`--records`, `--new`, ...).
pub const MAX_COUNT: usize = 1 << 20;
/// Most records read together (`bench io --batch`): a layer step's top-k.
pub const MAX_BATCH: usize = 1024;
/// Most tokens drafted per verification (`--draft-max`): a verification
/// pass is one batch, bit-identical to single rows up to 64 rows.
pub const MAX_DRAFT: usize = 64;

/// A clap value parser for an integer in `min..=max`; clap's error names the
/// flag, this message the range.
pub fn range(min: usize, max: usize) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync + 'static {
    move |s: &str| {
        let v: usize = s
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} is not a whole number (use {min} to {max})"))?;
        if (min..=max).contains(&v) {
            Ok(v)
        } else {
            Err(format!("{v} is out of range: use {min} to {max}"))
        }
    }
}

/// `--overwrite`: shared by every command that writes a file the user names.
#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub struct OverwriteArg {
    /// Replace an existing output file (--trace FILE, --out FILE) that holds what this command writes (a route
    /// trace, or a JSON report of this command). Without it such a file is refused. Never replaced, even with
    /// it: an input of the run (any file of --model's folder or store, --cache-dir, ...), a folder, device,
    /// FIFO or socket, or a file of another kind. An empty file is replaced without it.
    #[arg(long)]
    pub overwrite: bool,
}

/// The inputs of a run that loads `model` with `experts`' flags: the model's
/// files and the lazy cache folder (no output may be one of them).
pub fn model_inputs(model: &Path, experts: &ExpertArgs) -> RunInputs {
    let inputs = RunInputs::new().model("--model", model);
    match &experts.cache_dir {
        Some(dir) => inputs.folder("--cache-dir", dir),
        None => inputs,
    }
}

/// Where routed experts live: options shared by every command that loads a model.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ExpertArgs {
    /// Stream routed experts through a RAM cache of at most SIZE (e.g. 512MiB,
    /// 8GiB) instead of keeping them all in RAM, or `auto`: the memory available
    /// at start minus headroom (the larger of 1 GiB and 5%), the spine and the
    /// prefill memory, capped at the experts' size, then shrunk under memory
    /// pressure (MemAvailable, the cgroup's v2 memory.max or v1
    /// memory.limit_in_bytes) and grown back without a restart (output is the
    /// same at every size). Under a cgroup limit the spine and one layer
    /// step's experts must fit, or the run stops before loading and says so. Default: `auto` for a packed
    /// store or when --io asks to stream; all in RAM for a checkpoint folder.
    /// At least one expert record (the error says how much), or 0 for no
    /// cache (every use of an expert reads it again).
    #[arg(long, value_name = "SIZE|auto", value_parser = parse_ram_budget)]
    pub ram_budget: Option<RamBudget>,
    /// I/O backend for streamed experts: uring (io_uring; default on Linux),
    /// pread (thread pool), or mmap (opt-in, for comparison: honours --ram-budget, but a
    /// layer file changed or truncated while larder runs can kill it with SIGBUS). Implies streaming.
    #[arg(long, value_name = "pread|uring|mmap", value_parser = parse_io)]
    pub io: Option<IoKind>,
    /// Read experts with O_DIRECT (bypass the page cache; default).
    #[arg(long, overrides_with = "no_direct")]
    pub direct: bool,
    /// Read experts through the page cache.
    #[arg(long)]
    pub no_direct: bool,
    /// Reads in flight, 1 to 256 (pread threads; io_uring uses 4 reads per unit).
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = range(1, MAX_IO_DEPTH))]
    pub io_depth: usize,
    /// Check each expert record's digest when it is read (packed stores).
    /// `off` is unsafe: a corrupt drive then silently changes the output.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = ["on", "off"])]
    pub verify: String,
    /// Threads reading the next layer's predicted experts in the background,
    /// 0 to 64 (0: no prefetch). Predictions change when bytes arrive, never results.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = range(0, MAX_PREFETCH_THREADS))]
    pub prefetch: usize,
    /// Lazy mode: --model is then a SOURCE (a hub repo id `org/name[@rev]`
    /// with HF_ENDPOINT/HF_TOKEN, an http(s) base URL in the hub's layout,
    /// or a folder). The small files and the spine are fetched into DIR
    /// first; each routed expert is fetched the first time it is used and
    /// kept in DIR as a record of a partial store that survives restarts.
    /// Output is bit-identical to a local run. How fetched bytes are checked:
    /// --source-check.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<std::path::PathBuf>,
    /// With --cache-dir, how bytes from the SOURCE are checked before use.
    /// `stream` (a new cache's default): each source file streams once,
    /// whole, and must match the sha256 the source publishes before the
    /// model loads; every expert fetched later must match the digest its
    /// bytes had then (the first open moves the whole checkpoint once, as
    /// `pull` does; records beyond --disk-quota are not kept). `first-fetch`:
    /// only the spine and the experts used are fetched, and a range's first
    /// fetch is trusted (later fetches and reads must match it): faster to
    /// start on a huge checkpoint, but not checked against the source's
    /// sha256. Fixed when the cache is made; default: the cache's own.
    #[arg(long, value_name = "stream|first-fetch", value_parser = larder_store::lazy::SourceCheck::parse, requires = "cache_dir")]
    pub source_check: Option<larder_store::lazy::SourceCheck>,
    /// With --cache-dir: the longest one request to the SOURCE may take,
    /// retries included, in seconds (keep it below your clients' timeout).
    /// After a fetch finds the source unreachable, requests that need it
    /// fail at once for 30 s (the server answers 503 with Retry-After),
    /// while requests whose experts are cached are served.
    #[arg(long, value_name = "SECONDS", default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=3600), requires = "cache_dir")]
    pub source_timeout: u64,
    /// With --cache-dir: most bytes DIR may hold (spine, small files and
    /// expert records, e.g. 300GiB); the least-used experts are evicted to
    /// stay under it. Default: no limit.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, requires = "cache_dir")]
    pub disk_quota: Option<u64>,
    /// Activation memory one prefill pass may hold (e.g. 4GiB; default: an
    /// eighth of the RAM available at start, a cgroup limit counting, at least
    /// 1GiB or a quarter of it, whichever is less). A prompt runs in
    /// one pass, reading each routed expert once, unless its activations
    /// would exceed this; then in as few equal passes as fit. Results never
    /// depend on it.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub prefill_memory: Option<u64>,
    /// Run prompts in fixed passes of N tokens instead (1 to 1048576; the
    /// chunking larder used before read-once prefill was 256), for comparisons.
    #[arg(long, value_name = "N", value_parser = range(1, MAX_COUNT), conflicts_with = "prefill_memory")]
    pub prefill_chunk: Option<usize>,
    /// What MLA layers (DeepSeek-V3, Kimi) cache per token: `compact` (default;
    /// the compressed latent and rope key, kv_lora_rank + rope floats per
    /// layer, 137 KiB per token for DeepSeek-V3) or `expanded` (every head's
    /// keys and values, 9.5 MiB per token for DeepSeek-V3; for comparison).
    /// `larder doctor --model DIR` prints the KV bytes per token.
    #[arg(long, value_name = "compact|expanded", default_value = "compact", value_parser = ["compact", "expanded"])]
    pub mla_cache: String,
    /// Packed stores: at start, read the hottest experts of earlier runs (the store's heat.json, which each
    /// streamed run adds to) into the RAM cache, up to its budget.
    #[arg(long)]
    pub warm: bool,
}

fn parse_ram_budget(s: &str) -> Result<RamBudget, String> {
    if s.trim() == "auto" {
        return Ok(RamBudget::Auto);
    }
    parse_size(s).map(RamBudget::Bytes).map_err(|e| format!("{e} (or `auto`)"))
}

fn parse_io(s: &str) -> Result<IoKind, String> {
    IoKind::parse(s).ok_or_else(|| format!("unknown I/O backend {s:?} (pread, uring or mmap)"))
}

impl ExpertArgs {
    /// The engine's options for these flags (larder_engine::open).
    pub fn open_options(&self) -> OpenOptions {
        let mut o = OpenOptions::new()
            .verify(self.verify == "on")
            .prefetch(self.prefetch)
            .prefill(self.prefill())
            .mla_cache(match self.mla_cache.as_str() {
                "expanded" => MlaCache::Expanded,
                _ => MlaCache::Compact,
            })
            .warm(self.warm);
        o.ram_budget = self.ram_budget;
        (o.io, o.direct, o.io_depth) = (self.io, !self.no_direct, self.io_depth);
        if let Some(dir) = &self.cache_dir {
            let mut lazy = LazyOpen::new(dir);
            lazy.disk_quota = self.disk_quota;
            lazy.source_check = self.source_check;
            lazy.source_timeout = std::time::Duration::from_secs(self.source_timeout);
            o = o.lazy(lazy);
        }
        o
    }

    /// How prompts are split into forward passes.
    pub fn prefill(&self) -> PrefillChunk {
        match (self.prefill_chunk, self.prefill_memory) {
            (Some(n), _) => PrefillChunk::Rows(n),
            (None, Some(memory)) => PrefillChunk::Auto { memory },
            (None, None) => PrefillChunk::default(),
        }
    }

    /// The load options these flags ask for, for the model at `model`.
    pub fn load_options(&self, model: &Path) -> LoadOptions {
        self.open_options().load_options(model)
    }
}

/// The model at `path` (a checkpoint folder, a packed store or a
/// config.json) sized as larder-engine sizes it, errors naming `--model`.
/// A model path, or (where no such path exists) a hub repo `org/name[@rev]`
/// or an `http(s)://` base URL, sized from its config.json and shard headers
/// read by range (`HF_ENDPOINT`, `HF_TOKEN` as `larder pull` reads them).
pub fn inspect_model(path: &Path) -> anyhow::Result<larder_engine::sizing::ModelReport> {
    if !path.exists() {
        if let Some(arg) = path.to_str().filter(|a| a.contains('/') && !a.starts_with(['/', '.', '~'])) {
            return inspect_remote(arg);
        }
    }
    larder_engine::sizing::inspect(path).with_context(|| format!("--model {}", path.display()))
}

/// [`inspect_model`] of a remote checkpoint: its small files and shard
/// headers go to a temporary folder, removed afterwards.
fn inspect_remote(arg: &str) -> anyhow::Result<larder_engine::sizing::ModelReport> {
    use larder_store::remote::{open_source, CheckpointSource, HubEnv, RemoteOptions};
    let env = HubEnv::from_process();
    let context = || format!("--model {arg} (a remote checkpoint: its config.json and safetensors headers are read by range)");
    let source = CheckpointSource::parse(arg, &env).with_context(context)?;
    let remote = open_source(&source, &env, &RemoteOptions::default()).with_context(context)?;
    let staging = std::env::temp_dir().join(format!("larder-inspect-{}", std::process::id()));
    let report = larder_engine::sizing::inspect_remote(remote.as_ref(), &staging, arg).with_context(context);
    let _ = std::fs::remove_dir_all(&staging);
    let moved = remote.transferred();
    tracing::debug!(requests = moved.requests, bytes = moved.bytes, "read {arg}'s headers");
    report
}

/// Loads a checkpoint folder or packed store, with the folder named in any error.
pub fn load_engine(model: &Path, experts: &ExpertArgs) -> anyhow::Result<Engine> {
    load_engine_with(model, experts, false)
}

/// [`load_engine`], its progress shown as JSON lines when `json` (the
/// command's --json): larder_engine::open with these flags, its notes printed.
pub fn load_engine_with(model: &Path, experts: &ExpertArgs, json: bool) -> anyhow::Result<Engine> {
    let opts = experts.open_options();
    let started = std::time::Instant::now();
    let load = std::sync::Arc::new(progress::Progress::new("load", 0, progress::Unit::Bytes, json));
    let fetch = progress::FetchProgress::new(json);
    let progress = OpenProgress {
        load: Some(load.hook()),
        fetch: experts.cache_dir.as_ref().map(|_| fetch.events()),
        notes: Some(Box::new(|note: &Note| match note {
            Note::Warning(w) => eprintln!("warning: {w}"),
            Note::Info(i) => tracing::info!("{i}"),
            _ => {}
        })),
    };
    let opened = larder_engine::open::open(model, &opts, progress);
    load.finish();
    let what = if experts.cache_dir.is_some() {
        "cannot load lazily"
    } else {
        "cannot load the model"
    };
    let engine = about(opened, what, model)?.engine;
    match (&experts.cache_dir, engine.store()) {
        (Some(dir), _) => lazy::loaded(&engine, model, dir, experts, started),
        (None, Some(store)) => tracing::info!(
            "loaded {} in {:.2}s; experts streamed via {} (direct={}) through a {} cache",
            model.display(),
            started.elapsed().as_secs_f64(),
            store.backend().name(),
            store.backend().is_direct(),
            format_size(store.cache().budget())
        ),
        (None, None) => tracing::info!("loaded {} in {:.2}s", model.display(), started.elapsed().as_secs_f64()),
    }
    Ok(engine)
}

/// Loads `model` with `opts` (budget already checked), showing progress and
/// naming the model once in any error (benchmarks that set their own options).
pub fn load_with_options(model: &Path, opts: &LoadOptions, json: bool) -> anyhow::Result<Engine> {
    let progress = std::sync::Arc::new(progress::Progress::new("load", 0, progress::Unit::Bytes, json));
    let loaded = Engine::load_with_progress(model, opts, progress.hook());
    progress.finish();
    about(loaded, "cannot load the model", model)
}

/// `r` with `what` as context, naming `path` unless the error already names
/// it or a file inside it (the path is said once; most errors name the file at
/// fault already).
pub fn about<T, E: Into<anyhow::Error>>(r: Result<T, E>, what: &str, path: &Path) -> anyhow::Result<T> {
    r.map_err(|e| {
        let e: anyhow::Error = e.into();
        let named = e.to_string().contains(&path.display().to_string());
        let what = if named {
            what.to_string()
        } else {
            format!("{what} {}", path.display())
        };
        e.context(what)
    })
}

/// An error and its causes on one line, each said once: a cause whose text
/// the line already holds is skipped (library errors carry their source in
/// their own message too), and a cause starting with a path the line already
/// names drops that path.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let msg = cause.to_string();
        let msg = match msg.split_once(": ") {
            Some((head, rest)) if head.contains('/') && text.contains(head) => rest.to_string(),
            _ => msg,
        };
        if msg.is_empty() || text.contains(&msg) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&msg);
    }
    text
}

/// Refuses a streaming RAM budget that cannot hold one expert record of
/// `model` (0, no cache, is accepted), before anything heavy is loaded.
pub fn check_budget(model: &Path, opts: &LoadOptions) -> anyhow::Result<()> {
    larder_engine::open::check_budget(model, opts).with_context(|| format!("model {}", model.display()))
}

/// Checks a benchmark's `--out FILE`, when given, before any work: where a
/// report of `kind` may be written ([`OutputFile::check`]).
pub fn check_report_out(
    out: Option<&Path>,
    kind: ReportKind,
    overwrite: OverwriteArg,
    inputs: &RunInputs,
) -> anyhow::Result<Option<OutputFile>> {
    let check = |path| OutputFile::check("--out", path, OutputKind::Report(kind), overwrite.overwrite, inputs);
    Ok(out.map(check).transpose()?)
}

/// Writes a JSON report to `--out FILE`, when given (benchmarks), checked
/// before the run ([`check_report_out`]).
pub fn save_json(out: Option<&mut OutputFile>, doc: &serde_json::Value) -> anyhow::Result<()> {
    if let Some(out) = out {
        out.write_with(|w| Ok(serde_json::to_writer_pretty(w, doc)?))?;
    }
    Ok(())
}

/// Prints one JSON document on stdout.
pub fn print_json(value: &serde_json::Value) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A library error whose message holds its source, as thiserror's `"{path}: {source}"` does.
    #[derive(Debug)]
    struct Wrapped(std::io::Error);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "/m/config.json: {}", self.0)
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    fn missing() -> Wrapped {
        Wrapped(std::io::Error::new(std::io::ErrorKind::NotFound, "No such file (os error 2)"))
    }

    #[test]
    fn error_text_says_each_cause_once() {
        let e = anyhow::Error::from(missing()).context("cannot load the model");
        assert_eq!(error_text(&e), "cannot load the model: /m/config.json: No such file (os error 2)");
        let e = anyhow::Error::from(missing()).context("cannot load /m");
        assert_eq!(error_text(&e), "cannot load /m: /m/config.json: No such file (os error 2)");
        let e = anyhow::anyhow!("/m/x: bad").context("cannot load /m/x");
        assert_eq!(error_text(&e), "cannot load /m/x: bad");
    }

    #[test]
    fn about_names_the_path_once() {
        let r: Result<(), Wrapped> = Err(missing());
        let e = about(r, "cannot read the checkpoint", Path::new("/m")).unwrap_err();
        assert_eq!(
            error_text(&e),
            "cannot read the checkpoint: /m/config.json: No such file (os error 2)"
        );
        let r: Result<(), std::io::Error> = Err(std::io::Error::other("gone"));
        let e = about(r, "cannot read the checkpoint", Path::new("/m")).unwrap_err();
        assert_eq!(error_text(&e), "cannot read the checkpoint /m: gone");
    }
}
