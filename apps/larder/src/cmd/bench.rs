//! `larder bench`: measured speed against the physical limit of the same run.
//!
//! `larder bench kernels` first measures one thread's RAM read bandwidth and
//! this core's compute roofs (the kernels' inner steps with everything in
//! L1; a kernel streaming from RAM reaches at most the lower roof), then
//! the weight bytes per second of every weight format at the shapes of real
//! MoE layers, for 1, 8 and 64 activation rows, cold (weights streamed from
//! RAM) and hot (the same weight again), and candle's own matmul on the same
//! dense weights, cold and hot, in the same thread pool, for comparison.

use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use larder_engine::{ReportKind, RunInputs};
use larder_tensor::bench::{bench_formats, ram_read_gbps, roofs, CandleSet, WeightSet, COLD_SET_BYTES};
use larder_tensor::kernels::{active_path, KernelPath};
use larder_tensor::WeightFormat;
use serde_json::json;

use super::progress::{Progress, Unit};

/// What to benchmark.
#[derive(Subcommand)]
pub enum Bench {
    /// Weight-format GEMV/GEMM kernels vs. RAM bandwidth and this core's compute roofs (and candle's matmul).
    Kernels(KernelArgs),
    /// Expert-record reads through each I/O backend: the drive limit.
    Io(super::bench_store::IoArgs),
    /// Decode speed streaming experts, vs. the drive limit measured in the same run.
    Decode(super::bench_store::DecodeArgs),
    /// The real server over loopback HTTP: concurrent streaming clients' tok/s, TTFT, expert bytes per token.
    Serve(super::bench_serve::ServeArgs),
    /// `larder pull` from a loopback HTTP server vs. that server's raw range throughput.
    Pull(super::bench_pull::PullArgs),
    /// Replay a route trace against every cache policy and Belady's optimum at several RAM budgets.
    Cache(super::bench_cache::CacheArgs),
    /// Lazy mode over a throttled loopback link: decode tok/s first pass (fetching) vs. second pass (drive).
    Lazy(super::bench_lazy::LazyArgs),
    /// A named scenario manifest (bench/manifests/*.toml): interleaved arms, oracle check, results JSON, summary and charts.
    Run(super::bench_run::RunArgs),
}

/// Arguments of `larder bench kernels`.
#[derive(clap::Args)]
pub struct KernelArgs {
    /// Print one JSON document: {"larder_report": "bench kernels", "ram_gbps",
    /// "compute_roofs": [...], "path", "threads", "results": [...]}.
    #[arg(long)]
    json: bool,
    /// Threads for the kernels, 1 to 1024 (the RAM bandwidth is measured with one).
    #[arg(long, default_value_t = 1, value_parser = super::range(1, super::MAX_THREADS))]
    threads: usize,
    /// Small shapes, a small "cold" set and short timings (a smoke test, not a measurement).
    #[arg(long)]
    quick: bool,
    /// Skip candle's matmul (it is slow for bf16/f16).
    #[arg(long)]
    no_candle: bool,
    /// Only these formats (f32, f16, bf16, fp8, mxfp4, int4), comma-separated.
    #[arg(long, value_delimiter = ',')]
    formats: Vec<String>,
    /// Only these shapes, as KxN (e.g. 7168x2048), comma-separated: K a
    /// multiple of 32, K and N from 1 to 65536.
    #[arg(long, value_delimiter = ',')]
    shapes: Vec<String>,
    /// Only these activation row counts (1 to 1024 each), comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = super::range(1, super::MAX_BATCH))]
    rows: Vec<usize>,
    /// Also write the JSON document to this file (an existing report of `bench kernels` only with --overwrite).
    #[arg(long, value_name = "FILE")]
    out: Option<std::path::PathBuf>,
    #[command(flatten)]
    output: super::OverwriteArg,
    /// Kernel path to measure (scalar, avx2, avx512, neon); default: the one
    /// larder uses on this CPU (`LARDER_KERNEL` overrides it). Measure
    /// `avx512` here before choosing it with `LARDER_KERNEL=avx512`.
    #[arg(long, value_name = "PATH")]
    path: Option<String>,
}

pub fn run(bench: Bench) -> anyhow::Result<()> {
    match bench {
        Bench::Kernels(a) => kernels(a),
        Bench::Io(a) => super::bench_store::io(a),
        Bench::Decode(a) => super::bench_store::decode(a),
        Bench::Cache(a) => super::bench_cache::run(a),
        Bench::Serve(a) => super::bench_serve::serve(a),
        Bench::Pull(a) => super::bench_pull::pull_bench(a),
        Bench::Lazy(a) => super::bench_lazy::lazy_bench(a),
        Bench::Run(a) => super::bench_run::run(a),
    }
}

/// What a `larder bench kernels` run measures unless told otherwise, and how long.
struct Plan {
    shapes: &'static [(usize, usize)],
    rows: &'static [usize],
    /// Timing budget per case.
    budget: Duration,
    /// Bytes read to measure RAM bandwidth.
    ram_bytes: usize,
    /// Bytes of distinct weights a cold case cycles through.
    cold_bytes: usize,
    /// Seconds per compute-roof stream.
    roof_secs: f64,
}

impl Plan {
    /// A smoke test, not a measurement.
    const QUICK: Plan = Plan {
        shapes: &[(512, 256)],
        rows: &[1, 8],
        budget: Duration::from_millis(20),
        ram_bytes: 64 << 20,
        cold_bytes: 4 << 20,
        roof_secs: 0.01,
    };
    /// The shapes of real MoE layers.
    const FULL: Plan = Plan {
        shapes: &[(7168, 2048), (2048, 1408), (4096, 1536)],
        rows: &[1, 8, 64],
        budget: Duration::from_millis(400),
        ram_bytes: 1 << 30,
        cold_bytes: COLD_SET_BYTES,
        roof_secs: 0.5,
    };
}

/// What `bench kernels --out` writes (`"larder_report": "bench kernels"`; `plan --kernels` reads it).
pub const KERNELS_REPORT: ReportKind = ReportKind {
    name: "bench kernels",
    legacy_keys: &["ram_gbps", "path", "threads", "results"],
};

/// Largest K or N of a `--shapes` entry (real MoE layers stay under 20000).
const MAX_DIM: usize = 1 << 16;

fn kernels(args: KernelArgs) -> anyhow::Result<()> {
    let mut out = super::check_report_out(args.out.as_deref(), KERNELS_REPORT, args.output, &RunInputs::new())?;
    let path: KernelPath = match &args.path {
        None => active_path(),
        Some(name) => {
            let path = KernelPath::from_name(name).with_context(|| format!("unknown kernel path {name:?} (scalar, avx2, avx512, neon)"))?;
            let have: Vec<&str> = KernelPath::available().iter().map(|p| p.name()).collect();
            anyhow::ensure!(
                path.is_supported(),
                "--path {name}: this CPU cannot run that kernel path (it has: {})",
                have.join(", ")
            );
            path
        }
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build()
        .context("cannot build the benchmark thread pool")?;
    let plan = if args.quick { Plan::QUICK } else { Plan::FULL };
    let parsed: Vec<(usize, usize)> = args
        .shapes
        .iter()
        .map(|s| {
            let (k, n) = s.split_once('x').with_context(|| format!("shape {s:?} is not KxN"))?;
            Ok((
                k.parse().with_context(|| format!("shape {s:?}"))?,
                n.parse().with_context(|| format!("shape {s:?}"))?,
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    let shapes: &[(usize, usize)] = if parsed.is_empty() { plan.shapes } else { &parsed };
    let rows: &[usize] = if args.rows.is_empty() { plan.rows } else { &args.rows };
    if shapes
        .iter()
        .any(|&(k, n)| k == 0 || n == 0 || k % 32 != 0 || k > MAX_DIM || n > MAX_DIM)
    {
        anyhow::bail!("--shapes: K and N must be 1 to {MAX_DIM}, with K a multiple of 32");
    }
    let formats: Vec<(&str, WeightFormat)> = bench_formats()
        .into_iter()
        .filter(|(name, _)| args.formats.is_empty() || args.formats.iter().any(|f| f == name))
        .collect();
    if formats.is_empty() {
        anyhow::bail!("--formats matched none of f32, f16, bf16, fp8, mxfp4, int4");
    }

    eprintln!("measuring RAM read bandwidth (1 thread, {} MiB) ...", plan.ram_bytes >> 20);
    let ram = ram_read_gbps(plan.ram_bytes);
    eprintln!("RAM read: {ram:.2} GB/s; kernel path {}, {} thread(s)", path.name(), args.threads);
    eprintln!("measuring compute roofs (1 thread) ...");
    let roofs = roofs::measure(plan.roof_secs);
    let roofs_json: Vec<_> = roofs
        .iter()
        .map(|r| json!({ "stream": r.stream, "ginstr_per_s": r.ginstr_per_s, "weight_gbps": r.weight_gbps }))
        .collect();

    let total = (shapes.len() * formats.len() * rows.len() * 2) as u64;
    let bar = Progress::new("bench kernels", total, Unit::Count, args.json);
    let mut results = Vec::new();
    for &(k, n) in shapes {
        for (name, format) in &formats {
            bar.set_message(&format!("{name} {k}x{n}"));
            let set = WeightSet::new(*format, n, k, plan.cold_bytes);
            // candle on the same weights, cold and hot, in the same pool.
            let candle_set = if args.no_candle {
                None
            } else {
                CandleSet::new(&set).context("candle weights")?
            };
            for &m in rows {
                for cold in [true, false] {
                    let candle = candle_set.as_ref().and_then(|cs| {
                        let b = if m >= 64 { Duration::ZERO } else { plan.budget };
                        pool.install(|| cs.measure(m, cold, b)).ok()
                    });
                    let c = pool.install(|| set.measure(path, m, cold, plan.budget));
                    results.push(json!({
                        "dtype": name, "format": format.to_string(), "rows": m, "k": k, "n": n,
                        "threads": args.threads, "cold": cold, "seconds": c.seconds, "gbps": c.gbps,
                        "ratio_to_ram": c.gbps / ram, "candle_gbps": candle,
                    }));
                    bar.inc(1);
                }
            }
        }
    }
    bar.finish();
    let doc = json!({
        "larder_report": KERNELS_REPORT.name, "ram_gbps": ram, "compute_roofs": roofs_json, "path": path.name(),
        "threads": args.threads, "results": results,
    });
    super::save_json(out.as_mut(), &doc)?;
    if args.json {
        return super::print_json(&doc);
    }
    println!(
        "RAM read bandwidth (1 thread): {ram:.2} GB/s   kernel path: {}   threads: {}",
        path.name(),
        args.threads
    );
    println!("compute roofs (1 thread, everything in L1): {}", roofs::summary(&roofs));
    println!(
        "{:<6} {:>5} {:>11} {:>5} {:>9} {:>7} {:>9} {:>9}",
        "dtype", "rows", "k x n", "cache", "GB/s", "of RAM", "candle", "vs 1-row"
    );
    let mut one_row = std::collections::HashMap::new();
    for r in &results {
        let key = (r["dtype"].to_string(), r["k"].as_u64(), r["cold"].as_bool());
        let secs = r["seconds"].as_f64().unwrap_or(0.0);
        if r["rows"] == 1 {
            one_row.insert(key.clone(), secs);
        }
        let rel = one_row.get(&key).map_or(String::new(), |s| format!("{:.2}x", secs / s));
        let candle = r["candle_gbps"].as_f64().map_or("-".into(), |g| format!("{g:.2}"));
        println!(
            "{:<6} {:>5} {:>11} {:>5} {:>9.2} {:>6.0}% {:>9} {:>9}",
            r["dtype"].as_str().unwrap_or(""),
            r["rows"],
            format!("{}x{}", r["k"], r["n"]),
            if r["cold"] == true { "cold" } else { "hot" },
            r["gbps"].as_f64().unwrap_or(0.0),
            r["ratio_to_ram"].as_f64().unwrap_or(0.0) * 100.0,
            candle,
            rel
        );
    }
    Ok(())
}
