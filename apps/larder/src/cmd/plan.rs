//! `larder plan`: what a model will do on a machine, before buying drives.
//! From the model's shapes (a config.json alone is enough), a route trace or
//! a routing preset replayed through the cache simulator at the planned
//! budget, and drive, RAM and kernel speeds (measured here or given), it
//! forecasts decode tok/s, time to first token per prompt length, the hit
//! rate, bytes read per token and the binding resource
//! (`larder_engine::forecast`; docs/plan.md).

use std::path::PathBuf;

use anyhow::{bail, Context};
use larder_engine::forecast::{self, forecast, uniform_union_share, ForecastInput, LayerReads};
use larder_engine::plan::{headroom, ModelSizes};
use larder_router::{Phase, RoutingModel, Trace, TraceHeader, TRACE_VERSION};
use larder_store::cache::prefetch_sim::{simulate_prefetch, DecodeStep, LayerAccess, PrefetchLayer, PrefetchResult, PrefetchRule};
use larder_store::cache::PolicyKind;
use larder_store::{format_size, parse_size};
use serde_json::json;

/// Router lookahead recall assumed for routing presets: published figures for
/// real MoE models put next-layer lookahead at about 70%.
pub const PRESET_RECALL: f64 = 0.7;

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
    let report = super::doctor::model::inspect(&a.model)?;
    let sizes = report.sizes.clone();
    if sizes.moe_layers == 0 || sizes.expert_bytes == 0 {
        bail!("--model {}: has no routed experts to plan streaming for", a.model.display());
    }
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
    let longest = a.prompt_lens.iter().copied().max().unwrap_or(0) as u64;
    let kv = longest.saturating_mul(report.kv_bytes_per_token as u64);
    let usable = ram.saturating_sub(headroom(ram)).saturating_sub(kv);
    let least = sizes.spine_bytes.saturating_add(sizes.min_cache_bytes());
    if least > usable {
        bail!(
            "--ram {}: too small: the spine ({}), one layer step's experts ({}), the KV cache of a {longest}-token \
             prompt ({}) and headroom ({}) need {}; give more --ram or shorter --prompt-lens",
            format_size(ram),
            format_size(sizes.spine_bytes),
            format_size(sizes.min_cache_bytes()),
            format_size(kv),
            format_size(headroom(ram)),
            format_size(least + kv + headroom(ram))
        );
    }
    let budget = match &a.ram_budget {
        Some(s) => {
            let b = parse_size(s).map_err(|e| anyhow::anyhow!("--ram-budget {s:?}: {e}"))?;
            if b > usable - sizes.spine_bytes {
                bail!(
                    "--ram-budget {s}: more than the {} left of --ram {} after the spine, KV cache and headroom",
                    format_size(usable - sizes.spine_bytes),
                    format_size(ram)
                );
            }
            b
        }
        None => (usable - sizes.spine_bytes).min(sizes.bank_bytes),
    };
    let trace = match &a.trace {
        Some(path) => Trace::read(path)?,
        None => {
            let model = RoutingModel::preset(&a.routing, sizes.experts_per_layer).map_err(|e| anyhow::anyhow!("--routing: {e}"))?;
            model
                .trace(header(&sizes), a.tokens, 1)
                .map_err(|e| anyhow::anyhow!("--routing {} (--tokens {}): {e}", a.routing, a.tokens))?
        }
    };
    check_shape(&trace, &sizes, &a)?;
    let recall = match a.recall {
        Some(r) if !(0.0..=1.0).contains(&r) => bail!("--recall {r}: a share from 0 to 1"),
        r => r.unwrap_or(PRESET_RECALL),
    };
    let trace = larder_router::with_predictions(trace, recall, 1);
    let recall = trace
        .route_stats(Some(Phase::Decode))
        .lookahead_recall
        .first()
        .map_or(recall, |r| r.1);
    let cpu_overhead = match a.cpu_overhead {
        Some(x) if !(x.is_finite() && x >= 0.0) => bail!("--cpu-overhead {x}: a share of 0 or more"),
        x => x.unwrap_or(larder_engine::forecast::CPU_OVERHEAD),
    };
    let digest_gbps = match a.digest_gbps {
        Some(g) => positive("--digest-gbps", g)?,
        None => larder_store::digest::check_gbps(64 << 20),
    };
    let ram_gbps = match a.ram_gbps {
        Some(g) => positive("--ram-gbps", g)?,
        None => larder_tensor::bench::ram_read_gbps(256 << 20),
    };
    let spec = larder_model::arch::read_spec(&report.folder).with_context(|| format!("--model {}", a.model.display()))?;
    let expert_format = expert_format(&sizes, &spec)?;
    // The embedding table (bf16 in every format larder reads) is read one row per token.
    let embedding_bytes = if spec.tie_word_embeddings {
        0
    } else {
        (spec.vocab_size * spec.hidden_size * 2) as u64
    };
    let (spine_kernel, expert_kernel, prefill_kernel) = kernel_speeds(&a, ram_gbps, expert_format)?;
    let prompts = a.prompt_lens.iter().map(|&n| (n, prompt_union_share(&trace, &sizes, n))).collect();
    let mut input = ForecastInput {
        sizes: sizes.clone(),
        embedding_bytes,
        ram_budget: budget,
        hit_rate: 0.0,
        reads: Vec::new(),
        drives_gbps: drives.clone(),
        ram_gbps: ram_gbps * cores as f64,
        spine_kernel_gbps: spine_kernel * cores as f64,
        expert_kernel_gbps: expert_kernel * cores as f64,
        prefill_kernel_gbps: prefill_kernel * cores as f64,
        cpu_overhead,
        digest_gbps: Some(digest_gbps),
        cores,
        prefetch_threads: a.prefetch_threads,
        demand_share: if a.io == "pread" {
            forecast::PREAD_DEMAND_SHARE
        } else {
            forecast::URING_DEMAND_SHARE
        },
        prompts,
    };
    let limit = forecast::background_reads_per_layer(&input);
    let reads = decode_reads(&trace, budget, !a.no_prefetch, limit);
    input.hit_rate = reads.hit_rate();
    input.reads = per_token_reads(&reads);
    let f = forecast(&input);
    let per_token = |bytes: fn(&PrefetchLayer) -> u64| reads.layers.iter().map(bytes).sum::<u64>() as f64 / reads.tokens.max(1) as f64;
    let ttft: serde_json::Map<String, serde_json::Value> = f.ttft_s.iter().map(|(n, s)| (n.to_string(), json!(s))).collect();
    let doc = json!({
        "model": a.model,
        "decode_tok_per_s": f.decode_tok_per_s,
        "ttft_s": ttft,
        "hit_rate": f.hit_rate,
        "bytes_per_token": f.bytes_per_token,
        "binding": f.binding,
        "ram_budget": budget,
        "bank_bytes": sizes.bank_bytes,
        "spine_bytes": sizes.spine_bytes,
        "policy": PolicyKind::default().name(),
        "routing": if a.trace.is_some() { "trace".to_string() } else { a.routing.clone() },
        "recall": recall,
        "prefetch": !a.no_prefetch,
        "io": a.io,
        "demand_bytes_per_token": per_token(|l| l.demand_bytes),
        "prefetch_bytes_per_token": per_token(|l| l.prefetch_bytes),
        "prefetch_used_per_token": per_token(|l| l.prefetch_used),
        "bytes_per_token_simulated": reads.bytes_per_token(),
        "cpu_overhead": cpu_overhead,
        "seconds_per_token": {"disk": f.disk_s_per_token, "ram": f.ram_s_per_token, "compute": f.compute_s_per_token,
                              "digest": f.digest_s_per_token, "wait": f.wait_s_per_token},
        "machine": {"ram": ram, "drives_gbps": drives, "cores": cores, "ram_gbps_per_core": ram_gbps,
                    "spine_kernel_gbps_per_core": spine_kernel, "expert_kernel_gbps_per_core": expert_kernel,
                    "expert_format": expert_format, "prefill_kernel_gbps_per_core": prefill_kernel,
                    "digest_gbps_per_core": digest_gbps},
    });
    if a.json {
        return super::print_json(&doc);
    }
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
        "cache {} ({:.0}% of the bank), policy {}: hit rate {:.1}% ({}); reads {} per token",
        format_size(budget),
        100.0 * budget as f64 / sizes.bank_bytes as f64,
        PolicyKind::default().name(),
        100.0 * f.hit_rate,
        doc["routing"].as_str().unwrap_or(""),
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
        100.0 * recall
    );
    for (n, s) in &f.ttft_s {
        println!("time to first token, {n}-token prompt: {s:.1} s");
    }
    Ok(())
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

fn header(sizes: &ModelSizes) -> TraceHeader {
    TraceHeader {
        larder_trace: TRACE_VERSION,
        model: "preset".into(),
        experts: sizes.experts_per_layer,
        top_k: sizes.top_k,
        moe_layers: (0..sizes.moe_layers).collect(),
        expert_bytes: vec![sizes.expert_bytes; sizes.moe_layers],
        lookahead: 0,
    }
}

fn check_shape(trace: &Trace, sizes: &ModelSizes, a: &Args) -> anyhow::Result<()> {
    let h = &trace.header;
    if h.experts != sizes.experts_per_layer || h.top_k != sizes.top_k || h.moe_layers.len() != sizes.moe_layers {
        bail!(
            "--trace {}: recorded on {} MoE layers x {} experts, top-{}; --model {} has {} x {}, top-{}",
            a.trace.as_deref().unwrap_or(std::path::Path::new("")).display(),
            h.moe_layers.len(),
            h.experts,
            h.top_k,
            a.model.display(),
            sizes.moe_layers,
            sizes.experts_per_layer,
            sizes.top_k
        );
    }
    if !trace.tokens.iter().any(|t| t.phase == Phase::Decode) {
        bail!("the trace has no decode tokens to forecast decoding from");
    }
    Ok(())
}

/// The default policy over the trace's decode passes, the prompt's passes
/// warming the cache first: what each MoE layer reads on demand and, with
/// `prefetch`, in the background on the recorded depth-1 predictions
/// (`larder_store::cache::prefetch_sim`), at most `per_layer` of them per
/// layer and token.
fn decode_reads(trace: &Trace, budget: u64, prefetch: bool, per_layer: usize) -> PrefetchResult {
    let steps = super::bench_cache::steps(trace);
    let passes = trace.passes();
    let prompt = passes.iter().take_while(|p| p.phase == Phase::Prompt).count();
    let h = &trace.header;
    let decode: Vec<DecodeStep> = passes[prompt..]
        .iter()
        .map(|p| DecodeStep {
            tokens: p.tokens,
            layers: (0..h.moe_layers.len())
                .map(|i| LayerAccess {
                    layer: h.moe_layers[i],
                    bytes: h.expert_bytes[i],
                    demand: p.layers[i].clone(),
                    predicted: if prefetch { p.predicted[i].clone() } else { Vec::new() },
                })
                .collect(),
        })
        .collect();
    let mut policy = PolicyKind::default().build(budget, h.moe_layers.len(), &std::collections::HashMap::new());
    let rule = PrefetchRule {
        per_layer: Some(per_layer),
        ..PrefetchRule::default()
    };
    simulate_prefetch(&steps[..prompt], &decode, budget, policy.as_mut(), rule)
}

/// Per MoE layer, the bytes a decode token reads on demand and in the background.
fn per_token_reads(r: &PrefetchResult) -> Vec<LayerReads> {
    let tokens = r.tokens.max(1) as f64;
    r.layers
        .iter()
        .map(|l| LayerReads {
            demand_bytes: l.demand_bytes as f64 / tokens,
            prefetch_bytes: l.prefetch_bytes as f64 / tokens,
            prefetch_used: l.prefetch_used as f64 / l.prefetch_reads.max(1) as f64,
        })
        .collect()
}

/// The share of each layer's experts the first `n` tokens route to: from the
/// trace while it lasts, else (a longer prompt) as uniform routing would.
/// Sized by the routes, not by the header's expert count.
fn prompt_union_share(trace: &Trace, sizes: &ModelSizes, n: usize) -> f64 {
    if trace.tokens.len() < n {
        return uniform_union_share(sizes.experts_per_layer, sizes.top_k, n);
    }
    let layers = trace.header.moe_layers.len();
    let touched: std::collections::HashSet<(usize, usize)> = trace.tokens[..n]
        .iter()
        .flat_map(|t| {
            t.routes
                .iter()
                .enumerate()
                .flat_map(|(l, experts)| experts.iter().map(move |&e| (l, e)))
        })
        .collect();
    touched.len() as f64 / (layers as f64 * trace.header.experts as f64)
}

/// The routed experts' storage format (`bench kernels`' dtype names), from
/// bytes per weight: bf16 2, fp8 about 1, int4 0.5625 (bf16 scale per 32),
/// mxfp4 0.53125 (one e8m0 byte per 32).
fn expert_format(sizes: &ModelSizes, spec: &larder_model::ModelSpec) -> anyhow::Result<&'static str> {
    let (hidden, inter) = spec
        .layers
        .iter()
        .find_map(|l| match &l.ffn {
            larder_model::config::FfnSpec::Moe(m) => Some((m.latent.unwrap_or(spec.hidden_size), m.expert_intermediate)),
            larder_model::config::FfnSpec::Dense { .. } => None,
        })
        .context("the model has no routed experts")?;
    let per_weight = sizes.expert_bytes as f64 / (3 * hidden * inter).max(1) as f64;
    Ok(match per_weight {
        x if x > 1.5 => "bf16",
        x if x > 0.8 => "fp8",
        x if x > 0.547 => "int4",
        _ => "mxfp4",
    })
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
