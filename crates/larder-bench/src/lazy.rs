//! `larder bench lazy`: decode speed of a lazy model whose source is a
//! throttled link (a loopback server sharing --rate-mbps over all
//! connections), first pass (experts fetched on first use) against second
//! pass (a restart over the same cache: experts read from the drive), with
//! the link's measured rate and the drive's read rate in the same run.

use std::path::PathBuf;
use std::time::Instant;

use larder_engine::lazy::LazyLoad;
use larder_engine::{Engine, GenerateOptions, ReportKind};
use larder_store::lazy::{LazyOptions, SourceCheck};
use larder_store::remote::{open_source, CheckpointSource, FileSource, HubEnv, RemoteOptions};
use larder_store::StoreOptions;
use serde_json::{json, Value};

use crate::{loopback, BenchError, Observer, Result};

/// What `bench lazy --out` writes (`"larder_report": "bench lazy"`).
pub const LAZY_REPORT: ReportKind = ReportKind {
    name: "bench lazy",
    legacy_keys: &["first_pass", "second_pass", "link_mbps_before"],
};

/// One pass: tokens, decode speed and what the lazy store did.
fn pass(load: &LazyLoad, new: usize) -> Result<(Value, Vec<u32>)> {
    let started = Instant::now();
    let engine = Engine::load_lazy(load, None, &|_| {})?;
    let load_s = started.elapsed().as_secs_f64();
    let vocab = engine.model().spec().vocab_size as u32;
    let prompt: Vec<u32> = [3u32, 1, 4, 1, 5, 9, 2, 6].iter().map(|t| t % vocab).collect();
    let opts = GenerateOptions {
        max_new: new,
        stop_at_eos: false,
        ..GenerateOptions::default()
    };
    let g = engine.generate(&prompt, &opts, &mut |_| true)?;
    let c = engine.lazy_counts().ok_or_else(|| BenchError::Failed("not lazy".into()))?;
    let s = &g.stats;
    let doc = json!({
        "load_seconds": load_s,
        "prefill_seconds": s.prefill_s,
        "decode_seconds": s.decode_s,
        "decode_tok_per_s": s.decode_tok_per_s,
        "new_tokens": s.new_tokens,
        "fetched_records": c.fetched_records,
        "fetched_bytes": c.fetched_bytes,
        "fetched_mb_per_s_while_generating": c.fetched_bytes as f64 / (s.prefill_s + s.decode_s) / 1e6,
        "local_reads": c.local_reads,
        "present_records": c.present_records,
        "present_bytes": c.present_bytes,
    });
    Ok((doc, g.ids))
}

/// MB/s of one 64 MiB range of the largest shard through the link.
fn link_mbps(remote: &dyn FileSource) -> Result<f64> {
    let listing = remote.list_files()?;
    let (name, size) = listing
        .files
        .iter()
        .filter(|f| f.name.ends_with(".safetensors"))
        .filter_map(|f| f.size.map(|s| (f.name.clone(), s)))
        .max_by_key(|f| f.1)
        .ok_or_else(|| BenchError::Failed("no safetensors file to measure the link with".into()))?;
    let len = size.min(64 << 20);
    let t = Instant::now();
    let ranges: Vec<(u64, u64)> = (0..8).map(|i| (i * len / 8, len / 8)).collect();
    remote.read_ranges(&name, &ranges, 8)?;
    Ok(len as f64 / t.elapsed().as_secs_f64() / 1e6)
}

/// What `bench lazy` measures.
#[derive(Debug, Clone)]
pub struct LazyBenchOptions {
    /// Checkpoint folder to serve.
    pub model: PathBuf,
    /// Cache folder (must not exist; removed afterwards unless `keep`).
    pub cache: PathBuf,
    /// The link's rate in MB/s (10^6 bytes).
    pub rate_mbps: u64,
    /// Tokens generated per pass.
    pub new: usize,
    /// RAM cache of experts in each pass.
    pub ram_budget: u64,
    /// Keep the cache folder.
    pub keep: bool,
}

/// Refuses a `--cache` that exists (it is removed afterwards).
pub fn check_cache(cache: &std::path::Path) -> Result<()> {
    if cache.exists() {
        return Err(BenchError::Invalid(format!(
            "--cache {} exists; give a folder that does not (it is removed afterwards)",
            cache.display()
        )));
    }
    Ok(())
}

/// The lazy load of `url` into `opts.cache`, fetching on first use.
fn lazy_load(url: &str, env: HubEnv, opts: &LazyBenchOptions) -> LazyLoad {
    LazyLoad {
        source: url.to_string(),
        cache_dir: opts.cache.clone(),
        // What it measures is fetching on first use: the source is not streamed first.
        lazy: LazyOptions {
            check: Some(SourceCheck::FirstFetch),
            ..LazyOptions::default()
        },
        store: StoreOptions {
            ram_budget: opts.ram_budget,
            ..StoreOptions::default()
        },
        remote: RemoteOptions::default(),
        env,
        mla_cache: larder_model::MlaCache::default(),
    }
}

/// Runs `bench lazy`; its JSON document (`"larder_report": "bench lazy"`).
pub fn run(opts: &LazyBenchOptions, observer: &dyn Observer) -> Result<Value> {
    check_cache(&opts.cache)?;
    let rate = opts.rate_mbps as f64 * 1e6;
    let url = loopback::serve_throttled(&opts.model, Some(rate)).map_err(|e| BenchError::io("starting the loopback server", e))?;
    let env = HubEnv::default();
    let remote = open_source(&CheckpointSource::parse(&url, &env)?, &env, &RemoteOptions::default())?;
    let link_before = link_mbps(remote.as_ref())?;
    observer.note(&format!(
        "[larder] link: {link_before:.0} MB/s measured ({} MB/s set), serving {}",
        opts.rate_mbps,
        opts.model.display()
    ));
    let load = lazy_load(&url, env, opts);
    let (first, ids_first) = pass(&load, opts.new)?;
    observer.note(&format!("[larder] first pass: {first}"));
    let (second, ids_second) = pass(&load, opts.new)?;
    observer.note(&format!("[larder] second pass: {second}"));
    if ids_first != ids_second {
        return Err(BenchError::Failed(format!(
            "the passes produced different ids: {ids_first:?} vs {ids_second:?}"
        )));
    }
    let link_after = link_mbps(remote.as_ref())?;
    let drive = larder_store::drive::measure_read_gbps(&opts.cache).unwrap_or(0.0);
    if !opts.keep {
        std::fs::remove_dir_all(&opts.cache).map_err(|e| BenchError::io(format!("removing {}", opts.cache.display()), e))?;
    }
    let tok = |d: &Value| d["decode_tok_per_s"].as_f64().unwrap_or(0.0);
    let doc = json!({
        "larder_report": LAZY_REPORT.name,
        "model": opts.model,
        "rate_mbps_set": opts.rate_mbps,
        "link_mbps_before": link_before,
        "link_mbps_after": link_after,
        "drive_read_gbps_after": drive,
        "ram_budget": opts.ram_budget,
        "first_pass": first,
        "second_pass": second,
        "speedup_second_over_first": tok(&second) / tok(&first).max(1e-12),
        "same_ids": true,
    });
    observer.note(&format!(
        "[larder] decode {:.2} tok/s first pass (fetching at {:.0} MB/s of a {:.0}-{:.0} MB/s link), {:.2} tok/s second pass (drive)",
        tok(&first),
        first["fetched_mb_per_s_while_generating"].as_f64().unwrap_or(0.0),
        link_before.min(link_after),
        link_before.max(link_after),
        tok(&second)
    ));
    Ok(doc)
}
