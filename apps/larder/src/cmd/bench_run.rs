//! `larder bench run MANIFEST`: a named scenario from `bench/manifests/`
//! (`larder_bench::run`: arms, interleaving, oracle check, results.json,
//! summary.md and charts); here its flags, output and exit code.

use std::path::PathBuf;

use anyhow::Context;
use larder_bench::run::RunOptions;

use super::progress::Shown;

/// Arguments of `larder bench run`.
#[derive(clap::Args)]
#[command(after_help = "Manifest keys and outputs: docs/bench.md.\n\nExample:\n  \
larder bench run bench/manifests/k3mini-routing.toml")]
pub struct RunArgs {
    /// Scenario manifest (TOML), e.g. bench/manifests/smoke.toml.
    manifest: PathBuf,
    /// Output folder (default: bench/results/DATE-SCENARIO).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Print results.json on stdout as well.
    #[arg(long)]
    json: bool,
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let opts = RunOptions {
        manifest: args.manifest,
        out: args.out,
        exe: std::env::current_exe().context("cannot find the larder executable")?,
    };
    let report = larder_bench::run::run(&opts, &Shown { json: args.json })?;
    if args.json {
        super::print_json(&report.doc)?;
    }
    match report.failure() {
        Some(failure) => anyhow::bail!(failure),
        None => Ok(()),
    }
}
