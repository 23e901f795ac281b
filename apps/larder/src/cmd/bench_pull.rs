//! `larder bench pull`: `larder pull` throughput against the raw range
//! throughput of the same loopback server, measured in the same run
//! (`larder_bench::pull`); here its flags and output.

use std::path::PathBuf;

use larder_bench::pull::{PullBenchOptions, PULL_REPORT};
use larder_engine::RunInputs;

use super::progress::Shown;

/// Arguments of `larder bench pull`.
#[derive(clap::Args)]
#[command(
    after_help = "Serves --model on a loopback HTTP server (byte ranges, keep-alive) and measures: the \
raw range throughput (every shard read in 8 MiB ranges, --jobs at once, bytes dropped), then `larder pull` \
of the same URL into --store (streaming: each shard once, hashed, scattered into records and spine; then \
sealing: every record digested and read back), then the raw throughput again. The ratio is pull's streaming \
rate over the mean raw rate. Pick a checkpoint that fits in RAM twice (the server reads through the page \
cache).\n\nExample:\n  larder bench pull --model ./k3mini --store /fast/bench-pull --json --out bench/results/pull.json"
)]
pub struct PullArgs {
    /// Checkpoint folder to serve.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// Store folder to pull into (removed afterwards unless --keep).
    #[arg(long, value_name = "DIR")]
    store: PathBuf,
    /// Files at once and ranges in flight per file (pull), ranges in flight (raw), 1 to 64.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    jobs: u64,
    /// Keep the pulled store.
    #[arg(long)]
    keep: bool,
    /// Print one JSON document on stdout.
    #[arg(long)]
    json: bool,
    /// Also write the JSON document to this file (not in --model or --store; an existing report of `bench pull`
    /// only with --overwrite).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    #[command(flatten)]
    output: super::OverwriteArg,
}

pub fn pull_bench(args: PullArgs) -> anyhow::Result<()> {
    larder_bench::pull::check_store(&args.store)?;
    let inputs = RunInputs::new().model("--model", &args.model).folder("--store", &args.store);
    let mut out = super::check_report_out(args.out.as_deref(), PULL_REPORT, args.output, &inputs)?;
    let opts = PullBenchOptions {
        model: args.model,
        store: args.store,
        jobs: args.jobs as usize,
        keep: args.keep,
    };
    let doc = larder_bench::pull::run(&opts, &Shown { json: args.json })?;
    super::save_json(out.as_mut(), &doc)?;
    if args.json {
        super::print_json(&doc)?;
    }
    Ok(())
}
