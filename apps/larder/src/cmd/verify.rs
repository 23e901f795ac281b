//! `larder verify`: prove a packed store is exactly the checkpoint it was
//! packed from: manifest, carried files, spine, layer files, every record,
//! and that it loads as a model.

use std::path::PathBuf;

use anyhow::bail;
use serde_json::json;

use super::progress::{Progress, Unit};

/// Arguments of `larder verify`.
#[derive(clap::Args)]
#[command(
    after_help = "Checks the manifest's own digest, every carried file (config, tokenizer, templates), the spine's \
header and every spine tensor, every layer file's header and every expert record's digest (bound to its store, \
layer, expert, dtype and shape), then that the store loads as a model. Reads with O_DIRECT where the file system \
allows, so the drive is checked, not the page cache. Exit 0 only if all of it holds; otherwise every problem is \
listed, and `larder pack --model CHECKPOINT --out STORE --repair` rewrites what is bad.\n\n\
Example:\n  larder verify ./k3mini.store --json"
)]
pub struct Args {
    /// Packed store folder (made by `larder pack`).
    #[arg(value_name = "STORE")]
    store: PathBuf,
    /// Print one JSON report on stdout: {"ok", "store_id", "model_type", "source", "files", "spine_tensors",
    /// "spine_bytes", "records", "bytes", "mirrored_records", "seconds", "gbps", "bad": [...]}.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let manifest = super::about(larder_store::Manifest::read(&args.store), "cannot read the store", &args.store)?;
    let spine: u64 = manifest.spine.iter().map(|s| s.size).sum();
    let total: u64 = spine
        + manifest
            .layers
            .iter()
            .map(|l| l.experts.len() as u64 * l.parts.iter().map(|p| p.len).sum::<u64>())
            .sum::<u64>()
        + larder_store::mirror::listed(&args.store)
            .into_iter()
            .filter_map(|(layer, _)| manifest.layers.iter().find(|l| l.layer == layer))
            .map(|l| l.parts.iter().map(|p| p.len).sum::<u64>())
            .sum::<u64>();
    let progress = Progress::new("verify", total, Unit::Bytes, args.json);
    progress.set_message("spine and expert records");
    let report = larder_engine::integrity::verify(&args.store, &mut |b| progress.inc(b))?;
    progress.finish();
    let gbps = report.bytes as f64 / report.seconds.max(1e-9) / 1e9;
    if args.json {
        let mut doc = json!(report);
        doc["ok"] = json!(report.bad.is_empty());
        doc["gbps"] = json!(gbps);
        super::print_json(&doc)?;
    } else {
        eprintln!(
            "[larder] {} files, {} spine tensors ({}), {} records ({}) and {} mirrored copies checked in {:.1}s ({gbps:.2} GB/s)",
            report.files,
            report.spine_tensors,
            larder_store::format_size(report.spine_bytes),
            report.records,
            larder_store::format_size(report.bytes),
            report.mirrored_records,
            report.seconds,
        );
        for b in &report.bad {
            eprintln!("[larder] BAD {b}");
        }
        if report.bad.is_empty() {
            let files: Vec<String> = report.source.iter().map(|f| format!("{} ({} bytes)", f.name, f.size)).collect();
            eprintln!(
                "[larder] OK: store {} loads and is exactly the {} checkpoint it was packed from: {}",
                report.store_id,
                report.model_type,
                files.join(", ")
            );
        }
    }
    if !report.bad.is_empty() {
        bail!(
            "{} problems found in {}; `larder pack --model CHECKPOINT --out {} --repair` rewrites them",
            report.bad.len(),
            args.store.display(),
            args.store.display()
        );
    }
    Ok(())
}
