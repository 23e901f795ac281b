//! Route traces: `--trace FILE` outputs (checked before any work by
//! [`check_output`]; a recorded run becomes a trace file with [`to_file`],
//! `larder_bench::trace`), and `larder trace synth|stats` (the work is
//! `larder_tools::trace`, the tables' text `larder_tools::text`): here their flags.

use std::path::{Path, PathBuf};

use larder_engine::{OutputFile, OutputKind, RunInputs};
use larder_tools::trace::{MoeShape, TraceSynthOptions};

/// MoE layers ahead whose routers a recorded trace asks on each layer's input,
/// and the trace file of one recorded turn.
pub use larder_bench::trace::{to_file, LOOKAHEAD};

/// `larder trace ...`.
#[derive(clap::Subcommand)]
pub enum TraceCmd {
    /// Routing statistics of a trace (from `larder run --trace FILE`): expert popularity, reuse distances,
    /// consecutive-token overlap, router lookahead recall by depth, and LRU / Belady hit rates at cache
    /// budgets of 10-60% of the expert bank.
    Stats(StatsArgs),
    /// Write a decode trace drawn from a routing preset (`larder_router::synthetic`) for a model's MoE shape,
    /// for `bench cache` and `plan` before any weights exist.
    Synth(SynthArgs),
}

/// Arguments of `larder trace synth`.
#[derive(clap::Args)]
pub struct SynthArgs {
    /// The model whose MoE shape to use: a config.json, a checkpoint folder or a packed store.
    #[arg(long, value_name = "PATH")]
    model: PathBuf,
    /// Routing preset: uniform, local, skewed, mixed (docs/routing.md).
    #[arg(long, value_name = "PRESET")]
    routing: String,
    /// Decode tokens to draw.
    #[arg(long, default_value_t = 2000, value_parser = super::range(1, super::MAX_COUNT))]
    tokens: usize,
    /// Seed of the draw.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where to write the trace (not a file of --model's folder; an existing trace only with --overwrite).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    #[command(flatten)]
    output: super::OverwriteArg,
}

/// Arguments of `larder trace stats`.
#[derive(clap::Args)]
pub struct StatsArgs {
    /// The trace file (JSON Lines, written by `--trace`).
    #[arg(value_name = "FILE")]
    trace: PathBuf,
    /// Print one JSON document instead of tables.
    #[arg(long)]
    json: bool,
}

pub fn run(cmd: TraceCmd) -> anyhow::Result<()> {
    match cmd {
        TraceCmd::Stats(a) => stats(a),
        TraceCmd::Synth(a) => synth(a),
    }
}

fn synth(a: SynthArgs) -> anyhow::Result<()> {
    let inputs = RunInputs::new().model("--model", &a.model);
    let mut out = OutputFile::check("--out", &a.out, OutputKind::RouteTrace, a.output.overwrite, &inputs)?;
    let sizes = super::inspect_model(&a.model)?.sizes;
    let opts = TraceSynthOptions {
        model: a.model,
        shape: MoeShape {
            experts_per_layer: sizes.experts_per_layer,
            top_k: sizes.top_k,
            moe_layers: sizes.moe_layers,
            expert_bytes: sizes.expert_bytes,
        },
        routing: a.routing,
        tokens: a.tokens,
        seed: a.seed,
    };
    let trace = larder_tools::trace::synth(&opts)?;
    Ok(out.write_with(|w| trace.write_lines(w))?)
}

/// Checks a `--trace FILE` output before any work (`larder_engine::OutputFile`:
/// not one of `inputs`, a regular file, an existing trace only with
/// `overwrite`).
pub fn check_output(path: &Path, overwrite: bool, inputs: &RunInputs) -> anyhow::Result<OutputFile> {
    Ok(OutputFile::check("--trace", path, OutputKind::RouteTrace, overwrite, inputs)?)
}

/// Mean bytes of one routed expert of the model at `path` (what one miss reads).
pub fn expert_bytes(path: &Path) -> anyhow::Result<u64> {
    Ok(super::inspect_model(path)?.sizes.expert_bytes)
}

fn stats(a: StatsArgs) -> anyhow::Result<()> {
    let stats = larder_tools::trace::stats(&a.trace)?;
    if a.json {
        return super::print_json(&stats.to_json());
    }
    print!("{}", larder_tools::text::trace_stats_text(&stats));
    Ok(())
}
