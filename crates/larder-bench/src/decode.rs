//! `larder bench decode`: decode speed streaming experts from a cold cache,
//! against the drive limit measured with the same backend before and after
//! in the same run (docs/design.md §5); also per MoE layer ([`PerMoeLayer`]),
//! the figure a planner's full-model forecast scales by the layer count.

use std::path::{Path, PathBuf};

use larder_engine::{Engine, ExpertMode, GenerateOptions, LoadOptions, PrefillChunk, ReportKind};
use larder_model::RouteTrace;
use larder_router::Trace;
use larder_store::bench::ReadMeasurement;
use larder_store::io::IoKind;
use larder_store::{ExpertIndex, Manifest, StoreOptions, StoreStats};
use serde_json::{json, Value};

use crate::store::{measure, ReadArm};
use crate::{BenchError, BoxError, Observer, Result, Unit};

/// What `bench decode --out` writes (`"larder_report": "bench decode"`).
pub const DECODE_REPORT: ReportKind = ReportKind {
    name: "bench decode",
    legacy_keys: &["limit_before", "limit_after", "ratio_to_io_bound", "ids_hash"],
};

/// Loads the model at a path with the given options (the CLI's loader: progress, errors naming the model).
pub type Loader<'a> = dyn Fn(&Path, &LoadOptions) -> Result<Engine, BoxError> + 'a;

/// What `bench decode` runs.
#[derive(Debug, Clone)]
pub struct DecodeOptions {
    /// Packed store or checkpoint folder.
    pub model: PathBuf,
    /// How it loads; experts must stream.
    pub load: LoadOptions,
    /// How prompts are split into forward passes.
    pub prefill: PrefillChunk,
    /// Prompt length (seeded random ids).
    pub prompt_tokens: usize,
    /// New tokens to decode (greedy, EOS ignored).
    pub new: usize,
    /// Seed of the prompt.
    pub seed: u64,
    /// Records read to measure the drive limit.
    pub limit_records: usize,
    /// Record the run's route trace (returned in the report).
    pub trace: bool,
}

/// What `bench decode` measured.
#[derive(Debug)]
pub struct DecodeReport {
    /// The JSON document (`"larder_report": "bench decode"`).
    pub doc: Value,
    /// The route trace, when asked for.
    pub trace: Option<Trace>,
}

/// The streaming options `load` asks for (bench decode always streams).
fn store_options(load: &LoadOptions) -> Result<StoreOptions> {
    match &load.experts {
        ExpertMode::Stream(o) => Ok(*o),
        ExpertMode::InRam => Err(BenchError::Invalid("bench decode streams experts; give --ram-budget".into())),
    }
}

/// The top-k of the model's first MoE layer.
fn top_k(spec: &larder_model::ModelSpec) -> Result<usize> {
    spec.layers
        .iter()
        .find_map(|l| match &l.ffn {
            larder_model::FfnSpec::Moe(m) => Some(m.top_k),
            _ => None,
        })
        .ok_or_else(|| BenchError::Invalid("the model has no routed experts".into()))
}

/// `n` seeded pseudo-random token ids below `vocab`.
fn seeded_prompt(n: usize, seed: u64, vocab: u64) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % vocab) as u32
        })
        .collect()
}

/// What one greedy decode from a cold cache did.
struct Decoded {
    generation: larder_engine::Generation,
    prompt: Vec<u32>,
    prefill_rows: usize,
    prefill: StoreStats,
    decode: StoreStats,
    routes: RouteTrace,
    trace: Option<Trace>,
}

/// Loads the model and decodes the seeded prompt, recording routes.
fn decode_once(opts: &DecodeOptions, index: &ExpertIndex, load: &Loader, observer: &dyn Observer) -> Result<Decoded> {
    let mut engine = load(&opts.model, &opts.load).map_err(BenchError::Load)?;
    engine.set_prefill(opts.prefill);
    let tokens = observer.task("decode", opts.new as u64, Unit::Count);
    let store = engine
        .store()
        .ok_or_else(|| BenchError::Invalid("experts are not streamed".into()))?
        .clone();
    let prompt = seeded_prompt(opts.prompt_tokens, opts.seed, engine.model().spec().vocab_size as u64);
    let gen_opts = GenerateOptions {
        max_new: opts.new,
        stop_at_eos: false,
        ..GenerateOptions::default()
    };
    let mut after_prefill: Option<StoreStats> = None;
    let mut routes = RouteTrace::with_lookahead(if opts.trace { crate::trace::LOOKAHEAD } else { 0 });
    let generation = engine.generate_traced(
        &prompt,
        &gen_opts,
        &mut |_| {
            if after_prefill.is_none() {
                after_prefill = Some(store.stats());
            }
            tokens.inc(1);
            true
        },
        Some(&mut routes),
    )?;
    tokens.finish();
    let prefill = after_prefill.unwrap_or_default();
    let decode = store.stats().since(&prefill);
    let trace = if opts.trace {
        let bytes = index.total_bytes() / index.layers.iter().map(|l| l.len() as u64).sum::<u64>().max(1);
        Some(crate::trace::to_file(
            &routes,
            engine.model().spec(),
            &opts.model,
            prompt.len(),
            bytes,
        )?)
    } else {
        None
    };
    Ok(Decoded {
        generation,
        prompt,
        prefill_rows: engine.prefill_rows(),
        prefill,
        decode,
        routes,
        trace,
    })
}

/// Runs `bench decode`: the drive limit, a cold decode, the drive limit again.
pub fn decode(opts: &DecodeOptions, load: &Loader, observer: &dyn Observer) -> Result<DecodeReport> {
    let store_opts = store_options(&opts.load)?;
    let index = larder_engine::sizing::expert_index(&opts.model)?;
    let spec = larder_model::arch::read_spec(&opts.model)?;
    let top_k = top_k(&spec)?;
    // The drive limit, measured before and after decoding (drives, virtual
    // ones especially, vary over time); the ratio uses the higher of the two.
    let measure_limit = |seed: u64| {
        let shown = observer.task("drive limit", opts.limit_records as u64, Unit::Count);
        shown.set_message(&format!("{} random records", store_opts.io.kind.name()));
        let arm = ReadArm {
            kind: store_opts.io.kind,
            direct: store_opts.io.direct && store_opts.io.kind != IoKind::Mmap,
            depth: store_opts.io.depth,
            records: opts.limit_records,
            batch: top_k,
        };
        let m = measure(&index, arm, seed);
        shown.set(opts.limit_records as u64);
        shown.finish();
        m
    };
    let limit_before = measure_limit(opts.seed ^ 0xb0b)?;
    larder_store::bench::drop_page_cache(&index.files);
    let run = decode_once(opts, &index, load, observer)?;
    let limit_after = measure_limit(opts.seed ^ 0xa11)?;
    let doc = report(opts, &store_opts, &index, &spec, top_k, &run, [limit_before, limit_after]);
    Ok(DecodeReport { doc, trace: run.trace })
}

/// Bytes of the distinct experts the first `prompt` positions of `trace`
/// routed to: what a read-once prefill reads from a cold cache.
fn routed_expert_bytes(trace: &RouteTrace, prompt: usize, index: &ExpertIndex) -> u64 {
    let mut distinct = std::collections::BTreeSet::new();
    for (&l, routes) in &trace.layers {
        for r in &routes[..prompt.min(routes.len())] {
            distinct.extend(r.experts.iter().map(|&e| (l, e)));
        }
    }
    distinct
        .iter()
        .filter_map(|&(l, e)| index.get(l, e))
        .map(|loc| loc.payload_len())
        .sum()
}

/// Mean consecutive-token expert overlap over the decoded tokens only.
fn decode_overlap(routes: &RouteTrace, prompt: usize) -> f64 {
    let mut decode_trace = RouteTrace::default();
    for (l, r) in &routes.layers {
        decode_trace.layers.insert(*l, r[prompt.min(r.len())..].to_vec());
    }
    decode_trace.consecutive_overlap().0
}

/// Decode per MoE layer against the I/O bound of one layer step: what a
/// forecast for the same shapes at another depth multiplies by its MoE
/// layer count (`per_moe_layer` in the report; docs/store.md "Benchmarks").
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PerMoeLayer {
    /// Layers with routed experts.
    pub moe_layers: usize,
    pub top_k: usize,
    /// Mean bytes of one routed expert's record (its payload).
    pub record_bytes: u64,
    /// Decode seconds per token over the MoE layers: everything a decode
    /// step does (attention, dense layers and the LM head included), shared
    /// equally by the MoE layers.
    pub s_per_token: f64,
    /// `1 / s_per_token`: decode tok/s if the model had one such MoE layer.
    pub tok_per_s: f64,
    /// Seconds to read one layer step's routed experts, every one a miss:
    /// `top_k x record_bytes / drive limit`.
    pub io_bound_s_per_token: f64,
    /// `1 / io_bound_s_per_token`.
    pub io_bound_tok_per_s: f64,
    /// `io_bound_s_per_token / s_per_token`: 1 is decoding at the drive's
    /// speed with every routed expert read; cache hits can lift it above 1.
    pub ratio_to_io_bound: f64,
    /// Expert bytes read per token per MoE layer in this run (misses only).
    pub miss_bytes_per_token: f64,
}

impl PerMoeLayer {
    /// From decode tok/s, miss bytes per token, the drive limit (GB/s) and the model's expert shapes.
    pub fn new(
        decode_tok_per_s: f64,
        miss_bytes_per_token: f64,
        limit_gbps: f64,
        moe_layers: usize,
        top_k: usize,
        record_bytes: u64,
    ) -> Self {
        let layers = moe_layers.max(1) as f64;
        let s_per_token = if decode_tok_per_s > 0.0 {
            1.0 / (decode_tok_per_s * layers)
        } else {
            f64::INFINITY
        };
        let io_bound_s_per_token = if limit_gbps > 0.0 {
            (top_k as u64 * record_bytes) as f64 / (limit_gbps * 1e9)
        } else {
            f64::INFINITY
        };
        let ratio = io_bound_s_per_token / s_per_token;
        let inv = |s: f64| if s > 0.0 { 1.0 / s } else { f64::INFINITY };
        PerMoeLayer {
            moe_layers,
            top_k,
            record_bytes,
            s_per_token,
            tok_per_s: inv(s_per_token),
            io_bound_s_per_token,
            io_bound_tok_per_s: inv(io_bound_s_per_token),
            ratio_to_io_bound: if ratio.is_finite() { ratio } else { 0.0 },
            miss_bytes_per_token: miss_bytes_per_token / layers,
        }
    }
}

/// The `bench decode` document.
fn report(
    opts: &DecodeOptions,
    store_opts: &StoreOptions,
    index: &ExpertIndex,
    spec: &larder_model::ModelSpec,
    top_k: usize,
    run: &Decoded,
    [limit_before, limit_after]: [ReadMeasurement; 2],
) -> Value {
    let limit = if limit_after.gbps > limit_before.gbps {
        limit_after.clone()
    } else {
        limit_before.clone()
    };
    let (g, prefill, decode) = (&run.generation, &run.prefill, &run.decode);
    let prompt_len = run.prompt.len();
    let steps = g.stats.new_tokens.saturating_sub(1).max(1) as f64;
    let miss_bytes_per_token = decode.bytes_read as f64 / steps;
    let bound = if miss_bytes_per_token > 0.0 {
        limit.gbps * 1e9 / miss_bytes_per_token
    } else {
        f64::INFINITY
    };
    let ratio = g.stats.decode_tok_per_s / bound;
    let routed_bytes = routed_expert_bytes(&run.routes, prompt_len, index);
    let overlap = decode_overlap(&run.routes, prompt_len);
    let ids_hash = larder_store::Digest::of(&g.ids.iter().flat_map(|i| i.to_le_bytes()).collect::<Vec<u8>>()).to_string();
    let experts_per_layer = index.layers.iter().map(|l| l.len()).max().unwrap_or(0);
    let records = index.layers.iter().map(|l| l.len() as u64).sum::<u64>().max(1);
    let per_layer = PerMoeLayer::new(
        g.stats.decode_tok_per_s,
        miss_bytes_per_token,
        limit.gbps,
        index.expert_layers(),
        top_k,
        index.total_bytes() / records,
    );
    json!({
        "larder_report": DECODE_REPORT.name,
        "machine": {"cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)},
        "model": {
            "dir": opts.model,
            "packed": Manifest::is_store(&opts.model),
            "layers": spec.layers.len(),
            "expert_layers": index.expert_layers(),
            "experts_per_layer": experts_per_layer,
            "top_k": top_k,
            "expert_bank_bytes": index.total_bytes(),
        },
        "io": {"backend": store_opts.io.kind.name(), "direct": store_opts.io.direct, "depth": store_opts.io.depth, "verify": store_opts.verify, "prefetch_threads": store_opts.prefetch_threads},
        "prefetch_reads": decode.prefetch_reads,
        "prefetch_hits": decode.prefetch_hits,
        "prefetch_accuracy": decode.prefetch_accuracy(),
        "ram_budget": store_opts.ram_budget,
        "cache_state": "cold",
        "limit": limit,
        "limit_before": limit_before,
        "limit_after": limit_after,
        "prompt_tokens": prompt_len,
        "new_tokens": g.stats.new_tokens,
        "prefill_tok_per_s": g.stats.prefill_tok_per_s,
        "prefill_rows_per_pass": run.prefill_rows,
        "prefill_expert_bytes_read": prefill.bytes_read,
        "prefill_routed_expert_bytes": routed_bytes,
        "prefill_read_amplification": if routed_bytes > 0 { prefill.bytes_read as f64 / routed_bytes as f64 } else { 0.0 },
        "prefill_io_wait_share": if g.stats.prefill_s > 0.0 { prefill.io_wait_s / g.stats.prefill_s } else { 0.0 },
        "prefill_prefetch_reads": prefill.prefetch_reads,
        "time_to_first_token_s": g.stats.time_to_first_token_s,
        "decode_tok_per_s": g.stats.decode_tok_per_s,
        "decode_s": g.stats.decode_s,
        "decode_expert_bytes_read": decode.bytes_read,
        "miss_bytes_per_token": miss_bytes_per_token,
        "hit_rate": decode.hit_rate(),
        "io_wait_share": if g.stats.decode_s > 0.0 { decode.io_wait_s / g.stats.decode_s } else { 0.0 },
        "io_bound_tok_per_s": bound,
        "ratio_to_io_bound": ratio,
        "per_moe_layer": per_layer,
        "routing_overlap": overlap,
        "routing_overlap_uniform": top_k as f64 / experts_per_layer.max(1) as f64,
        "ids_hash": ids_hash,
        "stats": g.stats,
    })
}

#[cfg(test)]
mod tests {
    use super::PerMoeLayer;

    /// Kimi K3's record (17,547,264 B), top-16, at 2 GB/s: one layer step's
    /// reads take 140 ms; decoding 1 tok/s over 3 MoE layers is 333 ms per
    /// layer, 42% of the bound.
    #[test]
    fn per_moe_layer_figures() {
        let p = PerMoeLayer::new(1.0, 3.0 * 100e6, 2.0, 3, 16, 17_547_264);
        assert!((p.s_per_token - 1.0 / 3.0).abs() < 1e-12);
        assert!((p.tok_per_s - 3.0).abs() < 1e-9);
        assert!((p.io_bound_s_per_token - 16.0 * 17_547_264.0 / 2e9).abs() < 1e-12);
        assert!((p.ratio_to_io_bound - 0.140_378_112 * 3.0).abs() < 1e-9);
        assert!((p.miss_bytes_per_token - 100e6).abs() < 1e-3);
        let none = PerMoeLayer::new(0.0, 0.0, 0.0, 0, 16, 0);
        assert_eq!(none.ratio_to_io_bound, 0.0);
        assert!(none.s_per_token.is_infinite());
    }
}
