//! `larder bench lazy`: decode speed of a lazy model whose source is a
//! throttled link (a loopback server sharing --rate-mbps over all
//! connections), first pass (experts fetched on first use) against second
//! pass (a restart over the same cache: experts read from the drive), with
//! the link's measured rate and the drive's read rate in the same run.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use larder_engine::lazy::LazyLoad;
use larder_engine::{Engine, GenerateOptions, ReportKind, RunInputs};
use larder_store::lazy::{LazyOptions, SourceCheck};
use larder_store::remote::{open_source, CheckpointSource, FileSource, HubEnv, RemoteOptions};
use larder_store::StoreOptions;
use serde_json::json;

use super::loopback_files;

/// Arguments of `larder bench lazy`.
#[derive(clap::Args)]
#[command(
    after_help = "Serves --model on a loopback HTTP server throttled to --rate-mbps (one link shared by all \
connections) and runs it lazily into --cache: load (small files and spine fetched), then --new greedy tokens \
after a fixed prompt (first pass: every expert fetched the first time it is used), then the same after a restart \
over the same cache (second pass: experts read from the drive; no request to the source). The cache is made with \
--source-check first-fetch (what is measured is fetching on first use). Both passes must \
produce the same ids. The link's rate is measured before and after (one 64 MiB range of the largest shard), and \
the fetched bytes per second of the first pass are given against it.\n\nExample:\n  larder bench lazy --model \
./k3mini-kimi --cache /fast/lazy-bench --rate-mbps 300 --new 16 --json --out bench/results/lazy.json"
)]
pub struct LazyArgs {
    /// Checkpoint folder to serve.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// Cache folder (must not exist; removed afterwards unless --keep).
    #[arg(long, value_name = "DIR")]
    cache: PathBuf,
    /// The link's rate in MB/s (10^6 bytes).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    rate_mbps: u64,
    /// Tokens generated per pass.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=4096))]
    new: u64,
    /// RAM cache of experts in each pass (default: 256MiB, so the second pass reads the drive).
    #[arg(long, value_name = "SIZE", value_parser = larder_store::parse_size, default_value = "256MiB")]
    ram_budget: u64,
    /// Keep the cache folder.
    #[arg(long)]
    keep: bool,
    /// Print one JSON document on stdout.
    #[arg(long)]
    json: bool,
    /// Also write the JSON document to this file (not in --model or --cache; an existing report of `bench lazy`
    /// only with --overwrite).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    #[command(flatten)]
    output: super::OverwriteArg,
}

/// What `bench lazy --out` writes (`"larder_report": "bench lazy"`).
pub const LAZY_REPORT: ReportKind = ReportKind {
    name: "bench lazy",
    legacy_keys: &["first_pass", "second_pass", "link_mbps_before"],
};

/// One pass: tokens, decode speed and what the lazy store did.
fn pass(load: &LazyLoad, new: usize) -> anyhow::Result<(serde_json::Value, Vec<u32>)> {
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
    let c = engine.lazy_counts().context("not lazy")?;
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
fn link_mbps(remote: &dyn FileSource) -> anyhow::Result<f64> {
    let listing = remote.list_files()?;
    let (name, size) = listing
        .files
        .iter()
        .filter(|f| f.name.ends_with(".safetensors"))
        .filter_map(|f| f.size.map(|s| (f.name.clone(), s)))
        .max_by_key(|f| f.1)
        .context("no safetensors file to measure the link with")?;
    let len = size.min(64 << 20);
    let t = Instant::now();
    let ranges: Vec<(u64, u64)> = (0..8).map(|i| (i * len / 8, len / 8)).collect();
    remote.read_ranges(&name, &ranges, 8)?;
    Ok(len as f64 / t.elapsed().as_secs_f64() / 1e6)
}

pub fn lazy_bench(args: LazyArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.cache.exists(),
        "--cache {} exists; give a folder that does not (it is removed afterwards)",
        args.cache.display()
    );
    let inputs = RunInputs::new().model("--model", &args.model).folder("--cache", &args.cache);
    let mut out = super::check_report_out(args.out.as_deref(), LAZY_REPORT, args.output, &inputs)?;
    let rate = args.rate_mbps as f64 * 1e6;
    let url = loopback_files::serve_throttled(&args.model, Some(rate)).context("starting the loopback server")?;
    let env = HubEnv::default();
    let remote = open_source(&CheckpointSource::parse(&url, &env)?, &env, &RemoteOptions::default())?;
    let link_before = link_mbps(remote.as_ref())?;
    eprintln!(
        "[larder] link: {link_before:.0} MB/s measured ({} MB/s set), serving {}",
        args.rate_mbps,
        args.model.display()
    );
    let load = LazyLoad {
        source: url.clone(),
        cache_dir: args.cache.clone(),
        // What it measures is fetching on first use: the source is not streamed first.
        lazy: LazyOptions {
            check: Some(SourceCheck::FirstFetch),
            ..LazyOptions::default()
        },
        store: StoreOptions {
            ram_budget: args.ram_budget,
            ..StoreOptions::default()
        },
        remote: RemoteOptions::default(),
        env,
        mla_cache: larder_model::MlaCache::default(),
    };
    let (first, ids_first) = pass(&load, args.new as usize)?;
    eprintln!("[larder] first pass: {first}");
    let (second, ids_second) = pass(&load, args.new as usize)?;
    eprintln!("[larder] second pass: {second}");
    anyhow::ensure!(
        ids_first == ids_second,
        "the passes produced different ids: {ids_first:?} vs {ids_second:?}"
    );
    let link_after = link_mbps(remote.as_ref())?;
    let drive = larder_store::drive::measure_read_gbps(&args.cache).unwrap_or(0.0);
    if !args.keep {
        std::fs::remove_dir_all(&args.cache).with_context(|| format!("removing {}", args.cache.display()))?;
    }
    let tok = |d: &serde_json::Value| d["decode_tok_per_s"].as_f64().unwrap_or(0.0);
    let doc = json!({
        "larder_report": LAZY_REPORT.name,
        "model": args.model,
        "rate_mbps_set": args.rate_mbps,
        "link_mbps_before": link_before,
        "link_mbps_after": link_after,
        "drive_read_gbps_after": drive,
        "ram_budget": args.ram_budget,
        "first_pass": first,
        "second_pass": second,
        "speedup_second_over_first": tok(&second) / tok(&first).max(1e-12),
        "same_ids": true,
    });
    eprintln!(
        "[larder] decode {:.2} tok/s first pass (fetching at {:.0} MB/s of a {:.0}-{:.0} MB/s link), {:.2} tok/s second pass (drive)",
        tok(&first),
        first["fetched_mb_per_s_while_generating"].as_f64().unwrap_or(0.0),
        link_before.min(link_after),
        link_before.max(link_after),
        tok(&second)
    );
    super::save_json(out.as_mut(), &doc)?;
    if args.json {
        super::print_json(&doc)?;
    }
    Ok(())
}
