//! `larder bench pull`: `larder pull` throughput against the raw range
//! throughput of the same loopback server, measured in the same run
//! (before and after the pull), for a checkpoint folder served over HTTP.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::Context;
use larder_engine::{ReportKind, RunInputs};
use larder_store::pull::{pull, PullEvent, PullOptions};
use larder_store::remote::{open_source, CheckpointSource, FileSource, HubEnv, RemoteOptions};
use serde_json::json;

use super::loopback_files;

/// Bytes per range request of the raw measurement.
const RAW_CHUNK: u64 = 8 << 20;
/// Bytes written to measure the drive's synced write rate.
const WRITE_PROBE: u64 = 1 << 30;

/// Arguments of `larder bench pull`.
#[derive(clap::Args)]
#[command(
    after_help = "Serves --model on a loopback HTTP server (byte ranges, keep-alive) and measures: the \
raw range throughput (every shard read in 8 MiB ranges, --jobs at once, bytes dropped), then `larder pull` \
of the same URL into --store (streaming: each shard once, hashed, scattered into records and spine; then \
sealing: every record digested and read back), then the raw throughput again. The ratio is pull's streaming \
rate over the mean raw rate. Pick a checkpoint that fits in RAM twice (the server reads through the page \
cache).\n\nExample:\n  larder bench pull --model ./k3mini --store /fast/bench-pull --json --out bench/results/pull.json"
)]
pub struct PullArgs {
    /// Checkpoint folder to serve.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// Store folder to pull into (removed afterwards unless --keep).
    #[arg(long, value_name = "DIR")]
    store: PathBuf,
    /// Files at once and ranges in flight per file (pull), ranges in flight (raw), 1 to 64.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    jobs: u64,
    /// Keep the pulled store.
    #[arg(long)]
    keep: bool,
    /// Print one JSON document on stdout.
    #[arg(long)]
    json: bool,
    /// Also write the JSON document to this file (not in --model or --store; an existing report of `bench pull`
    /// only with --overwrite).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    #[command(flatten)]
    output: super::OverwriteArg,
}

/// What `bench pull --out` writes (`"larder_report": "bench pull"`).
pub const PULL_REPORT: ReportKind = ReportKind {
    name: "bench pull",
    legacy_keys: &["raw_gbps_before", "raw_gbps_after", "pull_stream_gbps"],
};

pub fn pull_bench(args: PullArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.store.exists(),
        "--store {} exists; give a folder that does not (it is removed afterwards)",
        args.store.display()
    );
    let inputs = RunInputs::new().model("--model", &args.model).folder("--store", &args.store);
    let mut out = super::check_report_out(args.out.as_deref(), PULL_REPORT, args.output, &inputs)?;
    let url = loopback_files::serve(&args.model).context("starting the loopback server")?;
    let env = HubEnv::default();
    let source = CheckpointSource::parse(&url, &env)?;
    let remote = open_source(&source, &env, &RemoteOptions::default())?;
    let described = larder_engine::pull::describe_remote(remote.as_ref(), &args.store.join(".pull"))?;
    let names: Vec<(String, u64)> = described.files.iter().map(|f| (f.name.clone(), f.size)).collect();
    let total: u64 = names.iter().map(|f| f.1).sum();
    let jobs = args.jobs as usize;
    eprintln!("[larder] {} shards, {:.2} GB, served at {url}", names.len(), total as f64 / 1e9);
    let raw_before = raw_gbps(remote.as_ref(), &names, jobs)?;
    eprintln!("[larder] raw range reads: {raw_before:.2} GB/s");
    let write_before = write_gbps(&args.store, total.min(WRITE_PROBE))?;
    eprintln!("[larder] drive writes (synced): {write_before:.2} GB/s");

    let stream_start = Mutex::new(None::<Instant>);
    let stream_end = Mutex::new(None::<Instant>);
    let opts = PullOptions {
        jobs,
        ranges: jobs,
        ..PullOptions::default()
    };
    let started = Instant::now();
    let report = pull(
        remote.as_ref(),
        &described.files,
        &described.source,
        &args.store,
        &[],
        opts,
        &|ev| match ev {
            PullEvent::Started { .. } => *lock(&stream_start) = Some(Instant::now()),
            PullEvent::Sealing => *lock(&stream_end) = Some(Instant::now()),
            _ => {}
        },
    )?;
    let total_s = started.elapsed().as_secs_f64();
    let (a, b) = (*lock(&stream_start), *lock(&stream_end));
    let stream_s = match (a, b) {
        (Some(a), Some(b)) => (b - a).as_secs_f64(),
        _ => total_s,
    };
    let raw_after = raw_gbps(remote.as_ref(), &names, jobs)?;
    let write_after = write_gbps(&args.store, total.min(WRITE_PROBE))?;
    if !args.keep {
        std::fs::remove_dir_all(&args.store).with_context(|| format!("removing {}", args.store.display()))?;
    }
    let raw_mean = (raw_before + raw_after) / 2.0;
    let stream_gbps = total as f64 / stream_s / 1e9;
    let doc = json!({
        "larder_report": PULL_REPORT.name,
        "model": args.model,
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
    eprintln!(
        "[larder] pull: streaming {stream_gbps:.2} GB/s ({:.2} of raw {raw_mean:.2} GB/s), end to end {:.2} GB/s \
         with sealing (digests and read-back); raw after: {raw_after:.2} GB/s; drive writes {write_before:.2} / \
         {write_after:.2} GB/s (before / after)",
        stream_gbps / raw_mean,
        total as f64 / total_s / 1e9
    );
    super::save_json(out.as_mut(), &doc)?;
    if args.json {
        super::print_json(&doc)?;
    }
    Ok(())
}

/// Reads every shard in [`RAW_CHUNK`] ranges, `jobs` in flight, dropping
/// the bytes; GB/s.
fn raw_gbps(remote: &dyn FileSource, files: &[(String, u64)], jobs: usize) -> anyhow::Result<f64> {
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
fn write_gbps(dir: &std::path::Path, bytes: u64) -> anyhow::Result<f64> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    let path = dir.join("bench-write-probe");
    let buf = vec![0x5au8; 8 << 20];
    let started = Instant::now();
    let mut f = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.sync_data()?;
    let gbps = bytes as f64 / started.elapsed().as_secs_f64() / 1e9;
    drop(f);
    std::fs::remove_file(&path)?;
    Ok(gbps)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
