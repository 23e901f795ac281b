//! `larder plan`: what a model will do on a machine, before buying drives.
//! The flags become a `larder_engine::planner::PlanInput` (machine figures
//! measured here or given, a trace or a routing preset); the planner
//! forecasts decode tok/s, time to first token per prompt length, the hit
//! rate, bytes read per token and the binding resource; this prints it.

use std::path::PathBuf;

use anyhow::{bail, Context};
use larder_engine::plan::ModelSizes;
use larder_engine::planner::{plan_model, MachinePlan, PlanInput, PlanOutput, Routing};
use larder_router::Trace;
use larder_store::cache::PolicyKind;
use larder_store::{format_size, parse_size};
use serde_json::json;

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
    let spec = larder_model::arch::read_spec(&report.folder).with_context(|| format!("--model {}", a.model.display()))?;
    let ram = match &a.ram {
        Some(s) => parse_size(s).map_err(|e| anyhow::anyhow!("--ram {s:?}: {e}"))?,
        None => larder_engine::prefill::mem_available().context("--ram: cannot read MemAvailable here; give --ram")?,
    };
    let drives = a
        .drive
        .iter()
        .map(|d| parse_drive(d))
        .collect::<anyhow::Result<Vec<Vec<f64>>>>()?
        .concat();
    let cores = a
        .cores
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let digest_gbps = match a.digest_gbps {
        Some(g) => positive("--digest-gbps", g)?,
        None => larder_store::digest::check_gbps(64 << 20),
    };
    let ram_gbps = match a.ram_gbps {
        Some(g) => positive("--ram-gbps", g)?,
        None => larder_tensor::bench::ram_read_gbps(256 << 20),
    };
    let mut machine = MachinePlan::new(ram, drives.clone(), cores, ram_gbps, digest_gbps);
    let expert_format = larder_engine::planner::expert_format(&spec);
    (machine.spine_kernel_gbps, machine.expert_kernel_gbps, machine.prefill_kernel_gbps) = kernel_speeds(&a, ram_gbps, expert_format)?;
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
        x => x.unwrap_or(larder_engine::forecast::CPU_OVERHEAD),
    };
    input.ram_budget = a
        .ram_budget
        .as_deref()
        .map(|s| parse_size(s).map_err(|e| anyhow::anyhow!("--ram-budget {s:?}: {e}")))
        .transpose()?;
    input.prompt_lens = a.prompt_lens.clone();
    let p = plan_model(&input).with_context(|| format!("--model {}", a.model.display()))?;
    let (f, sizes) = (&p.forecast, &input.model.sizes);
    let ttft: serde_json::Map<String, serde_json::Value> = f.ttft_s.iter().map(|(n, s)| (n.to_string(), json!(s))).collect();
    let routing = if a.trace.is_some() {
        "trace".to_string()
    } else {
        a.routing.clone()
    };
    let doc = json!({
        "model": a.model,
        "decode_tok_per_s": f.decode_tok_per_s,
        "ttft_s": ttft,
        "hit_rate": f.hit_rate,
        "bytes_per_token": f.bytes_per_token,
        "binding": f.binding,
        "ram_budget": p.ram_budget,
        "bank_bytes": sizes.bank_bytes,
        "spine_bytes": sizes.spine_bytes,
        "policy": PolicyKind::default().name(),
        "routing": routing,
        "recall": p.recall,
        "prefetch": !a.no_prefetch,
        "io": a.io,
        "demand_bytes_per_token": p.demand_bytes_per_token,
        "prefetch_bytes_per_token": p.prefetch_bytes_per_token,
        "prefetch_used_per_token": p.prefetch_used_per_token,
        "bytes_per_token_simulated": p.bytes_per_token_simulated,
        "cpu_overhead": input.cpu_overhead,
        "seconds_per_token": {"disk": f.disk_s_per_token, "ram": f.ram_s_per_token, "compute": f.compute_s_per_token,
                              "digest": f.digest_s_per_token, "wait": f.wait_s_per_token},
        "machine": {"ram": ram, "drives_gbps": drives, "cores": cores, "ram_gbps_per_core": ram_gbps,
                    "spine_kernel_gbps_per_core": input.machine.spine_kernel_gbps,
                    "expert_kernel_gbps_per_core": input.machine.expert_kernel_gbps,
                    "expert_format": p.expert_format, "prefill_kernel_gbps_per_core": input.machine.prefill_kernel_gbps,
                    "digest_gbps_per_core": digest_gbps},
    });
    if a.json {
        return super::print_json(&doc);
    }
    print_plan(&a, sizes, &p, &routing);
    Ok(())
}

/// The readable plan.
fn print_plan(a: &Args, sizes: &ModelSizes, p: &PlanOutput, routing: &str) {
    let f = &p.forecast;
    println!(
        "{}: spine {}, bank {} ({} MoE layers x {} experts, top-{}, {} each)",
        a.model.display(),
        format_size(sizes.spine_bytes),
        format_size(sizes.bank_bytes),
        sizes.moe_layers,
        sizes.experts_per_layer,
        sizes.top_k,
        format_size(sizes.expert_bytes)
    );
    println!(
        "cache {} ({:.0}% of the bank), policy {}: hit rate {:.1}% ({routing}); reads {} per token",
        format_size(p.ram_budget),
        100.0 * p.ram_budget as f64 / sizes.bank_bytes as f64,
        PolicyKind::default().name(),
        100.0 * f.hit_rate,
        format_size(f.bytes_per_token as u64)
    );
    println!(
        "decode: {:.2} tok/s, bound by {} (per token: disk {:.3} s, RAM {:.3} s, compute {:.3} s, digests {:.3} s, \
         waiting for reads {:.3} s; prefetch {}, recall {:.0}%)",
        f.decode_tok_per_s,
        f.binding,
        f.disk_s_per_token,
        f.ram_s_per_token,
        f.compute_s_per_token,
        f.digest_s_per_token,
        f.wait_s_per_token,
        if a.no_prefetch { "off" } else { "on" },
        100.0 * p.recall
    );
    for (n, s) in &f.ttft_s {
        println!("time to first token, {n}-token prompt: {s:.1} s");
    }
}

/// `1.8` or `7x4` (four drives of 7 GB/s).
fn parse_drive(s: &str) -> anyhow::Result<Vec<f64>> {
    let (gbps, n) = match s.split_once(['x', 'X']) {
        Some((g, n)) => (g, n.trim().parse::<usize>().ok().filter(|n| (1..=64).contains(n))),
        None => (s, Some(1)),
    };
    let n = n.with_context(|| format!("--drive {s:?}: the count after x must be 1 to 64"))?;
    let g: f64 = gbps
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("--drive {s:?}: not a GB/s figure (say 7 or 7x4)"))?;
    Ok(vec![positive("--drive", g)?; n])
}

fn positive(flag: &str, v: f64) -> anyhow::Result<f64> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        bail!("{flag} {v}: must be a number above 0")
    }
}

/// One-core kernel weight GB/s: the spine's (bf16) and the experts' at one
/// row, and the experts' per row at many rows (prefill).
fn kernel_speeds(a: &Args, ram_gbps: f64, experts: &str) -> anyhow::Result<(f64, f64, f64)> {
    if let Some(g) = a.kernel_gbps {
        let g = positive("--kernel-gbps", g)?;
        return Ok((g, g, g * 8.0));
    }
    let Some(path) = &a.kernels else {
        return Ok((ram_gbps, ram_gbps, ram_gbps * 8.0));
    };
    let text = std::fs::read_to_string(path).with_context(|| format!("--kernels {}", path.display()))?;
    let doc: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("--kernels {}: not `larder bench kernels` JSON", path.display()))?;
    let results = doc["results"]
        .as_array()
        .with_context(|| format!("--kernels {}: no \"results\"", path.display()))?;
    let threads = doc["threads"].as_f64().unwrap_or(1.0).max(1.0);
    let of = |dtype: &str| {
        let cold = results
            .iter()
            .filter(|r| r["cold"].as_bool() == Some(true) && r["dtype"].as_str() == Some(dtype));
        let rows = |r: &serde_json::Value| r["rows"].as_f64().unwrap_or(0.0);
        let one = cold
            .clone()
            .filter(|r| rows(r) == 1.0)
            .filter_map(|r| r["gbps"].as_f64())
            .fold(f64::NAN, f64::min);
        let many = cold.filter_map(|r| Some(r["gbps"].as_f64()? * rows(r))).fold(f64::NAN, f64::max);
        (one, many)
    };
    let ((spine, _), (expert, prefill)) = (of("bf16"), of(experts));
    if !spine.is_finite() || !expert.is_finite() || !prefill.is_finite() {
        bail!(
            "--kernels {}: needs cold one-row results for bf16 (the spine) and {experts} (the experts); run \
             `larder bench kernels --formats bf16,{experts} --rows 1,256 --out FILE`",
            path.display()
        );
    }
    Ok((spine / threads, expert / threads, prefill / threads))
}
