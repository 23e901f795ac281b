//! `larder bench io`: expert-record reads through each I/O backend, the
//! drive limit (docs/design.md §5); and one arm of random record reads,
//! which `bench decode` measures its drive limit with.

use std::path::PathBuf;

use larder_engine::ReportKind;
use larder_store::bench::{measure_reads, random_experts, ReadMeasurement};
use larder_store::io::{open_backend, IoKind, IoOptions};
use larder_store::ExpertIndex;
use serde_json::{json, Value};

use crate::{BenchError, Observer, Result, Unit};

/// What `bench io --out` writes (`"larder_report": "bench io"`).
pub const IO_REPORT: ReportKind = ReportKind {
    name: "bench io",
    legacy_keys: &["store", "limit_gbps", "results"],
};

/// How one arm reads: backend, O_DIRECT, depth, how many records and how many together.
#[derive(Debug, Clone, Copy)]
pub struct ReadArm {
    pub kind: IoKind,
    pub direct: bool,
    pub depth: usize,
    pub records: usize,
    pub batch: usize,
}

/// Reads `arm.records` random records of `index` (seeded by `seed`) through `arm`'s backend.
pub fn measure(index: &ExpertIndex, arm: ReadArm, seed: u64) -> Result<ReadMeasurement> {
    let backend = open_backend(
        &index.files,
        IoOptions {
            kind: arm.kind,
            direct: arm.direct,
            depth: arm.depth,
        },
    )?;
    let experts = random_experts(index, arm.records, seed);
    Ok(measure_reads(index, &*backend, &experts, arm.batch)?)
}

/// What `bench io` measures.
#[derive(Debug, Clone)]
pub struct IoBenchOptions {
    /// The store or checkpoint folder (named in the report).
    pub store: PathBuf,
    /// Backends to measure, by name.
    pub backends: Vec<String>,
    pub records: usize,
    pub batch: usize,
    pub depth: usize,
    /// Read through the page cache instead of O_DIRECT.
    pub no_direct: bool,
}

/// What `bench io` measured: one measurement per backend.
#[derive(Debug, Clone)]
pub struct IoReport {
    pub store: PathBuf,
    pub results: Vec<ReadMeasurement>,
}

impl IoReport {
    /// The fastest backend's GB/s: the drive limit.
    pub fn limit_gbps(&self) -> f64 {
        self.results.iter().map(|m| m.gbps).fold(0.0, f64::max)
    }

    /// `{"larder_report": "bench io", "store", "limit_gbps", "results"}`.
    pub fn to_json(&self) -> Value {
        json!({"larder_report": IO_REPORT.name, "store": self.store, "limit_gbps": self.limit_gbps(), "results": self.results})
    }
}

/// Runs `bench io` over `index` (the expert index of `opts.store`).
pub fn io(index: &ExpertIndex, opts: &IoBenchOptions, observer: &dyn Observer) -> Result<IoReport> {
    let mut results = Vec::new();
    let progress = observer.task("bench io", opts.backends.len() as u64, Unit::Count);
    for (i, name) in opts.backends.iter().enumerate() {
        let kind = IoKind::parse(name).ok_or_else(|| BenchError::Invalid(format!("unknown backend {name:?}")))?;
        progress.set_message(name);
        let arm = ReadArm {
            kind,
            direct: !opts.no_direct && kind != IoKind::Mmap,
            depth: opts.depth,
            records: opts.records,
            batch: opts.batch,
        };
        let m = measure(index, arm, i as u64 + 1)?;
        observer.detail(&format!(
            "[larder] {:>5} direct={:<5} {} records of {} in batches of {}: {:.2} GB/s",
            m.backend,
            m.direct,
            m.records,
            larder_store::format_size(m.bytes / m.records.max(1) as u64),
            m.batch,
            m.gbps
        ));
        results.push(m);
        progress.inc(1);
    }
    progress.finish();
    Ok(IoReport {
        store: opts.store.clone(),
        results,
    })
}
