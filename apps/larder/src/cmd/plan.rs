//! `larder plan`: what a model will do on a machine, before buying drives.
//! The flags become a `larder_engine::planner::PlanInput` (machine figures
//! measured here or given, a trace or a routing preset); the planner
//! forecasts decode tok/s, time to first token per prompt length, the hit
//! rate, bytes read per token and the binding resource; this prints it
//! (`larder_tools::plan`: drive figures, kernel speeds, the document and text).

use std::path::PathBuf;

use anyhow::{bail, Context};
use larder_engine::planner::{plan_model, MachinePlan, PlanInput, Routing};
use larder_router::Trace;
use larder_store::parse_size;
use larder_tools::plan::{kernel_speeds, parse_drive, positive};

/// Arguments of `larder plan`.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  larder plan --model ./k3/config.json --ram 128GB --drive 7x4 --routing skewed\n  larder plan --model ./store --drive 1.8 --trace run.trace --json"
)]
pub struct Args {
    /// The model: a config.json, a checkpoint folder or a packed store.
    #[arg(long, value_name = "PATH")]
    model: PathBuf,
    /// RAM of the machine planned for (default: the RAM available here now).
    #[arg(long, value_name = "SIZE")]
    ram: Option<String>,
    /// Expert cache budget (default: the RAM minus the spine, the KV cache of the longest prompt, and headroom).
    #[arg(long, value_name = "SIZE")]
    ram_budget: Option<String>,
    /// A drive's read GB/s for expert-sized reads, optionally xN for N such drives (`7x4`); repeatable.
    /// Measure one with `larder bench io`.
    #[arg(long, value_name = "GBPS[xN]", required = true)]
    drive: Vec<String>,
    /// A route trace recorded with `--trace` (its hit rates, recall and prompt unions are used).
    #[arg(long, value_name = "FILE", conflicts_with = "routing")]
    trace: Option<PathBuf>,
    /// Without --trace: a routing preset (uniform, local, skewed, mixed; docs/routing.md).
    #[arg(long, value_name = "PRESET", default_value = "uniform")]
    routing: String,
    /// Router lookahead recall for prefetch where the trace recorded no predictions (presets, traces
    /// without lookahead): predictions are drawn with this recall (default 0.7).
    #[arg(long, value_name = "X")]
    recall: Option<f64>,
    /// Forecast without prefetch.
    #[arg(long)]
    no_prefetch: bool,
    /// The I/O backend planned for: uring (demand reads go first) or pread (they share the drive with
    /// background reads).
    #[arg(long, value_name = "BACKEND", default_value = "uring", value_parser = ["uring", "pread"])]
    io: String,
    /// Background read threads, as `run --prefetch N` gives them.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = super::range(1, 64))]
    prefetch_threads: usize,
    /// CPU work between a decode step's matrix products, as a share of theirs (default 0.15, measured
    /// on this project's VM; measure yours as in-RAM `larder bench decode` time over the plan's compute).
    #[arg(long, value_name = "X", allow_hyphen_values = true)]
    cpu_overhead: Option<f64>,
    /// GB/s one core checks record digests at (default: measured here).
    #[arg(long, value_name = "GBPS")]
    digest_gbps: Option<f64>,
    /// Cores (default: this machine's).
    #[arg(long, value_parser = super::range(1, super::MAX_THREADS))]
    cores: Option<usize>,
    /// RAM read GB/s of one core (default: measured here).
    #[arg(long, value_name = "GBPS")]
    ram_gbps: Option<f64>,
    /// `larder bench kernels --out FILE` JSON: one-row (decode) and many-row (prefill) kernel speeds of the
    /// experts' format.
    #[arg(long, value_name = "FILE")]
    kernels: Option<PathBuf>,
    /// One-row kernel weight GB/s of one core (overrides --kernels; default without either: the RAM speed).
    #[arg(long, value_name = "GBPS")]
    kernel_gbps: Option<f64>,
    /// Prompt lengths to forecast TTFT for.
    #[arg(long, value_delimiter = ',', default_value = "512,2048,8192", value_parser = super::range(1, super::MAX_COUNT))]
    prompt_lens: Vec<usize>,
    /// Decode tokens drawn from a preset to replay (more: steadier hit rates).
    #[arg(long, default_value_t = 2000, value_parser = super::range(10, super::MAX_COUNT))]
    tokens: usize,
    /// Print one JSON document: {"decode_tok_per_s", "ttft_s": {"LEN": s}, "hit_rate", "bytes_per_token", "binding", ...}.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let report = super::inspect_model(&a.model)?;
    let spec = report.spec.clone();
    let ram = match &a.ram {
        Some(s) => parse_size(s).map_err(|e| anyhow::anyhow!("--ram {s:?}: {e}"))?,
        None => larder_engine::mem_available().context("--ram: cannot read MemAvailable here; give --ram")?,
    };
    let drives = a
        .drive
        .iter()
        .map(|d| parse_drive(d))
        .collect::<Result<Vec<Vec<f64>>, _>>()?
        .concat();
    let cores = a
        .cores
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let digest_gbps = match a.digest_gbps {
        Some(g) => positive("--digest-gbps", g)?,
        None => larder_store::check_gbps(64 << 20),
    };
    let ram_gbps = match a.ram_gbps {
        Some(g) => positive("--ram-gbps", g)?,
        None => larder_tensor::bench::ram_read_gbps(256 << 20),
    };
    let mut machine = MachinePlan::new(ram, drives, cores, ram_gbps, digest_gbps);
    let expert_format = larder_engine::planner::expert_format(&spec);
    (machine.spine_kernel_gbps, machine.expert_kernel_gbps, machine.prefill_kernel_gbps) =
        kernel_speeds(a.kernel_gbps, a.kernels.as_deref(), ram_gbps, expert_format)?;
    let routing = match &a.trace {
        Some(path) => Routing::Trace(Trace::read(path).with_context(|| format!("--trace {}", path.display()))?),
        None => Routing::Preset {
            name: a.routing.clone(),
            tokens: a.tokens,
        },
    };
    let mut input = PlanInput::new(report, spec, machine, routing);
    input.recall = a.recall;
    input.prefetch = !a.no_prefetch;
    input.uring = a.io != "pread";
    input.prefetch_threads = a.prefetch_threads;
    input.cpu_overhead = match a.cpu_overhead {
        Some(x) if !(x.is_finite() && x >= 0.0) => bail!("--cpu-overhead {x}: a share of 0 or more"),
        x => x.unwrap_or(larder_engine::planner::CPU_OVERHEAD),
    };
    input.ram_budget = a
        .ram_budget
        .as_deref()
        .map(|s| parse_size(s).map_err(|e| anyhow::anyhow!("--ram-budget {s:?}: {e}")))
        .transpose()?;
    input.prompt_lens = a.prompt_lens.clone();
    let p = plan_model(&input).with_context(|| format!("--model {}", a.model.display()))?;
    let routing = if a.trace.is_some() {
        "trace".to_string()
    } else {
        a.routing.clone()
    };
    if a.json {
        return super::print_json(&larder_tools::plan::plan_json(&a.model, &input, &p, &routing));
    }
    print!(
        "{}",
        larder_tools::plan::plan_text(&a.model, &input.model, &p, &routing, input.prefetch)
    );
    Ok(())
}
