//! Route traces: `--trace FILE` outputs (checked before any work by
//! [`check_output`]; a recorded run becomes a trace file with [`to_file`],
//! `larder_bench::trace`), and `larder trace synth|stats` (the work is
//! `larder_tools::trace`): here their flags and tables.

use std::path::{Path, PathBuf};

use larder_engine::{OutputFile, OutputKind, RunInputs};
use larder_router::RouteStats;
use larder_tools::trace::{MoeShape, TraceStats, TraceSynthOptions};

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

/// Checks a `--trace FILE` output before any work (`larder_engine::output`:
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
    print_trace_stats(&stats);
    Ok(())
}

/// The header line, both phases' statistics and the hit-rate table.
fn print_trace_stats(stats: &TraceStats) {
    let (trace, all, decode) = (&stats.trace, &stats.all, &stats.decode);
    let h = &trace.header;
    println!(
        "{}: {} tokens ({} decode) in {} passes; {} MoE layers x {} experts, top-{}; lookahead {}",
        stats.path.display(),
        all.tokens,
        decode.tokens,
        trace.passes().len(),
        h.moe_layers.len(),
        h.experts,
        h.top_k,
        h.lookahead
    );
    for (name, s) in [("all tokens", all), ("decode", decode)] {
        print_stats(name, s);
    }
    println!(
        "\ncache hit rate by budget (share of the bank, {}):",
        larder_engine::format_size(trace.bank_bytes())
    );
    println!("  {:>7} {:>8} {:>8}", "budget", "lru", "belady");
    for c in &stats.curves {
        println!(
            "  {:>6.0}% {:>7.1}% {:>7.1}%",
            100.0 * c.share,
            100.0 * c.hit("lru"),
            100.0 * c.hit("belady")
        );
    }
}

fn print_stats(name: &str, s: &RouteStats) {
    println!("\n{name}: {} tokens, {} routes", s.tokens, s.routes);
    let pop: Vec<String> = s
        .popularity
        .iter()
        .map(|(x, y)| format!("hottest {:.0}%: {:.1}%", 100.0 * x, 100.0 * y))
        .collect();
    println!("  popularity (share of routes): {}", pop.join(", "));
    let reuse: Vec<String> = s
        .reuse_distance
        .iter()
        .map(|(b, y)| match b {
            Some(b) => format!("<={b}: {:.1}%", 100.0 * y),
            None => format!("longer: {:.1}%", 100.0 * y),
        })
        .collect();
    println!(
        "  reuse distance (tokens): {}, first use: {:.1}%",
        reuse.join(", "),
        100.0 * s.first_use
    );
    println!("  consecutive-token overlap: {:.3}", s.consecutive_overlap);
    let recall: Vec<String> = s
        .lookahead_recall
        .iter()
        .map(|(d, r)| format!("depth {d}: {:.1}%", 100.0 * r))
        .collect();
    if !recall.is_empty() {
        println!("  router lookahead recall: {}", recall.join(", "));
    }
}
