//! `larder plan` as a library call: what a model will do on a machine,
//! before buying drives. From the model's sizes ([`crate::sizing`]), a route
//! trace or a routing preset replayed through the cache simulator at the
//! planned budget (with prefetch as the store runs it), and the machine's
//! drive, RAM and kernel speeds, [`plan_model`] forecasts decode tok/s, time
//! to first token per prompt length, the hit rate, bytes read per token and
//! the binding resource ([`crate::forecast`]; docs/doctor.md). The experts'
//! format comes from the spec, never from bytes per weight.

use std::collections::HashMap;

use larder_model::config::{FfnSpec, ModelSpec};
use larder_model::{ModuleRule, PackedFormat};
use larder_router::{Phase, RoutingModel, Trace, TraceHeader, TRACE_VERSION};
use larder_store::cache::prefetch_sim::{simulate_prefetch, DecodeStep, LayerAccess, PrefetchLayer, PrefetchResult, PrefetchRule};
use larder_store::cache::sim::Step;
use larder_store::cache::PolicyKind;
use larder_store::format_size;

use crate::forecast::{self, forecast, uniform_union_share, ForecastInput, LayerReads};
/// The forecast a plan carries, and the CPU overhead it assumes by default.
pub use crate::forecast::{Forecast, CPU_OVERHEAD};
use crate::plan::{headroom, ModelSizes};
use crate::sizing::ModelReport;

/// Router lookahead recall assumed for routing presets: published figures for
/// real MoE models put next-layer lookahead at about 70%.
pub const PRESET_RECALL: f64 = 0.7;

/// Why a plan cannot be made; each names the flag to change.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PlannerError {
    #[error("--model {0}: has no routed experts to plan streaming for")]
    NoExperts(String),
    #[error("{0}")]
    Input(String),
}

/// The machine planned for, per core where it says so.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MachinePlan {
    pub ram: u64,
    /// Read GB/s of each drive, for expert-sized reads.
    pub drives_gbps: Vec<f64>,
    pub cores: usize,
    /// One core's RAM read GB/s.
    pub ram_gbps: f64,
    /// GB/s one core checks record digests at.
    pub digest_gbps: f64,
    /// One core's weight GB/s: the spine's kernels (bf16) and the experts'
    /// at one row, and the experts' per row at many rows (prefill).
    pub spine_kernel_gbps: f64,
    pub expert_kernel_gbps: f64,
    pub prefill_kernel_gbps: f64,
}

impl MachinePlan {
    /// A machine of `ram` bytes, these drives and cores, one core reading
    /// RAM at `ram_gbps` and checking digests at `digest_gbps`; kernels at
    /// the RAM speed (one row) and 8x that (many rows) until set.
    pub fn new(ram: u64, drives_gbps: Vec<f64>, cores: usize, ram_gbps: f64, digest_gbps: f64) -> MachinePlan {
        MachinePlan {
            ram,
            drives_gbps,
            cores: cores.max(1),
            ram_gbps,
            digest_gbps,
            spine_kernel_gbps: ram_gbps,
            expert_kernel_gbps: ram_gbps,
            prefill_kernel_gbps: ram_gbps * 8.0,
        }
    }
}

/// Where the routes replayed come from.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Routing {
    /// A trace recorded with `--trace`.
    Trace(Trace),
    /// A preset (uniform, local, skewed, mixed) drawn for `tokens` decode tokens.
    Preset { name: String, tokens: usize },
}

/// What to plan.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PlanInput {
    pub model: ModelReport,
    pub spec: ModelSpec,
    pub machine: MachinePlan,
    pub routing: Routing,
    /// Lookahead recall where the routes carry no predictions (default [`PRESET_RECALL`]).
    pub recall: Option<f64>,
    pub prefetch: bool,
    /// The I/O backend planned for: io_uring (demand reads go first) or pread.
    pub uring: bool,
    pub prefetch_threads: usize,
    /// CPU work between a step's matrix products, as a share of theirs.
    pub cpu_overhead: f64,
    /// The expert cache's budget (default: what the RAM leaves).
    pub ram_budget: Option<u64>,
    pub prompt_lens: Vec<usize>,
}

impl PlanInput {
    pub fn new(model: ModelReport, spec: ModelSpec, machine: MachinePlan, routing: Routing) -> PlanInput {
        PlanInput {
            model,
            spec,
            machine,
            routing,
            recall: None,
            prefetch: true,
            uring: true,
            prefetch_threads: 2,
            cpu_overhead: forecast::CPU_OVERHEAD,
            ram_budget: None,
            prompt_lens: vec![512, 2048, 8192],
        }
    }
}

/// A plan: the forecast and what it was made from.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PlanOutput {
    pub forecast: Forecast,
    pub ram_budget: u64,
    /// Lookahead recall of the routes replayed.
    pub recall: f64,
    /// Per decode token: bytes read on demand, in the background, and the
    /// share of background reads used; bytes per token as simulated.
    pub demand_bytes_per_token: f64,
    pub prefetch_bytes_per_token: f64,
    pub prefetch_used_per_token: f64,
    pub bytes_per_token_simulated: f64,
    /// The routed experts' format (`bench kernels`' dtype names).
    pub expert_format: &'static str,
}

/// Plans `input` (see the module docs).
pub fn plan_model(input: &PlanInput) -> Result<PlanOutput, PlannerError> {
    let sizes = &input.model.sizes;
    if sizes.moe_layers == 0 || sizes.expert_bytes == 0 {
        return Err(PlannerError::NoExperts(input.model.path.display().to_string()));
    }
    let budget = budget(input)?;
    let trace = match &input.routing {
        Routing::Trace(t) => t.clone(),
        Routing::Preset { name, tokens } => RoutingModel::preset(name, sizes.experts_per_layer)
            .map_err(|e| PlannerError::Input(format!("--routing: {e}")))?
            .trace(preset_header(sizes), *tokens, 1)
            .map_err(|e| PlannerError::Input(format!("--routing {name} (--tokens {tokens}): {e}")))?,
    };
    check_shape(&trace, sizes)?;
    let recall = match input.recall {
        Some(r) if !(0.0..=1.0).contains(&r) => return Err(PlannerError::Input(format!("--recall {r}: a share from 0 to 1"))),
        r => r.unwrap_or(PRESET_RECALL),
    };
    let trace = larder_router::with_predictions(trace, recall, 1);
    let recall = trace
        .route_stats(Some(Phase::Decode))
        .lookahead_recall
        .first()
        .map_or(recall, |r| r.1);
    let mut fi = forecast_input(input, budget, &trace);
    let limit = forecast::background_reads_per_layer(&fi);
    let reads = decode_reads(&trace, budget, input.prefetch, limit);
    fi.hit_rate = reads.hit_rate();
    fi.reads = per_token_reads(&reads);
    let per_token = |bytes: fn(&PrefetchLayer) -> u64| reads.layers.iter().map(bytes).sum::<u64>() as f64 / reads.tokens.max(1) as f64;
    Ok(PlanOutput {
        forecast: forecast(&fi),
        ram_budget: budget,
        recall,
        demand_bytes_per_token: per_token(|l| l.demand_bytes),
        prefetch_bytes_per_token: per_token(|l| l.prefetch_bytes),
        prefetch_used_per_token: per_token(|l| l.prefetch_used),
        bytes_per_token_simulated: reads.bytes_per_token(),
        expert_format: expert_format(&input.spec),
    })
}

/// The cache budget: what was asked, or what the RAM leaves after headroom,
/// the KV cache of the longest prompt and the spine (at most the bank).
fn budget(input: &PlanInput) -> Result<u64, PlannerError> {
    let (sizes, ram) = (&input.model.sizes, input.machine.ram);
    let longest = input.prompt_lens.iter().copied().max().unwrap_or(0) as u64;
    let kv = longest.saturating_mul(input.model.kv_bytes_per_token as u64);
    let usable = ram.saturating_sub(headroom(ram)).saturating_sub(kv);
    let least = sizes.spine_bytes.saturating_add(sizes.min_cache_bytes());
    if least > usable {
        return Err(PlannerError::Input(format!(
            "--ram {}: too small: the spine ({}), one layer step's experts ({}), the KV cache of a {longest}-token \
             prompt ({}) and headroom ({}) need {}; give more --ram or shorter --prompt-lens",
            format_size(ram),
            format_size(sizes.spine_bytes),
            format_size(sizes.min_cache_bytes()),
            format_size(kv),
            format_size(headroom(ram)),
            format_size(least + kv + headroom(ram))
        )));
    }
    let room = usable - sizes.spine_bytes;
    match input.ram_budget {
        Some(b) if b > room => Err(PlannerError::Input(format!(
            "--ram-budget {}: more than the {} left of --ram {} after the spine, KV cache and headroom",
            format_size(b),
            format_size(room),
            format_size(ram)
        ))),
        Some(b) => Ok(b),
        None => Ok(room.min(sizes.bank_bytes)),
    }
}

/// The forecast's input before the replay fills in the hit rate and reads.
fn forecast_input(input: &PlanInput, budget: u64, trace: &Trace) -> ForecastInput {
    let (m, spec, sizes) = (&input.machine, &input.spec, &input.model.sizes);
    let cores = m.cores as f64;
    // The embedding table (bf16 in every format larder reads) is read one row per token.
    let embedding_bytes = if spec.tie_word_embeddings {
        0
    } else {
        (spec.vocab_size * spec.hidden_size * 2) as u64
    };
    ForecastInput {
        sizes: sizes.clone(),
        embedding_bytes,
        ram_budget: budget,
        hit_rate: 0.0,
        reads: Vec::new(),
        drives_gbps: m.drives_gbps.clone(),
        ram_gbps: m.ram_gbps * cores,
        spine_kernel_gbps: m.spine_kernel_gbps * cores,
        expert_kernel_gbps: m.expert_kernel_gbps * cores,
        prefill_kernel_gbps: m.prefill_kernel_gbps * cores,
        cpu_overhead: input.cpu_overhead,
        digest_gbps: Some(m.digest_gbps),
        cores: m.cores,
        prefetch_threads: input.prefetch_threads,
        demand_share: if input.uring {
            forecast::URING_DEMAND_SHARE
        } else {
            forecast::PREAD_DEMAND_SHARE
        },
        prompts: input
            .prompt_lens
            .iter()
            .map(|&n| (n, prompt_union_share(trace, sizes, n)))
            .collect(),
    }
}

fn preset_header(sizes: &ModelSizes) -> TraceHeader {
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

fn check_shape(trace: &Trace, sizes: &ModelSizes) -> Result<(), PlannerError> {
    let h = &trace.header;
    if h.experts != sizes.experts_per_layer || h.top_k != sizes.top_k || h.moe_layers.len() != sizes.moe_layers {
        return Err(PlannerError::Input(format!(
            "--trace: recorded on {} MoE layers x {} experts, top-{}; the model has {} x {}, top-{}",
            h.moe_layers.len(),
            h.experts,
            h.top_k,
            sizes.moe_layers,
            sizes.experts_per_layer,
            sizes.top_k
        )));
    }
    if !trace.tokens.iter().any(|t| t.phase == Phase::Decode) {
        return Err(PlannerError::Input(
            "the trace has no decode tokens to forecast decoding from".into(),
        ));
    }
    Ok(())
}

/// The engine's expert requests of `trace`, pass by pass: what the cache
/// simulator replays (`larder bench cache`, and [`decode_reads`]).
pub fn trace_steps(trace: &Trace) -> Vec<Step> {
    let h = &trace.header;
    trace
        .passes()
        .into_iter()
        .map(|p| Step {
            tokens: p.tokens,
            accesses: p
                .layers
                .iter()
                .enumerate()
                .flat_map(|(i, experts)| experts.iter().map(move |&e| ((h.moe_layers[i], e), h.expert_bytes[i])))
                .collect(),
        })
        .collect()
}

/// The default policy over the trace's decode passes, the prompt's passes
/// warming the cache first: what each MoE layer reads on demand and, with
/// `prefetch`, in the background on the recorded depth-1 predictions
/// (`larder_store::cache::prefetch_sim`), at most `per_layer` of them per
/// layer and token.
fn decode_reads(trace: &Trace, budget: u64, prefetch: bool, per_layer: usize) -> PrefetchResult {
    let steps = trace_steps(trace);
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
    let mut policy = PolicyKind::default().build(budget, h.moe_layers.len(), &HashMap::new());
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

/// The routed experts' storage format, as `bench kernels` names dtypes,
/// from the spec: gpt-oss MXFP4, a compressed-tensors scheme packing the
/// experts (int4, mxfp4), fp8 block-scaled, else 16-bit floats.
pub fn expert_format(spec: &ModelSpec) -> &'static str {
    if spec.mxfp4_experts.is_some() {
        return "mxfp4";
    }
    let layer = spec.layers.iter().position(|l| matches!(l.ffn, FfnSpec::Moe(_)));
    let module = layer.map(|l| {
        let names = &spec.moe_names;
        format!("model.layers.{l}.{}.experts.0.{}", names.block, names.expert_proj[0])
    });
    if let (Some(c), Some(m)) = (spec.compressed.as_ref(), module) {
        match c.rule(&m) {
            ModuleRule::Packed(PackedFormat::Int4 { .. }) => return "int4",
            ModuleRule::Packed(PackedFormat::Mxfp4) => return "mxfp4",
            _ => {}
        }
    }
    match spec.fp8_block {
        Some(_) => "fp8",
        None => "bf16",
    }
}
