//! `larder bench pull`: `larder pull` throughput against the raw range
//! throughput of the same loopback server, measured in the same run
//! (before and after the pull), for a checkpoint folder served over HTTP.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use larder_engine::pull::RemoteCheckpoint;
use larder_engine::ReportKind;
use larder_store::pull::{pull, PullEvent, PullOptions, PullReport};
use larder_store::remote::{open_source, CheckpointSource, FileSource, HubEnv, RemoteOptions};
use serde_json::{json, Value};

use crate::{loopback, BenchError, Observer, Result};

/// Bytes per range request of the raw measurement.
const RAW_CHUNK: u64 = 8 << 20;
/// Bytes written to measure the drive's synced write rate.
const WRITE_PROBE: u64 = 1 << 30;

/// What `bench pull --out` writes (`"larder_report": "bench pull"`).
pub const PULL_REPORT: ReportKind = ReportKind {
    name: "bench pull",
    legacy_keys: &["raw_gbps_before", "raw_gbps_after", "pull_stream_gbps"],
};

/// What `bench pull` measures.
#[derive(Debug, Clone)]
pub struct PullBenchOptions {
    /// Checkpoint folder to serve.
    pub model: PathBuf,
    /// Store folder to pull into (must not exist; removed afterwards unless `keep`).
    pub store: PathBuf,
    /// Files at once and ranges in flight per file (pull), ranges in flight (raw).
    pub jobs: usize,
    /// Keep the pulled store.
    pub keep: bool,
}

/// Refuses a `--store` that exists (it is removed afterwards).
pub fn check_store(store: &Path) -> Result<()> {
    if store.exists() {
        return Err(BenchError::Invalid(format!(
            "--store {} exists; give a folder that does not (it is removed afterwards)",
            store.display()
        )));
    }
    Ok(())
}

/// When the pull's streaming phase started and ended.
#[derive(Default)]
struct StreamSpan {
    start: Mutex<Option<Instant>>,
    end: Mutex<Option<Instant>>,
}

impl StreamSpan {
    fn seconds(&self, otherwise: f64) -> f64 {
        match (*lock(&self.start), *lock(&self.end)) {
            (Some(a), Some(b)) => (b - a).as_secs_f64(),
            _ => otherwise,
        }
    }
}

/// Runs `bench pull`; its JSON document (`"larder_report": "bench pull"`).
pub fn run(opts: &PullBenchOptions, observer: &dyn Observer) -> Result<Value> {
    check_store(&opts.store)?;
    let url = loopback::serve(&opts.model).map_err(|e| BenchError::io("starting the loopback server", e))?;
    let env = HubEnv::default();
    let source = CheckpointSource::parse(&url, &env)?;
    let remote = open_source(&source, &env, &RemoteOptions::default())?;
    let described = larder_engine::pull::describe_remote(remote.as_ref(), &opts.store.join(".pull"))?;
    let names: Vec<(String, u64)> = described.files.iter().map(|f| (f.name.clone(), f.size)).collect();
    let total: u64 = names.iter().map(|f| f.1).sum();
    let jobs = opts.jobs;
    observer.note(&format!(
        "[larder] {} shards, {:.2} GB, served at {url}",
        names.len(),
        total as f64 / 1e9
    ));
    let raw_before = raw_gbps(remote.as_ref(), &names, jobs)?;
    observer.note(&format!("[larder] raw range reads: {raw_before:.2} GB/s"));
    let write_before = write_gbps(&opts.store, total.min(WRITE_PROBE))?;
    observer.note(&format!("[larder] drive writes (synced): {write_before:.2} GB/s"));

    let (report, stream_s, total_s) = timed_pull(remote.as_ref(), &described, &opts.store, jobs)?;
    let raw_after = raw_gbps(remote.as_ref(), &names, jobs)?;
    let write_after = write_gbps(&opts.store, total.min(WRITE_PROBE))?;
    if !opts.keep {
        std::fs::remove_dir_all(&opts.store).map_err(|e| BenchError::io(format!("removing {}", opts.store.display()), e))?;
    }
    let raw_mean = (raw_before + raw_after) / 2.0;
    let stream_gbps = total as f64 / stream_s / 1e9;
    let doc = json!({
        "larder_report": PULL_REPORT.name,
        "model": opts.model,
        "bytes": total,
        "shards": names.len(),
        "jobs": jobs,
        "raw_gbps_before": raw_before,
        "raw_gbps_after": raw_after,
        "drive_write_gbps_before": write_before,
        "drive_write_gbps_after": write_after,
        "pull_stream_seconds": stream_s,
        "pull_stream_gbps": stream_gbps,
        "pull_total_seconds": total_s,
        "pull_total_gbps": total as f64 / total_s / 1e9,
        "ratio_stream_to_raw": stream_gbps / raw_mean,
        "experts": report.experts,
    });
    observer.note(&format!(
        "[larder] pull: streaming {stream_gbps:.2} GB/s ({:.2} of raw {raw_mean:.2} GB/s), end to end {:.2} GB/s \
         with sealing (digests and read-back); raw after: {raw_after:.2} GB/s; drive writes {write_before:.2} / \
         {write_after:.2} GB/s (before / after)",
        stream_gbps / raw_mean,
        total as f64 / total_s / 1e9
    ));
    Ok(doc)
}

/// Pulls `described` into `store`; the report, the streaming phase's seconds and the whole pull's.
fn timed_pull(remote: &dyn FileSource, described: &RemoteCheckpoint, store: &Path, jobs: usize) -> Result<(PullReport, f64, f64)> {
    let span = StreamSpan::default();
    let pull_opts = PullOptions {
        jobs,
        ranges: jobs,
        ..PullOptions::default()
    };
    let started = Instant::now();
    let report = pull(remote, &described.files, &described.source, store, &[], pull_opts, &|ev| match ev {
        PullEvent::Started { .. } => *lock(&span.start) = Some(Instant::now()),
        PullEvent::Sealing => *lock(&span.end) = Some(Instant::now()),
        _ => {}
    })?;
    let total_s = started.elapsed().as_secs_f64();
    Ok((report, span.seconds(total_s), total_s))
}

/// Reads every shard in [`RAW_CHUNK`] ranges, `jobs` in flight, dropping
/// the bytes; GB/s.
fn raw_gbps(remote: &dyn FileSource, files: &[(String, u64)], jobs: usize) -> Result<f64> {
    let started = Instant::now();
    let mut bytes = 0u64;
    for (name, size) in files {
        let ranges: Vec<(u64, u64)> = (0..size.div_ceil(RAW_CHUNK))
            .map(|i| (i * RAW_CHUNK, RAW_CHUNK.min(size - i * RAW_CHUNK)))
            .collect();
        for group in ranges.chunks(jobs * 2) {
            bytes += remote.read_ranges(name, group, jobs)?.iter().map(|b| b.len() as u64).sum::<u64>();
        }
    }
    Ok(bytes as f64 / started.elapsed().as_secs_f64() / 1e9)
}

/// Writes `bytes` into a probe file in `dir` (8 MiB writes, then
/// `fdatasync`), removes it; GB/s. Pull's writes land on the same drive.
fn write_gbps(dir: &Path, bytes: u64) -> Result<f64> {
    use std::io::Write;
    std::fs::create_dir_all(dir).map_err(|e| BenchError::io(format!("creating {}", dir.display()), e))?;
    let path = dir.join("bench-write-probe");
    let io = |e| BenchError::io(format!("writing {}", path.display()), e);
    let buf = vec![0x5au8; 8 << 20];
    let started = Instant::now();
    let mut f = std::fs::File::create(&path).map_err(|e| BenchError::io(format!("creating {}", path.display()), e))?;
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n]).map_err(io)?;
        left -= n as u64;
    }
    f.sync_data().map_err(io)?;
    let gbps = bytes as f64 / started.elapsed().as_secs_f64() / 1e9;
    drop(f);
    std::fs::remove_file(&path).map_err(|e| BenchError::io(format!("removing {}", path.display()), e))?;
    Ok(gbps)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
