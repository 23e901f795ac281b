//! `larder bench io` and `larder bench decode`: streaming speed against the
//! drive limit measured in the same run (docs/design.md §5).

use std::path::{Path, PathBuf};

use anyhow::Context;
use larder_engine::{ExpertMode, GenerateOptions, ReportKind, RunInputs};
use larder_model::RouteTrace;
use larder_store::bench::{measure_reads, random_experts, ReadMeasurement};
use larder_store::io::{open_backend, IoKind, IoOptions};
use larder_store::{ExpertIndex, Manifest, StoreStats};
use serde_json::json;

use super::progress::{Progress, Unit};

/// Arguments of `larder bench io`.
#[derive(clap::Args)]
#[command(
    after_help = "Reads random expert records (never the same one twice, page cache dropped first) in \
batches of --batch, like one layer step of decoding, through each backend.\n\nExample:\n  larder bench io --store ./k3mini.store --json"
)]
pub struct IoArgs {
    /// Packed store or checkpoint folder.
    #[arg(long, value_name = "DIR")]
    store: PathBuf,
    /// Backends to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "uring,pread,mmap")]
    io: Vec<String>,
    /// Records per arm, 1 to 1048576 (at most every record of the store is read).
    #[arg(long, default_value_t = 96, value_parser = super::range(1, super::MAX_COUNT))]
    records: usize,
    /// Records requested together (one layer step: top-k), 1 to 1024.
    #[arg(long, default_value_t = 8, value_parser = super::range(1, super::MAX_BATCH))]
    batch: usize,
    /// Reads in flight, 1 to 256 (pread threads; io_uring uses 4 reads per unit).
    #[arg(long, default_value_t = 8, value_parser = super::range(1, larder_store::io::MAX_IO_DEPTH))]
    depth: usize,
    /// Read through the page cache instead of O_DIRECT.
    #[arg(long)]
    no_direct: bool,
    /// Print one JSON document on stdout.
    #[arg(long)]
    json: bool,
    /// Also write the JSON document to this file (not a file of --store; an existing report of `bench io`
    /// only with --overwrite).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    #[command(flatten)]
    output: super::OverwriteArg,
}

/// What `bench io --out` writes (`"larder_report": "bench io"`).
pub const IO_REPORT: ReportKind = ReportKind {
    name: "bench io",
    legacy_keys: &["store", "limit_gbps", "results"],
};

/// What `bench decode --out` writes (`"larder_report": "bench decode"`).
pub const DECODE_REPORT: ReportKind = ReportKind {
    name: "bench decode",
    legacy_keys: &["limit_before", "limit_after", "ratio_to_io_bound", "ids_hash"],
};

/// The expert index of a store or checkpoint folder.
pub fn index_of(dir: &Path) -> anyhow::Result<ExpertIndex> {
    if Manifest::is_store(dir) {
        Ok(larder_engine::experts::packed_index(dir)?.1)
    } else {
        let spec = larder_model::arch::read_spec(dir)?;
        let ckpt = larder_model::checkpoint::Checkpoint::open(dir)?;
        Ok(larder_engine::experts::direct_index(&spec, &ckpt)?)
    }
}

fn measure(
    index: &ExpertIndex,
    kind: IoKind,
    direct: bool,
    depth: usize,
    records: usize,
    batch: usize,
    seed: u64,
) -> anyhow::Result<ReadMeasurement> {
    let backend = open_backend(&index.files, IoOptions { kind, direct, depth })?;
    let experts = random_experts(index, records, seed);
    Ok(measure_reads(index, &*backend, &experts, batch)?)
}

pub fn io(args: IoArgs) -> anyhow::Result<()> {
    let inputs = RunInputs::new().model("--store", &args.store);
    let mut out = super::check_report_out(args.out.as_deref(), IO_REPORT, args.output, &inputs)?;
    let index = super::about(index_of(&args.store), "cannot open the store", &args.store)?;
    let mut results = Vec::new();
    let progress = Progress::new("bench io", args.io.len() as u64, Unit::Count, args.json);
    for (i, name) in args.io.iter().enumerate() {
        let kind = IoKind::parse(name).with_context(|| format!("unknown backend {name:?}"))?;
        progress.set_message(name);
        let m = measure(
            &index,
            kind,
            !args.no_direct && kind != IoKind::Mmap,
            args.depth,
            args.records,
            args.batch,
            i as u64 + 1,
        )?;
        if !args.json {
            eprintln!(
                "[larder] {:>5} direct={:<5} {} records of {} in batches of {}: {:.2} GB/s",
                m.backend,
                m.direct,
                m.records,
                larder_store::format_size(m.bytes / m.records.max(1) as u64),
                m.batch,
                m.gbps
            );
        }
        results.push(m);
        progress.inc(1);
    }
    progress.finish();
    let limit = results.iter().map(|m| m.gbps).fold(0.0, f64::max);
    let doc = json!({"larder_report": IO_REPORT.name, "store": args.store, "limit_gbps": limit, "results": results});
    super::save_json(out.as_mut(), &doc)?;
    if args.json {
        super::print_json(&doc)?;
    }
    Ok(())
}

/// Arguments of `larder bench decode`.
#[derive(clap::Args)]
#[command(
    after_help = "Measures the drive limit with the same backend first (random expert records in batches \
of top-k), then decodes a fixed seeded prompt from a cold cache and reports prefill tok/s, time to first \
token, steady decode tok/s, expert bytes per token, hit rate, I/O-wait share and the ratio of decode speed to \
the I/O bound (limit_gbps / miss bytes per token).\n\nExample:\n  larder bench decode --model ./k3mini.store --ram-budget 2GiB --json"
)]
pub struct DecodeArgs {
    /// Packed store or checkpoint folder.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    #[command(flatten)]
    experts: super::ExpertArgs,
    /// Prompt length (seeded random ids), 1 to 1048576 (and within the model's context).
    #[arg(long, default_value_t = 16, value_parser = super::range(1, super::MAX_COUNT))]
    prompt_tokens: usize,
    /// New tokens to decode (greedy, EOS ignored), 2 to 1048576.
    #[arg(long, default_value_t = 32, value_parser = super::range(2, super::MAX_COUNT))]
    new: usize,
    /// Seed of the prompt.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Records read to measure the drive limit, 1 to 1048576.
    #[arg(long, default_value_t = 96, value_parser = super::range(1, super::MAX_COUNT))]
    limit_records: usize,
    /// Print one JSON document on stdout.
    #[arg(long)]
    json: bool,
    /// Also write the JSON document to this file (not a file of --model; an existing report of `bench decode`
    /// only with --overwrite).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Record the run's route trace (as `larder run --trace`) to FILE, for `larder bench cache` and `larder plan`
    /// (not a file of --model; an existing trace only with --overwrite).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    #[command(flatten)]
    output: super::OverwriteArg,
}

pub fn decode(args: DecodeArgs) -> anyhow::Result<()> {
    let mut inputs = super::model_inputs(&args.model, &args.experts);
    let mut trace_out = match &args.trace {
        Some(path) => {
            let out = super::trace::check_output(path, args.output.overwrite, &inputs)?;
            inputs = inputs.other_output("--trace", path);
            Some(out)
        }
        None => None,
    };
    let mut out = super::check_report_out(args.out.as_deref(), DECODE_REPORT, args.output, &inputs)?;
    let mut experts = args.experts.clone();
    if experts.ram_budget.is_none() && experts.io.is_none() {
        // bench decode always streams.
        experts.io = Some(IoKind::best());
    }
    let opts = experts.load_options(&args.model);
    let ExpertMode::Stream(store_opts) = opts.experts else {
        anyhow::bail!("bench decode streams experts; give --ram-budget");
    };
    super::check_budget(&args.model, &opts)?;
    let index = index_of(&args.model)?;
    let spec = larder_model::arch::read_spec(&args.model)?;
    let top_k = spec
        .layers
        .iter()
        .find_map(|l| match &l.ffn {
            larder_model::FfnSpec::Moe(m) => Some(m.top_k),
            _ => None,
        })
        .context("the model has no routed experts")?;
    // The drive limit, measured before and after decoding (drives, virtual
    // ones especially, vary over time); the ratio uses the higher of the two.
    let measure_limit = |seed: u64| {
        let shown = Progress::new("drive limit", args.limit_records as u64, Unit::Count, args.json);
        shown.set_message(&format!("{} random records", store_opts.io.kind.name()));
        let m = measure(
            &index,
            store_opts.io.kind,
            store_opts.io.direct && store_opts.io.kind != IoKind::Mmap,
            store_opts.io.depth,
            args.limit_records,
            top_k,
            seed,
        );
        shown.set(args.limit_records as u64);
        shown.finish();
        m
    };
    let limit_before = measure_limit(args.seed ^ 0xb0b)?;
    larder_store::bench::drop_page_cache(&index.files);

    let mut engine = super::load_with_options(&args.model, &opts, args.json)?;
    engine.set_prefill(experts.prefill());
    let tokens = Progress::new("decode", args.new as u64, Unit::Count, args.json);
    let store = engine.store().context("experts are not streamed")?.clone();
    let vocab = engine.model().spec().vocab_size as u64;
    let mut s = args.seed;
    let prompt: Vec<u32> = (0..args.prompt_tokens)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % vocab) as u32
        })
        .collect();
    let gen_opts = GenerateOptions {
        max_new: args.new,
        stop_at_eos: false,
        ..GenerateOptions::default()
    };
    let mut after_prefill: Option<StoreStats> = None;
    let mut trace = RouteTrace::with_lookahead(if args.trace.is_some() { super::trace::LOOKAHEAD } else { 0 });
    let g = engine.generate_traced(
        &prompt,
        &gen_opts,
        &mut |_| {
            if after_prefill.is_none() {
                after_prefill = Some(store.stats());
            }
            tokens.inc(1);
            true
        },
        Some(&mut trace),
    )?;
    tokens.finish();
    let prefill_rows = engine.prefill_rows();
    let prefill = after_prefill.clone().unwrap_or_default();
    let decode = store.stats().since(&prefill);
    let routed_bytes = routed_expert_bytes(&trace, prompt.len(), &index);
    if let Some(trace_out) = &mut trace_out {
        let bytes = index.total_bytes() / index.layers.iter().map(|l| l.len() as u64).sum::<u64>().max(1);
        let file = super::trace::to_file(&trace, engine.model().spec(), &args.model, prompt.len(), bytes)?;
        trace_out.write_with(|w| file.write_lines(w))?;
    }
    drop(engine);
    let limit_after = measure_limit(args.seed ^ 0xa11)?;
    let limit = if limit_after.gbps > limit_before.gbps {
        limit_after.clone()
    } else {
        limit_before.clone()
    };
    let steps = g.stats.new_tokens.saturating_sub(1).max(1) as f64;
    let miss_bytes_per_token = decode.bytes_read as f64 / steps;
    let bound = if miss_bytes_per_token > 0.0 {
        limit.gbps * 1e9 / miss_bytes_per_token
    } else {
        f64::INFINITY
    };
    let ratio = g.stats.decode_tok_per_s / bound;
    // Routing overlap over the decoded tokens only.
    let mut decode_trace = RouteTrace::default();
    for (l, routes) in &trace.layers {
        decode_trace.layers.insert(*l, routes[prompt.len().min(routes.len())..].to_vec());
    }
    let (overlap, _) = decode_trace.consecutive_overlap();
    let ids_hash = larder_store::Digest::of(&g.ids.iter().flat_map(|i| i.to_le_bytes()).collect::<Vec<u8>>()).to_string();
    let doc = json!({
        "larder_report": DECODE_REPORT.name,
        "machine": {"cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)},
        "model": {
            "dir": args.model,
            "packed": Manifest::is_store(&args.model),
            "layers": spec.layers.len(),
            "expert_layers": index.expert_layers(),
            "experts_per_layer": index.layers.iter().map(|l| l.len()).max().unwrap_or(0),
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
        "prompt_tokens": prompt.len(),
        "new_tokens": g.stats.new_tokens,
        "prefill_tok_per_s": g.stats.prefill_tok_per_s,
        "prefill_rows_per_pass": prefill_rows,
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
        "routing_overlap": overlap,
        "routing_overlap_uniform": top_k as f64 / index.layers.iter().map(|l| l.len()).max().unwrap_or(1).max(1) as f64,
        "ids_hash": ids_hash,
        "stats": g.stats,
    });
    super::save_json(out.as_mut(), &doc)?;
    if args.json {
        return super::print_json(&doc);
    }
    eprintln!(
        "[larder] prefill: {} tokens, {} rows per pass, read amplification {:.2} ({} read / {} routed), io wait {:.0}%",
        prompt.len(),
        prefill_rows,
        doc["prefill_read_amplification"].as_f64().unwrap_or(0.0),
        larder_store::format_size(prefill.bytes_read),
        larder_store::format_size(routed_bytes),
        100.0 * doc["prefill_io_wait_share"].as_f64().unwrap_or(0.0),
    );
    eprintln!(
        "[larder] drive limit {:.2} GB/s ({}) | prefill {:.2} tok/s | first token {:.2}s | decode {:.3} tok/s | {} per token | hit {:.1}% | io wait {:.0}% | {:.0}% of the I/O bound ({:.3} tok/s) | overlap {:.3}",
        limit.gbps,
        limit.backend,
        g.stats.prefill_tok_per_s,
        g.stats.time_to_first_token_s,
        g.stats.decode_tok_per_s,
        larder_store::format_size(miss_bytes_per_token as u64),
        100.0 * decode.hit_rate(),
        100.0 * doc["io_wait_share"].as_f64().unwrap_or(0.0),
        100.0 * ratio,
        bound,
        overlap
    );
    Ok(())
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
