//! `larder synth`: write a synthetic checkpoint (real layout, random
//! weights, any size) and measure how its routing behaves; or, with
//! `--from-dense`, upcycle a real dense checkpoint into an MoE whose experts
//! are copies of its MLP (real text from a streamed MoE).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use larder_model::synth::{write, ExpertsFormat, Routing, SynthSpec, ROUTINGS};
use larder_model::upcycle::{upcycle, UpcycleLayout, UpcycleSpec};
use larder_model::RouteTrace;
use serde_json::json;

/// Arguments of `larder synth`.
#[derive(clap::Args)]
#[command(after_help = "Presets: tiny (hidden 64, 16 experts, top-2) and k3-mini (hidden 2048, expert \
intermediate 1408 in bf16 = 17.3 MB per expert like the Kimi-class target, top-8 of 64). With \
--experts-gib the layer count is chosen to reach that size of routed experts (whole MoE layers, plus the \
dense first layer of deepseek_v3 and kimi_linear).\n\n\
kimi_linear (Kimi Linear / K3 layout): KDA layers with MLA every 4th layer (1-based 4, 8, ...: the K3 \
ratio of 3 KDA to 1 MLA), a dense first layer, DeepSeek-style MoE (shared expert, sigmoid routing with \
correction bias, 8 groups of which 4 eligible in k3-mini); k3-mini's attention is Kimi-Linear-48B's scaled \
to hidden 2048 (28 KDA heads x 128, 28 MLA heads, no q LoRA); tiny has 5 layers (KDA x3, MLA, KDA). \
--moe-latent-size N (kimi_linear only) writes K3's latent-space experts: each MoE block gets \
fc1_latent_proj [N, hidden] and fc2_latent_proj [hidden, N] and its routed experts are N wide instead of \
hidden (config.json: moe_latent_size), so expert records shrink by N/hidden.\n\n\
gpt_oss (gpt-oss layout: attention with q/k/v/o biases and per-head sinks, layers alternating sliding-window \
and full attention, YaRN, a biased router, fused experts with biases and gate/up interleaved): presets tiny \
(hidden 64, 16 experts, top-4, 4 layers, window 4), 20b (gpt-oss-20b's shapes: hidden and intermediate 2880, \
24 layers, 32 experts, top-4, 64 heads x 64, 8 KV heads, window 128, vocab 201088) and 120b (36 layers, 128 \
experts); with --experts-gib the layer count is chosen instead, as for k3-mini.\n\n\
--experts-format sets how routed experts are stored (everything else is bf16): bf16; int4 (deepseek_v3, \
kimi_linear: compressed-tensors pack-quantized, as Kimi-K2-Thinking ships: weight_packed i32 [out, in/8], \
weight_scale bf16 [out, in/32], weight_shape i32 [2]); mxfp4 (deepseek_v3, kimi_linear: compressed-tensors \
mxfp4-pack-quantized as the K3 release ships: weight_packed u8 [out, in/2] e2m1, weight_scale u8 e8m0 [out, \
in/32]; gpt_oss: its own MXFP4 *_blocks/*_scales, quant_method mxfp4, the default for gpt_oss). Codes are \
random, scales give the weights the bf16 experts' spread; --experts-gib counts experts at their stored size \
(int4 experts are 3.56x and mxfp4 3.76x smaller than bf16, so the same GiB holds that many times more \
layers).\n\n\
After writing, a short greedy decode measures routing (skip it with --measure-tokens 0): the mean share of \
experts a token shares with the previous token (uniform routing: about top_k/experts), the share of routes in \
the hottest 10% / 30% of experts, reuse within 1 / 2 tokens, router lookahead recall at depths 1-3 and the \
LRU hit rate with 40% of the bank cached (--json: routing_overlap and routing_stats). Use a few hundred \
tokens for stable figures.\n\n\
With --from-dense DIR, a real dense checkpoint (llama or mistral -> mixtral layout, qwen3 -> qwen3_moe) \
is upcycled instead: every routed expert is a byte-for-byte copy of the layer's dense MLP, the router is \
random (seeded by --seed) so routing varies token to token, and the top-k routing weights are renormalised \
to sum to one, so the text equals the dense model's up to f32 rounding. It is a demo and test model for \
streaming real text, not a trained MoE. Every other tensor is copied byte-for-byte in its dtype; the \
tokenizer, chat template and generation config are copied.\n\n\
Examples:\n  larder synth --arch qwen3_moe --preset k3-mini --experts-gib 8 --out ./k3mini\n  \
larder synth --arch deepseek_v3 --preset k3-mini --experts-gib 8 --out ./k3mini-ds\n  \
larder synth --arch kimi_linear --preset k3-mini --experts-gib 8 --out ./k3mini-kimi\n  \
larder synth --arch deepseek_v3 --preset k3-mini --experts-format int4 --experts-gib 8 --out ./k3mini-int4\n  \
larder synth --arch gpt_oss --preset 20b --out ./gpt-oss-20b-like\n  \
larder synth --arch gpt_oss --preset 120b --experts-gib 16 --out ./gpt-oss-120b-like-16g\n  \
larder synth --from-dense ~/.cache/larder/smollm2/checkpoint --experts 8 --top-k 2 --out ./smollm2-moe")]
pub struct Args {
    /// Architecture: qwen3_moe, deepseek_v3 (MLA, dense first layer, shared expert, grouped sigmoid routing),
    /// kimi_linear (deepseek_v3's MoE with KDA layers and MLA every 4th layer) or gpt_oss.
    #[arg(long, default_value = "qwen3_moe", value_parser = larder_model::synth::ARCHITECTURES)]
    arch: String,
    /// Shape preset: tiny or k3-mini; gpt_oss: tiny, 20b or 120b.
    #[arg(long, default_value = "tiny")]
    preset: String,
    /// How routed experts are stored: bf16, int4 (deepseek_v3, kimi_linear: compressed-tensors
    /// pack-quantized) or mxfp4 (deepseek_v3, kimi_linear: compressed-tensors mxfp4-pack-quantized; gpt_oss:
    /// its own MXFP4 blocks and scales). Default: bf16; gpt_oss: mxfp4, as it ships.
    #[arg(long, value_name = "FORMAT", value_parser = ["bf16", "int4", "mxfp4"], conflicts_with = "from_dense")]
    experts_format: Option<String>,
    /// Total size of routed experts, in GiB (sets the layer count): above 0, at most 65536.
    #[arg(long, value_name = "GIB", value_parser = parse_gib, conflicts_with = "from_dense")]
    experts_gib: Option<f64>,
    /// Override the number of layers, 1 to 4096.
    #[arg(long, value_parser = super::range(1, MAX_LAYERS), conflicts_with = "from_dense")]
    layers: Option<usize>,
    /// Routed experts per layer, 1 to 65536 (default: the preset's; 8 with --from-dense).
    #[arg(long, value_parser = super::range(1, MAX_EXPERTS))]
    experts: Option<usize>,
    /// Experts chosen per token, 1 to the number of experts (default: the preset's; 2 with --from-dense).
    #[arg(long, value_parser = super::range(1, MAX_EXPERTS))]
    top_k: Option<usize>,
    /// kimi_linear only: latent-space experts (K3) of this width, 1 to 65536: routed experts run between
    /// fc1_latent_proj / fc2_latent_proj at width N instead of the hidden size (default: none).
    #[arg(long, value_name = "N", value_parser = super::range(1, 1 << 16), conflicts_with = "from_dense")]
    moe_latent_size: Option<usize>,
    /// Override the vocabulary size, 2 to 16777216 (e.g. to make a draft model for another synthetic checkpoint).
    #[arg(long, value_parser = super::range(2, 1 << 24), conflicts_with = "from_dense")]
    vocab: Option<usize>,
    /// Seed of the random weights (with --from-dense: of the random routers).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Routing preset (sets the --routing-* knobs' defaults; docs/synth.md has the calibration): uniform (skew 0,
    /// locality 0, drift 0: independent uniform routing, as GLM- and Qwen3-Next-class models route, but the next
    /// layer's router on this layer's input recalls ~98%); local (locality 0.98, drift 0.3: Qwen3-30B-A3B-like
    /// reuse within two tokens, ~95% LRU hits with 40% of the bank cached); skewed (skew 4, drift 0.5: K3-like
    /// heat, ~85% of routes in the hottest 30% of experts); mixed (skew 4, locality 0.9, drift 0.45: heat,
    /// locality and ~70% next-layer lookahead together, a trained model serving one conversation). local,
    /// skewed and mixed recall ~70% at lookahead depth 1, a few points less per extra layer.
    #[arg(long, default_value = "uniform", value_parser = ROUTINGS, conflicts_with = "from_dense")]
    routing: String,
    /// Popularity skew, 0 to 8: the hottest expert's routing-logit bias in logit stds (expert of rank r of E:
    /// X * exp(-4r/E)). Default: the preset's (uniform, local 0; skewed, mixed 4).
    #[arg(long, value_name = "X", conflicts_with = "from_dense")]
    routing_skew: Option<f64>,
    /// Temporal locality, 0 to 0.99: greedy decoding walks clusters of 16 token ids in order and a token's
    /// routed embedding shares X of its variance with the last round(1/(1-X)) clusters' (higher: consecutive
    /// tokens reuse more experts; near 0.99 the embeddings take longer to write). Default: the preset's
    /// (uniform, skewed 0; mixed 0.9; local 0.98).
    #[arg(long, value_name = "X", conflicts_with = "from_dense")]
    routing_locality: Option<f64>,
    /// Layer-to-layer drift, 0 to 2: how much each layer's post-attention norm weights differ from other
    /// layers' (higher: the next layer's router on this layer's input recalls less). Default: the preset's
    /// (uniform 0; local 0.3; mixed 0.45; skewed 0.5).
    #[arg(long, value_name = "X", conflicts_with = "from_dense")]
    routing_drift: Option<f64>,
    /// Tokens of greedy decoding used to measure routing, 0 to 65536 (0: skip; not with --from-dense):
    /// expert overlap of consecutive tokens, share of routes in the hottest 10% / 30% of experts, reuse
    /// within 1 / 2 tokens, router lookahead recall at depths 1-3, LRU hit rate with 40% of the bank cached.
    #[arg(long, default_value_t = 16, value_parser = super::range(0, 1 << 16), conflicts_with = "from_dense")]
    measure_tokens: usize,
    /// Upcycle this dense Hugging Face checkpoint (llama, mistral or qwen3) into an MoE instead: every expert
    /// is a copy of the dense MLP and the top-k routing weights are renormalised to sum to one, so the text
    /// equals the dense model's up to rounding (a demo/test model, not a trained MoE).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["arch", "preset"])]
    from_dense: Option<PathBuf>,
    /// Layout of the upcycled MoE: mixtral (from llama or mistral) or qwen3_moe (from qwen3). Default: from
    /// the source's model_type.
    #[arg(long, value_parser = ["mixtral", "qwen3_moe"], requires = "from_dense")]
    layout: Option<String>,
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
    if let Some(source) = &args.from_dense {
        return run_upcycle(&args, source);
    }
    let mut spec = SynthSpec::preset(&args.arch, &args.preset, args.experts_gib).map_err(anyhow::Error::msg)?;
    if let Some(n) = args.moe_latent_size {
        anyhow::ensure!(
            spec.kda.is_some(),
            "--moe-latent-size: latent-space experts are a kimi_linear extension (use --arch kimi_linear)"
        );
        spec.moe_latent_size = Some(n);
    }
    if let Some(f) = &args.experts_format {
        let format = ExpertsFormat::parse(f).map_err(anyhow::Error::msg)?;
        spec.set_experts_format(format).map_err(anyhow::Error::msg)?;
    }
    spec.check_packable().map_err(anyhow::Error::msg)?;
    if let Some(gib) = args.experts_gib {
        // Latent or 4-bit experts are smaller: size the bank at their stored size.
        spec.size_experts(gib).map_err(anyhow::Error::msg)?;
    }
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
    check_groups(&spec)?;
    spec.seed = args.seed;
    spec.routing = Routing::parse(&args.routing).map_err(anyhow::Error::msg)?;
    if args.routing_skew.is_some() || args.routing_locality.is_some() || args.routing_drift.is_some() {
        let mut k = spec.routing.knobs();
        k.skew = args.routing_skew.unwrap_or(k.skew);
        k.locality = args.routing_locality.unwrap_or(k.locality);
        k.drift = args.routing_drift.unwrap_or(k.drift);
        k.check().map_err(anyhow::Error::msg)?;
        spec.routing_knobs = Some(k);
    }
    if args.out.join("config.json").exists() {
        anyhow::bail!(
            "{} already holds a checkpoint (config.json); choose another --out",
            args.out.display()
        );
    }
    let bytes = spec.total_bytes().context("cannot plan the synthetic tensors")?;
    let removed = larder_model::synth::remove_leftovers(&args.out)?;
    if !removed.is_empty() {
        tracing::info!(
            "removed {} files an interrupted synth left in {}",
            removed.len(),
            args.out.display()
        );
    }
    check_free_space(&args.out, bytes)?;
    let started = Instant::now();
    let total = spec.total_expert_bytes();
    let bar = bar(bytes, args.json);
    let files = write(&spec, &args.out, &mut |b| bar.inc(b)).with_context(|| format!("cannot write {}", args.out.display()))?;
    bar.finish_and_clear();
    let written: u64 = files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
    let write_s = started.elapsed().as_secs_f64();

    let measured = if args.measure_tokens > 1 {
        Some(measure_routing(&args.out, args.measure_tokens, &spec)?)
    } else {
        None
    };
    let expected = spec.top_k as f64 / spec.experts as f64;
    let report = json!({
        "out": args.out,
        "spec": spec,
        "routing_knobs": spec.knobs(),
        "files": files.len(),
        "bytes": written,
        "expert_bytes": total,
        "expert_record_bytes": spec.expert_bytes(),
        "seconds": write_s,
        "routing_overlap": measured.as_ref().map(|m| json!({
            "mean": m.overlap,
            "expected_uniform": expected,
            "tokens": args.measure_tokens,
            "per_layer": m.per_layer.iter().map(|(l, v)| json!({"layer": l, "overlap": v})).collect::<Vec<_>>(),
        })),
        "routing_stats": measured.as_ref().map(|m| &m.stats),
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
    if let Some(m) = measured {
        let k = spec.knobs();
        let s = &m.stats;
        eprintln!(
            "[larder] routing {} (skew {}, locality {}, drift {}) over {} tokens:",
            args.routing, k.skew, k.locality, k.drift, args.measure_tokens
        );
        eprintln!(
            "[larder]   consecutive-token expert overlap {:.3} (uniform routing expects {expected:.3})",
            m.overlap
        );
        eprintln!(
            "[larder]   routes in the hottest 10% / 30% of experts: {:.1}% / {:.1}%",
            100.0 * s.hot_10,
            100.0 * s.hot_30
        );
        eprintln!(
            "[larder]   routes reusing an expert within 1 / 2 tokens: {:.1}% / {:.1}%",
            100.0 * s.reuse_within_1,
            100.0 * s.reuse_within_2
        );
        let recall: Vec<String> = s
            .lookahead_recall
            .iter()
            .map(|(d, r)| format!("depth {d} {:.1}%", 100.0 * r))
            .collect();
        eprintln!("[larder]   router lookahead recall: {}", recall.join(", "));
        eprintln!("[larder]   LRU hit rate with 40% of the bank cached: {:.1}%", 100.0 * s.lru_hit_40);
    }
    Ok(())
}

/// Refuses before writing when the file system `out` is on has less free
/// space than the checkpoint's `bytes` (plus its small files).
fn check_free_space(out: &std::path::Path, bytes: u64) -> anyhow::Result<()> {
    let Some(dir) = out.ancestors().find(|d| d.is_dir()) else {
        return Ok(());
    };
    let Ok(space) = larder_store::drive::fs_space(dir) else {
        return Ok(());
    };
    let need = bytes + (1 << 20);
    if space.free < need {
        anyhow::bail!(
            "--out {}: the checkpoint needs {}, but only {} is free there; free space, choose another --out, or \
             lower --experts-gib",
            out.display(),
            larder_store::format_size(need),
            larder_store::format_size(space.free)
        );
    }
    Ok(())
}

/// What `--measure-tokens` measured (JSON: `routing_overlap`, `routing_stats`).
struct Measured {
    overlap: f64,
    per_layer: Vec<(usize, f64)>,
    stats: RoutingStats,
}

/// The routing statistics synth reports (`routing_stats` in `--json`), from
/// `larder_router::Trace::route_stats` and the cache simulator.
#[derive(serde::Serialize)]
struct RoutingStats {
    tokens: usize,
    /// Share of routes taken by the hottest 10% / 30% of each layer's experts.
    hot_10: f64,
    hot_30: f64,
    /// Mean share of a token's experts the previous token also chose.
    consecutive_overlap: f64,
    /// Share of routes whose expert the same layer used at most 1 / 2 tokens before.
    reuse_within_1: f64,
    reuse_within_2: f64,
    /// `(depth, recall)`: share of a layer's experts its router picks on the
    /// input of the MoE layer `depth` before it.
    lookahead_recall: Vec<(usize, f64)>,
    /// LRU hit rate with 40% of the expert bank cached (`bench cache`'s simulator).
    lru_hit_40: f64,
}

/// The route-trace statistics of a recorded greedy decode.
fn routing_stats(
    rt: &RouteTrace,
    model: &larder_model::DecoderModel,
    dir: &std::path::Path,
    spec: &SynthSpec,
) -> anyhow::Result<RoutingStats> {
    let trace = super::trace::to_file(rt, model.spec(), dir, 0, spec.expert_bytes() as u64)?;
    let s = trace.route_stats(None);
    let hot = |x: f64| s.popularity.iter().find(|p| (p.0 - x).abs() < 1e-9).map_or(0.0, |p| p.1);
    let within = |n: usize| {
        s.reuse_distance
            .iter()
            .filter(|(ub, _)| ub.is_some_and(|ub| ub <= n))
            .map(|(_, v)| v)
            .sum::<f64>()
    };
    let curves = super::bench_cache::hit_curves(&trace, &[0.4], &["lru"])?;
    Ok(RoutingStats {
        tokens: s.tokens,
        hot_10: hot(0.1),
        hot_30: hot(0.3),
        consecutive_overlap: s.consecutive_overlap,
        reuse_within_1: within(1),
        reuse_within_2: within(2),
        lookahead_recall: s.lookahead_recall.clone(),
        lru_hit_40: curves.first().map_or(0.0, |c| c.hit("lru")),
    })
}

/// Grouped routing (deepseek_v3, kimi_linear) needs `--experts` in whole groups of at
/// least 2 and enough experts in the eligible groups for `--top-k`: refused before
/// anything is written rather than when the written checkpoint is loaded.
fn check_groups(spec: &SynthSpec) -> anyhow::Result<()> {
    let Some(d) = &spec.deepseek else {
        return Ok(());
    };
    anyhow::ensure!(
        spec.experts.is_multiple_of(d.n_group) && spec.experts / d.n_group >= 2,
        "--experts {} must be a multiple of the preset's {} expert groups with at least 2 experts per group",
        spec.experts,
        d.n_group
    );
    let eligible = spec.experts / d.n_group * d.topk_group;
    anyhow::ensure!(
        spec.top_k <= eligible,
        "--top-k {} is more than the {eligible} experts of the {} groups routing may choose (--experts {})",
        spec.top_k,
        d.topk_group,
        spec.experts
    );
    Ok(())
}

/// A progress bar over `total` bytes on stderr (hidden with `--json`; indicatif hides it when stderr is not a terminal).
fn bar(total: u64, json: bool) -> indicatif::ProgressBar {
    if json {
        return indicatif::ProgressBar::hidden();
    }
    super::progress_bar(total, "writing [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}")
}

/// `--from-dense`: upcycle a dense checkpoint into an MoE of copied experts.
fn run_upcycle(args: &Args, source: &std::path::Path) -> anyhow::Result<()> {
    let layout = match &args.layout {
        Some(l) => UpcycleLayout::parse(l).context("--layout: use mixtral or qwen3_moe")?,
        None => default_layout(source)?,
    };
    let spec = UpcycleSpec {
        source: source.to_path_buf(),
        out: args.out.clone(),
        experts: args.experts.unwrap_or(8),
        top_k: args.top_k.unwrap_or(2),
        layout,
        seed: args.seed,
    };
    anyhow::ensure!(
        spec.top_k <= spec.experts,
        "--top-k {} must be between 1 and the number of experts ({}, --experts)",
        spec.top_k,
        spec.experts
    );
    let started = Instant::now();
    let bar = bar(0, args.json);
    let report = upcycle(&spec, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    if args.json {
        let mut doc = serde_json::to_value(&report)?;
        doc["out"] = json!(args.out);
        doc["spec"] = serde_json::to_value(&spec)?;
        doc["seconds"] = json!(seconds);
        return super::print_json(&doc);
    }
    eprintln!(
        "[larder] upcycled {} ({}) into {} ({}: {} layers x {} experts of {}, top-{}; {} of experts, {} in all) in {:.1}s",
        source.display(),
        report.source_model_type,
        args.out.display(),
        report.layout,
        report.layers,
        report.experts,
        larder_store::format_size(report.expert_bytes),
        report.top_k,
        larder_store::format_size(report.bank_bytes),
        larder_store::format_size(report.total_bytes),
        seconds
    );
    Ok(())
}

/// The layout a source's `model_type` upcycles to (mixtral when unknown: the upcycle names the problem).
fn default_layout(source: &std::path::Path) -> anyhow::Result<UpcycleLayout> {
    let path = source.join("config.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("--from-dense: cannot read {}", path.display()))?;
    let cfg: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("--from-dense: {} is not valid JSON", path.display()))?;
    let model_type = cfg["model_type"].as_str().unwrap_or_default();
    Ok(UpcycleLayout::for_source(model_type).unwrap_or(UpcycleLayout::Mixtral))
}

/// Greedy decoding from a seeded first token, recording routes (with router
/// lookahead 3). The experts stream from the new checkpoint's files through a
/// bounded cache (routing is the same as in RAM: streaming changes when bytes
/// arrive, not what is computed), so a checkpoint larger than RAM (a
/// 120b-like preset) is measured too.
fn measure_routing(dir: &std::path::Path, tokens: usize, spec: &SynthSpec) -> anyhow::Result<Measured> {
    let opts = larder_engine::LoadOptions {
        experts: larder_engine::ExpertMode::Stream(larder_store::StoreOptions {
            ram_budget: 1 << 30,
            ..larder_store::StoreOptions::default()
        }),
        ..Default::default()
    };
    let engine =
        larder_engine::Engine::load_with(dir, &opts).with_context(|| format!("cannot load {} to measure routing", dir.display()))?;
    let model = engine.model();
    let mut state = model.new_state();
    let mut trace = RouteTrace::with_lookahead(super::trace::LOOKAHEAD);
    let mut tok = (spec.seed % model.spec().vocab_size as u64) as u32 + 1;
    for _ in 0..tokens {
        let logits = model.forward_last(&[tok], &mut state, Some(&mut trace))?;
        tok = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i as u32)
            .unwrap_or(0);
    }
    let (overlap, per_layer) = trace.consecutive_overlap();
    let stats = routing_stats(&trace, model, dir, spec)?;
    Ok(Measured { overlap, per_layer, stats })
}
