//! `larder verify`: re-read every record of a packed store and check its digest.

use std::path::PathBuf;

use anyhow::{bail, Context};
use serde_json::json;

/// Arguments of `larder verify`.
#[derive(clap::Args)]
#[command(
    after_help = "Reads with O_DIRECT where the file system allows, so the drive is checked, not the page cache.\n\n\
Example:\n  larder verify ./k3mini.store --json"
)]
pub struct Args {
    /// Packed store folder (made by `larder pack`).
    #[arg(value_name = "STORE")]
    store: PathBuf,
    /// Print one JSON report on stdout: {"records", "bytes", "seconds", "bad": [...]}.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let manifest =
        larder_store::Manifest::read(&args.store).with_context(|| format!("{} is not a readable store", args.store.display()))?;
    let total: u64 = manifest
        .layers
        .iter()
        .map(|l| l.experts.len() as u64 * l.parts.iter().map(|p| p.len).sum::<u64>())
        .sum();
    let bar = super::progress_bar(total, "verifying [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}");
    let report = larder_store::verify::verify_store(&args.store, &mut |b| bar.inc(b))?;
    bar.finish_and_clear();
    if args.json {
        super::print_json(&json!(report))?;
    } else {
        eprintln!(
            "[larder] {} records, {} checked in {:.1}s ({:.2} GB/s)",
            report.records,
            larder_store::format_size(report.bytes),
            report.seconds,
            report.bytes as f64 / report.seconds.max(1e-9) / 1e9
        );
        for b in &report.bad {
            eprintln!("[larder] BAD {b}");
        }
    }
    if !report.bad.is_empty() {
        bail!("{} of {} records are corrupt", report.bad.len(), report.records);
    }
    Ok(())
}
