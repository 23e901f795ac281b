//! `larder synth`: write a synthetic checkpoint (real layout, random
//! weights, any size) and measure how its routing behaves.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use larder_model::synth::{write, Routing, SynthSpec};
use larder_model::RouteTrace;
use serde_json::json;

/// Arguments of `larder synth`.
#[derive(clap::Args)]
#[command(after_help = "Presets: tiny (hidden 64, 16 experts, top-2) and k3-mini (hidden 2048, expert \
intermediate 1408 in bf16 = 17.3 MB per expert like the Kimi-class target, top-8 of 64). With \
--experts-gib the layer count is chosen to reach that size of routed experts.\n\n\
After writing, a short greedy decode measures the mean share of experts a token shares with the previous \
token (uniform routing: about top_k/experts); skip it with --measure-tokens 0.\n\n\
Examples:\n  larder synth --arch qwen3_moe --preset k3-mini --experts-gib 8 --out ./k3mini\n  \
larder synth --arch deepseek_v3 --preset k3-mini --experts-gib 8 --out ./k3mini-ds")]
pub struct Args {
    /// Architecture: qwen3_moe or deepseek_v3 (MLA, dense first layer, shared expert, grouped sigmoid routing).
    #[arg(long, default_value = "qwen3_moe", value_parser = ["qwen3_moe", "deepseek_v3"])]
    arch: String,
    /// Shape preset: tiny or k3-mini.
    #[arg(long, default_value = "tiny")]
    preset: String,
    /// Total size of routed experts, in GiB (sets the layer count): above 0, at most 65536.
    #[arg(long, value_name = "GIB", value_parser = parse_gib)]
    experts_gib: Option<f64>,
    /// Override the number of layers, 1 to 4096.
    #[arg(long, value_parser = super::range(1, MAX_LAYERS))]
    layers: Option<usize>,
    /// Override the number of routed experts per layer, 1 to 65536.
    #[arg(long, value_parser = super::range(1, MAX_EXPERTS))]
    experts: Option<usize>,
    /// Override the experts chosen per token, 1 to the number of experts.
    #[arg(long, value_parser = super::range(1, MAX_EXPERTS))]
    top_k: Option<usize>,
    /// Override the vocabulary size, 2 to 16777216 (e.g. to make a draft model for another synthetic checkpoint).
    #[arg(long, value_parser = super::range(2, 1 << 24))]
    vocab: Option<usize>,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// uniform: independent uniform routing per token; skewed: Zipf-like popularity plus temporal locality.
    #[arg(long, default_value = "uniform", value_parser = ["uniform", "skewed"])]
    routing: String,
    /// Tokens of greedy decoding used to measure routing overlap, 0 to 65536 (0: skip).
    #[arg(long, default_value_t = 16, value_parser = super::range(0, 1 << 16))]
    measure_tokens: usize,
    /// Output folder.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Print one JSON report on stdout.
    #[arg(long)]
    json: bool,
}

/// Most layers `--layers` accepts (the largest real models have under 100).
const MAX_LAYERS: usize = 4096;
/// Most routed experts per layer `--experts` accepts.
const MAX_EXPERTS: usize = 1 << 16;

/// `--experts-gib`: a finite size above 0 and at most 64 TiB.
fn parse_gib(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("{s:?} is not a number of GiB"))?;
    if v.is_finite() && v > 0.0 && v <= 65536.0 {
        Ok(v)
    } else {
        Err(format!("{s} is out of range: use a size above 0 and at most 65536 GiB"))
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let mut spec = SynthSpec::preset(&args.arch, &args.preset, args.experts_gib).map_err(anyhow::Error::msg)?;
    if let Some(l) = args.layers {
        spec.layers = l;
    }
    if let Some(e) = args.experts {
        spec.experts = e;
    }
    if let Some(k) = args.top_k {
        spec.top_k = k;
    }
    if let Some(v) = args.vocab {
        spec.vocab = v;
    }
    anyhow::ensure!(
        spec.top_k >= 1 && spec.top_k <= spec.experts,
        "--top-k must be between 1 and the number of experts ({})",
        spec.experts
    );
    spec.seed = args.seed;
    spec.routing = if args.routing == "skewed" {
        Routing::Skewed
    } else {
        Routing::Uniform
    };
    if args.out.join("config.json").exists() {
        anyhow::bail!(
            "{} already holds a checkpoint (config.json); choose another --out",
            args.out.display()
        );
    }
    let started = Instant::now();
    let total = spec.total_expert_bytes();
    let bar = super::progress_bar(total, "writing [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}");
    let files = write(&spec, &args.out, &mut |b| bar.inc(b)).with_context(|| format!("cannot write {}", args.out.display()))?;
    bar.finish_and_clear();
    let written: u64 = files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
    let write_s = started.elapsed().as_secs_f64();

    let overlap = if args.measure_tokens > 1 {
        Some(measure_overlap(&args.out, args.measure_tokens, spec.seed)?)
    } else {
        None
    };
    let expected = spec.top_k as f64 / spec.experts as f64;
    let report = json!({
        "out": args.out,
        "spec": spec,
        "files": files.len(),
        "bytes": written,
        "expert_bytes": total,
        "expert_record_bytes": spec.expert_bytes(),
        "seconds": write_s,
        "routing_overlap": overlap.as_ref().map(|(mean, per_layer)| json!({
            "mean": mean,
            "expected_uniform": expected,
            "tokens": args.measure_tokens,
            "per_layer": per_layer.iter().map(|(l, v)| json!({"layer": l, "overlap": v})).collect::<Vec<_>>(),
        })),
    });
    if args.json {
        return super::print_json(&report);
    }
    eprintln!(
        "[larder] wrote {} ({} layers x {} experts, {} of experts) in {:.1}s",
        args.out.display(),
        spec.layers,
        spec.experts,
        larder_store::format_size(total),
        write_s
    );
    if let Some((mean, _)) = overlap {
        eprintln!("[larder] consecutive-token expert overlap {mean:.3} (uniform routing expects {expected:.3})");
    }
    Ok(())
}

/// Greedy decoding from a seeded first token, recording routes.
fn measure_overlap(dir: &std::path::Path, tokens: usize, seed: u64) -> anyhow::Result<(f64, Vec<(usize, f64)>)> {
    let model = larder_model::load_model(dir, None)?;
    let mut cache = model.new_cache();
    let mut trace = RouteTrace::default();
    let mut tok = (seed % model.spec().vocab_size as u64) as u32 + 1;
    for _ in 0..tokens {
        let logits = model.forward_last(&[tok], &mut cache, Some(&mut trace))?;
        tok = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i as u32)
            .unwrap_or(0);
    }
    Ok(trace.consecutive_overlap())
}
