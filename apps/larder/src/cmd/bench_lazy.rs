//! `larder bench lazy`: decode speed of a lazy model whose source is a
//! throttled loopback link, first pass (fetching) against second pass (the
//! drive) (`larder_bench::lazy`); here its flags and output.

use std::path::PathBuf;

use larder_bench::lazy::{LazyBenchOptions, LAZY_REPORT};
use larder_engine::RunInputs;

use super::progress::Shown;

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

pub fn lazy_bench(args: LazyArgs) -> anyhow::Result<()> {
    larder_bench::lazy::check_cache(&args.cache)?;
    let inputs = RunInputs::new().model("--model", &args.model).folder("--cache", &args.cache);
    let mut out = super::check_report_out(args.out.as_deref(), LAZY_REPORT, args.output, &inputs)?;
    let opts = LazyBenchOptions {
        model: args.model,
        cache: args.cache,
        rate_mbps: args.rate_mbps,
        new: args.new as usize,
        ram_budget: args.ram_budget,
        keep: args.keep,
    };
    let doc = larder_bench::lazy::run(&opts, &Shown { json: args.json })?;
    super::save_json(out.as_mut(), &doc)?;
    if args.json {
        super::print_json(&doc)?;
    }
    Ok(())
}
