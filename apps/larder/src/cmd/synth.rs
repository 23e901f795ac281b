//! `larder synth`: write a synthetic checkpoint (real layout, random
//! weights, any size) and measure how its routing behaves; or, with
//! `--from-dense`, upcycle a real dense checkpoint into an MoE whose experts
//! are copies of its MLP (real text from a streamed MoE). The work is
//! `larder_tools::synth` (the report's text: `larder_tools::text`); here the flags
//! and the progress bar.

use std::path::PathBuf;

use larder_model::synth::ROUTINGS;
use larder_tools::synth::upcycle::UpcycleOptions;
use larder_tools::synth::SynthOptions;

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
--routed-expert-hidden-size N (kimi_linear, kimi_k3) writes K3's latent experts: each MoE block gets \
routed_expert_down_proj [N, hidden] and routed_expert_up_proj [hidden, N] (and, with --latent-moe-use-norm \
true, the default, routed_expert_norm [N]) and its routed experts are N wide instead of hidden (config.json: \
routed_expert_hidden_size, latent_moe_use_norm), so expert records shrink by N/hidden.\n\n\
kimi_k3 (Kimi K3 as published): config.json is the KimiK3ForConditionalGeneration wrapper with the text \
model under text_config (every K3 field at its released value: SiTU betas 4.0/25.0, latent experts with \
their norm, attention residuals, full-rank KDA gate with lower bound -5.0, MLA output gate, the released \
mxfp4-pack-quantized quantization_config) and a small vision_config; tensors under language_model., a small \
vision tower (vision_tower.*, mm_projector.*) in a shard of its own, A_log, dt_bias, conv taps, o_norm and \
the router in f32, MXFP4 routed experts (or --experts-format bf16). Presets tiny (hidden 64, 6 layers: KDA x3, \
MLA, KDA, MLA; 16 experts top-4 of Im 32 at latent 32) and k3, the released geometry: hidden 7168, 93 layers \
(MLA at 4, 8, ..., 92 and 93, KDA elsewhere, 96 heads), 896 experts top-16 of Im 3072 at latent 3584 \
(17,547,264 bytes per MXFP4 expert), 2 shared experts, vocab 163840: 1.45 TB of experts, so shrink it with \
--layers and --experts (the per-expert geometry stays; MLA stays at every 4th and the last layer).\n\n\
gpt_oss (gpt-oss layout: attention with q/k/v/o biases and per-head sinks, layers alternating sliding-window \
and full attention, YaRN, a biased router, fused experts with biases and gate/up interleaved): presets tiny \
(hidden 64, 16 experts, top-4, 4 layers, window 4), 20b (gpt-oss-20b's shapes: hidden and intermediate 2880, \
24 layers, 32 experts, top-4, 64 heads x 64, 8 KV heads, window 128, vocab 201088) and 120b (36 layers, 128 \
experts); with --experts-gib the layer count is chosen instead, as for k3-mini.\n\n\
--experts-format sets how routed experts are stored (everything else is bf16): bf16; int4 (deepseek_v3, \
kimi_linear: compressed-tensors pack-quantized, as Kimi-K2-Thinking ships: weight_packed i32 [out, in/8], \
weight_scale bf16 [out, in/32], weight_shape i32 [2]); mxfp4 (deepseek_v3, kimi_linear, kimi_k3 (its default): \
compressed-tensors mxfp4-pack-quantized as the K3 release ships: weight_packed u8 [out, in/2] e2m1, weight_scale u8 e8m0 [out, \
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
larder synth --arch kimi_k3 --preset k3 --layers 5 --experts 128 --out ./k3-5-layers\n  \
larder synth --arch deepseek_v3 --preset k3-mini --experts-format int4 --experts-gib 8 --out ./k3mini-int4\n  \
larder synth --arch gpt_oss --preset 20b --out ./gpt-oss-20b-like\n  \
larder synth --arch gpt_oss --preset 120b --experts-gib 16 --out ./gpt-oss-120b-like-16g\n  \
larder synth --from-dense ~/.cache/larder/smollm2/checkpoint --experts 8 --top-k 2 --out ./smollm2-moe")]
pub struct Args {
    /// Architecture: qwen3_moe, deepseek_v3 (MLA, dense first layer, shared expert, grouped sigmoid routing),
    /// kimi_linear (deepseek_v3's MoE with KDA layers and MLA every 4th layer), kimi_k3 (Kimi K3 as
    /// published) or gpt_oss.
    #[arg(long, default_value = "qwen3_moe", value_parser = larder_model::synth::ARCHITECTURES)]
    arch: String,
    /// Shape preset: tiny or k3-mini; gpt_oss: tiny, 20b or 120b; kimi_k3: tiny or k3 (the released geometry).
    #[arg(long, default_value = "tiny")]
    preset: String,
    /// How routed experts are stored: bf16, int4 (deepseek_v3, kimi_linear: compressed-tensors
    /// pack-quantized) or mxfp4 (deepseek_v3, kimi_linear, kimi_k3: compressed-tensors mxfp4-pack-quantized;
    /// gpt_oss: its own MXFP4 blocks and scales). Default: bf16; gpt_oss and kimi_k3: mxfp4, as they ship.
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
    /// kimi_linear, kimi_k3: K3's latent experts of this width, 1 to 65536: routed experts run between
    /// routed_expert_down_proj / routed_expert_up_proj at width N instead of the hidden size (default: none;
    /// kimi_k3: the preset's, 3584 in k3).
    #[arg(long, value_name = "N", value_parser = super::range(1, 1 << 16), conflicts_with = "from_dense")]
    routed_expert_hidden_size: Option<usize>,
    /// With latent experts: RMS-normalise their weighted sum (routed_expert_norm) before
    /// routed_expert_up_proj, as K3 ships (default: true).
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set, conflicts_with = "from_dense")]
    latent_moe_use_norm: Option<bool>,
    /// Override the vocabulary size, 2 to 16777216 (e.g. to make a draft model for another synthetic checkpoint).
    #[arg(long, value_parser = super::range(2, 1 << 24), conflicts_with = "from_dense")]
    vocab: Option<usize>,
    /// Seed of the random weights (with --from-dense: of the random routers).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Routing preset (sets the --routing-* knobs' defaults; docs/store.md "Routing presets" has the
    /// calibration): uniform (skew 0, locality 0, drift 0: independent uniform routing, as GLM- and Qwen3-Next-class models route, but the next
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
    let opts = SynthOptions {
        arch: args.arch.clone(),
        preset: args.preset.clone(),
        experts_format: args.experts_format.clone(),
        experts_gib: args.experts_gib,
        layers: args.layers,
        experts: args.experts,
        top_k: args.top_k,
        routed_expert_hidden_size: args.routed_expert_hidden_size,
        latent_moe_use_norm: args.latent_moe_use_norm,
        vocab: args.vocab,
        seed: args.seed,
        routing: args.routing.clone(),
        routing_skew: args.routing_skew,
        routing_locality: args.routing_locality,
        routing_drift: args.routing_drift,
        measure_tokens: args.measure_tokens,
        out: args.out.clone(),
    };
    let spec = larder_tools::synth::plan(&opts)?;
    let bytes = larder_tools::synth::prepare_out(&spec, &opts.out)?;
    let bar = bar(bytes, args.json);
    let mut report = larder_tools::synth::write_checkpoint(spec, &opts, &mut |b| bar.inc(b))?;
    bar.finish_and_clear();
    larder_tools::synth::measure(&mut report)?;
    if args.json {
        return super::print_json(&report.to_json());
    }
    eprint!("{}", larder_tools::text::synth_text(&report, &args.routing));
    Ok(())
}

/// A progress bar over `total` bytes on stderr (hidden with `--json`; indicatif hides it when stderr is not a terminal).
fn bar(total: u64, json: bool) -> indicatif::ProgressBar {
    if json {
        return indicatif::ProgressBar::hidden();
    }
    super::progress::progress_bar(total, "writing [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}")
}

/// `--from-dense`: upcycle a dense checkpoint into an MoE of copied experts.
fn run_upcycle(args: &Args, source: &std::path::Path) -> anyhow::Result<()> {
    let opts = UpcycleOptions {
        source: source.to_path_buf(),
        out: args.out.clone(),
        experts: args.experts,
        top_k: args.top_k,
        layout: args.layout.clone(),
        seed: args.seed,
    };
    let spec = larder_tools::synth::upcycle::plan(&opts)?;
    let bar = bar(0, args.json);
    let done = larder_tools::synth::upcycle::run(spec, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    if args.json {
        return super::print_json(&done.to_json()?);
    }
    let report = &done.report;
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
        done.seconds
    );
    Ok(())
}
