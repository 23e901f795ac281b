//! Route traces: turning what a run recorded ([`larder_model::RouteTrace`])
//! into a trace file (`--trace FILE` on `run`, `serve` and `bench decode`,
//! checked before any work by [`check_output`]), and
//! `larder trace stats FILE`: popularity, reuse distances, lookahead recall,
//! and the hit rates LRU and Belady's optimum reach at a range of cache
//! budgets (the format: `larder_router::trace`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use larder_engine::{OutputFile, OutputKind, RouteLog, RowTag, RunInputs};
use larder_model::{ModelSpec, RouteTrace};
use larder_router::{Phase, RouteStats, Trace, TraceHeader, TRACE_VERSION};
use serde_json::json;

/// MoE layers ahead whose routers a recorded trace asks on each layer's input.
pub const LOOKAHEAD: usize = 3;

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
    let sizes = super::doctor::model::inspect(&a.model)?.sizes;
    if sizes.moe_layers == 0 || sizes.expert_bytes == 0 {
        bail!("--model {}: has no routed experts", a.model.display());
    }
    let model = larder_router::RoutingModel::preset(&a.routing, sizes.experts_per_layer).map_err(|e| anyhow::anyhow!("--routing: {e}"))?;
    let header = TraceHeader {
        larder_trace: TRACE_VERSION,
        model: format!("{} (preset {})", a.model.display(), a.routing),
        experts: sizes.experts_per_layer,
        top_k: sizes.top_k,
        moe_layers: (0..sizes.moe_layers).collect(),
        expert_bytes: vec![sizes.expert_bytes; sizes.moe_layers],
        lookahead: 0,
    };
    let trace = model
        .trace(header, a.tokens, a.seed)
        .map_err(|e| anyhow::anyhow!("--model {} (--tokens {}): {e}", a.model.display(), a.tokens))?;
    Ok(out.write_with(|w| trace.write_lines(w))?)
}

/// The trace file of one recorded turn: rows `0..prompt_len` are the prompt.
pub fn to_file(rt: &RouteTrace, spec: &ModelSpec, model: &Path, prompt_len: usize, expert_bytes: u64) -> anyhow::Result<Trace> {
    let Some(mut log) = RouteLog::new(spec, &model.display().to_string(), expert_bytes, rt.lookahead) else {
        bail!("--trace: {} has no MoE layers, so there are no routes to record", model.display());
    };
    log.append(rt, |row| RowTag {
        seq: 0,
        pos: row,
        phase: if row < prompt_len { Phase::Prompt } else { Phase::Decode },
    });
    let trace = log.into_trace();
    trace
        .check()
        .map_err(|e| anyhow::anyhow!("internal: the recorded trace is inconsistent: {e}"))?;
    Ok(trace)
}

/// Checks a `--trace FILE` output before any work (`larder_engine::output`:
/// not one of `inputs`, a regular file, an existing trace only with
/// `overwrite`).
pub fn check_output(path: &Path, overwrite: bool, inputs: &RunInputs) -> anyhow::Result<OutputFile> {
    Ok(OutputFile::check("--trace", path, OutputKind::RouteTrace, overwrite, inputs)?)
}

/// Mean bytes of one routed expert of the model at `path` (what one miss reads).
pub fn expert_bytes(path: &Path) -> anyhow::Result<u64> {
    Ok(super::doctor::model::inspect(path)?.sizes.expert_bytes)
}

fn stats(a: StatsArgs) -> anyhow::Result<()> {
    let trace = Trace::read(&a.trace)?;
    let all = trace.route_stats(None);
    let decode = trace.route_stats(Some(Phase::Decode));
    let curves = super::bench_cache::hit_curves(&trace, &super::bench_cache::DEFAULT_SHARES, &["lru", super::bench_cache::BELADY])
        .with_context(|| format!("{}: replaying it", a.trace.display()))?;
    if a.json {
        return super::print_json(&json!({
            "trace": a.trace,
            "header": trace.header,
            "passes": trace.passes().len(),
            "all": all,
            "decode": decode,
            "hit_curves": curves,
        }));
    }
    let h = &trace.header;
    println!(
        "{}: {} tokens ({} decode) in {} passes; {} MoE layers x {} experts, top-{}; lookahead {}",
        a.trace.display(),
        all.tokens,
        decode.tokens,
        trace.passes().len(),
        h.moe_layers.len(),
        h.experts,
        h.top_k,
        h.lookahead
    );
    for (name, s) in [("all tokens", &all), ("decode", &decode)] {
        print_stats(name, s);
    }
    println!(
        "\ncache hit rate by budget (share of the bank, {}):",
        larder_engine::format_size(trace.bank_bytes())
    );
    println!("  {:>7} {:>8} {:>8}", "budget", "lru", "belady");
    for c in &curves {
        println!(
            "  {:>6.0}% {:>7.1}% {:>7.1}%",
            100.0 * c.share,
            100.0 * c.hit("lru"),
            100.0 * c.hit("belady")
        );
    }
    Ok(())
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
