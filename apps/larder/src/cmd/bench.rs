//! `larder bench`: measured speed against the physical limit of the same
//! run. The subcommands' flags, output and exit codes live here and in
//! `bench_*.rs`; the measuring is `larder_bench`'s. `larder bench kernels`
//! (here): weight-format kernels vs. RAM bandwidth and this core's compute
//! roofs (`larder_bench::kernels`).

use clap::Subcommand;
use larder_bench::kernels::{KernelOptions, KERNELS_REPORT};
use larder_engine::RunInputs;

use super::progress::Shown;

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

fn kernels(args: KernelArgs) -> anyhow::Result<()> {
    let mut out = super::check_report_out(args.out.as_deref(), KERNELS_REPORT, args.output, &RunInputs::new())?;
    let opts = KernelOptions {
        threads: args.threads,
        quick: args.quick,
        no_candle: args.no_candle,
        formats: args.formats,
        shapes: args.shapes,
        rows: args.rows,
        path: args.path,
    };
    let report = larder_bench::kernels::run(&opts, &Shown { json: args.json })?;
    let doc = report.to_json();
    super::save_json(out.as_mut(), &doc)?;
    if args.json {
        return super::print_json(&doc);
    }
    print!("{}", larder_tools::text::kernels_table(&report));
    Ok(())
}
