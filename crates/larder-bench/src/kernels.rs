//! `larder bench kernels`: measured speed against the physical limit of the same run.
//!
//! First one thread's RAM read bandwidth and this core's compute roofs (the
//! kernels' inner steps with everything in L1; a kernel streaming from RAM
//! reaches at most the lower roof), then the weight bytes per second of every
//! weight format at the shapes of real MoE layers, for 1, 8 and 64 activation
//! rows, cold (weights streamed from RAM) and hot (the same weight again), and
//! candle's own matmul on the same dense weights, cold and hot, in the same
//! thread pool, for comparison.

use std::time::Duration;

use larder_engine::ReportKind;
use larder_tensor::bench::roofs::{self, Roof};
use larder_tensor::bench::{bench_formats, ram_read_gbps, CandleSet, WeightSet, COLD_SET_BYTES};
use larder_tensor::kernels::{active_path, KernelPath};
use larder_tensor::WeightFormat;
use serde_json::{json, Value};

use crate::{BenchError, Observer, Result, Task, Unit};

/// What `bench kernels --out` writes (`"larder_report": "bench kernels"`; `plan --kernels` reads it).
pub const KERNELS_REPORT: ReportKind = ReportKind {
    name: "bench kernels",
    legacy_keys: &["ram_gbps", "path", "threads", "results"],
};

/// Largest K or N of a `--shapes` entry (real MoE layers stay under 20000).
const MAX_DIM: usize = 1 << 16;

/// What to measure (the CLI's flags).
#[derive(Debug, Clone, Default)]
pub struct KernelOptions {
    /// Threads for the kernels (the RAM bandwidth is measured with one).
    pub threads: usize,
    /// Small shapes, a small "cold" set and short timings (a smoke test).
    pub quick: bool,
    /// Skip candle's matmul.
    pub no_candle: bool,
    /// Only these formats (empty: all).
    pub formats: Vec<String>,
    /// Only these shapes, as `KxN` (empty: the plan's).
    pub shapes: Vec<String>,
    /// Only these activation row counts (empty: the plan's).
    pub rows: Vec<usize>,
    /// Kernel path to measure (None: the one larder uses on this CPU).
    pub path: Option<String>,
}

/// One (format, shape, rows, cold/hot) case.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KernelResult {
    pub dtype: String,
    pub format: String,
    pub rows: usize,
    pub k: usize,
    pub n: usize,
    pub threads: usize,
    pub cold: bool,
    pub seconds: f64,
    pub gbps: f64,
    pub ratio_to_ram: f64,
    pub candle_gbps: Option<f64>,
}

/// What a `bench kernels` run measured.
#[derive(Debug, Clone)]
pub struct KernelReport {
    pub ram_gbps: f64,
    pub roofs: Vec<Roof>,
    pub path: KernelPath,
    pub threads: usize,
    pub results: Vec<KernelResult>,
}

impl KernelReport {
    /// `{"larder_report": "bench kernels", "ram_gbps", "compute_roofs", "path", "threads", "results"}`.
    pub fn to_json(&self) -> Value {
        let roofs: Vec<_> = self
            .roofs
            .iter()
            .map(|r| json!({ "stream": r.stream, "ginstr_per_s": r.ginstr_per_s, "weight_gbps": r.weight_gbps }))
            .collect();
        let results: Vec<_> = self.results.iter().map(|r| json!(r)).collect();
        json!({
            "larder_report": KERNELS_REPORT.name, "ram_gbps": self.ram_gbps, "compute_roofs": roofs,
            "path": self.path.name(), "threads": self.threads, "results": results,
        })
    }

    /// The compute roofs on one line.
    pub fn roofs_summary(&self) -> String {
        roofs::summary(&self.roofs)
    }
}

/// What a run measures unless told otherwise, and how long.
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

/// The kernel path `--path` names (checked against this CPU), or the active one.
fn kernel_path(name: Option<&str>) -> Result<KernelPath> {
    let Some(name) = name else {
        return Ok(active_path());
    };
    let path = KernelPath::from_name(name)
        .ok_or_else(|| BenchError::Invalid(format!("unknown kernel path {name:?} (scalar, avx2, avx512, neon)")))?;
    if !path.is_supported() {
        let have: Vec<&str> = KernelPath::available().iter().map(|p| p.name()).collect();
        return Err(BenchError::Invalid(format!(
            "--path {name}: this CPU cannot run that kernel path (it has: {})",
            have.join(", ")
        )));
    }
    Ok(path)
}

/// `--shapes` as (K, N) pairs, each checked.
fn parse_shapes(shapes: &[String]) -> Result<Vec<(usize, usize)>> {
    let parsed = shapes
        .iter()
        .map(|s| {
            let (k, n) = s
                .split_once('x')
                .ok_or_else(|| BenchError::Invalid(format!("shape {s:?} is not KxN")))?;
            let dim = |d: &str| d.parse().map_err(|e| BenchError::Invalid(format!("shape {s:?}: {e}")));
            Ok((dim(k)?, dim(n)?))
        })
        .collect::<Result<Vec<(usize, usize)>>>()?;
    if parsed
        .iter()
        .any(|&(k, n)| k == 0 || n == 0 || k % 32 != 0 || k > MAX_DIM || n > MAX_DIM)
    {
        return Err(BenchError::Invalid(format!(
            "--shapes: K and N must be 1 to {MAX_DIM}, with K a multiple of 32"
        )));
    }
    Ok(parsed)
}

/// The formats `--formats` keeps (all when empty).
fn formats(only: &[String]) -> Result<Vec<(&'static str, WeightFormat)>> {
    let formats: Vec<(&str, WeightFormat)> = bench_formats()
        .into_iter()
        .filter(|(name, _)| only.is_empty() || only.iter().any(|f| f == name))
        .collect();
    if formats.is_empty() {
        return Err(BenchError::Invalid(
            "--formats matched none of f32, f16, bf16, fp8, mxfp4, int4".into(),
        ));
    }
    Ok(formats)
}

/// How every case is measured: the kernel path, the pool, the plan's timings and the RAM bandwidth.
struct Cases<'a> {
    path: KernelPath,
    pool: &'a rayon::ThreadPool,
    plan: &'a Plan,
    no_candle: bool,
    threads: usize,
    ram_gbps: f64,
}

impl Cases<'_> {
    /// One format at one shape: every row count, cold then hot, ours and candle's.
    fn measure(
        &self,
        (name, format): (&str, WeightFormat),
        (k, n): (usize, usize),
        rows: &[usize],
        bar: &dyn Task,
    ) -> Result<Vec<KernelResult>> {
        let (plan, pool) = (self.plan, self.pool);
        let set = WeightSet::new(format, n, k, plan.cold_bytes);
        // candle on the same weights, cold and hot, in the same pool.
        let candle_set = if self.no_candle {
            None
        } else {
            CandleSet::new(&set).map_err(|e| BenchError::Failed(format!("candle weights: {e}")))?
        };
        let mut results = Vec::new();
        for &m in rows {
            for cold in [true, false] {
                let candle = candle_set.as_ref().and_then(|cs| {
                    let b = if m >= 64 { Duration::ZERO } else { plan.budget };
                    pool.install(|| cs.measure(m, cold, b)).ok()
                });
                let c = pool.install(|| set.measure(self.path, m, cold, plan.budget));
                results.push(KernelResult {
                    dtype: name.to_string(),
                    format: format.to_string(),
                    rows: m,
                    k,
                    n,
                    threads: self.threads,
                    cold,
                    seconds: c.seconds,
                    gbps: c.gbps,
                    ratio_to_ram: c.gbps / self.ram_gbps,
                    candle_gbps: candle,
                });
                bar.inc(1);
            }
        }
        Ok(results)
    }
}

/// Runs `bench kernels`.
pub fn run(opts: &KernelOptions, observer: &dyn Observer) -> Result<KernelReport> {
    let path = kernel_path(opts.path.as_deref())?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.threads)
        .build()
        .map_err(|e| BenchError::Failed(format!("cannot build the benchmark thread pool: {e}")))?;
    let plan = if opts.quick { Plan::QUICK } else { Plan::FULL };
    let parsed = parse_shapes(&opts.shapes)?;
    let shapes: &[(usize, usize)] = if parsed.is_empty() { plan.shapes } else { &parsed };
    let rows: &[usize] = if opts.rows.is_empty() { plan.rows } else { &opts.rows };
    let formats = formats(&opts.formats)?;

    observer.note(&format!(
        "measuring RAM read bandwidth (1 thread, {} MiB) ...",
        plan.ram_bytes >> 20
    ));
    let ram = ram_read_gbps(plan.ram_bytes);
    observer.note(&format!(
        "RAM read: {ram:.2} GB/s; kernel path {}, {} thread(s)",
        path.name(),
        opts.threads
    ));
    observer.note("measuring compute roofs (1 thread) ...");
    let roofs = roofs::measure(plan.roof_secs);

    let cases = Cases {
        path,
        pool: &pool,
        plan: &plan,
        no_candle: opts.no_candle,
        threads: opts.threads,
        ram_gbps: ram,
    };
    let total = (shapes.len() * formats.len() * rows.len() * 2) as u64;
    let bar = observer.task("bench kernels", total, Unit::Count);
    let mut results = Vec::new();
    for &shape in shapes {
        for &(name, format) in &formats {
            bar.set_message(&format!("{name} {}x{}", shape.0, shape.1));
            results.extend(cases.measure((name, format), shape, rows, bar.as_ref())?);
        }
    }
    bar.finish();
    Ok(KernelReport {
        ram_gbps: ram,
        roofs,
        path,
        threads: opts.threads,
        results,
    })
}
