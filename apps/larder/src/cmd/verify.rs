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
A lazy cache (--cache-dir) is checked without the network: its description, carried files, spine, and every \
expert record on the drive against the digest it was written with and its source digest; it names the records \
not fetched yet (per layer) and the source files never checked against a published sha256. Exit 0 when \
nothing it holds is wrong (records not fetched yet are not wrong).\n\n\
Example:\n  larder verify ./k3mini.store --json"
)]
pub struct Args {
    /// Packed store folder (made by `larder pack` or `larder pull`), or a lazy cache's --cache-dir.
    #[arg(value_name = "STORE|CACHE_DIR")]
    store: PathBuf,
    /// Print one JSON report on stdout: {"ok", "store_id", "model_type", "source", "files", "spine_tensors",
    /// "spine_bytes", "records", "bytes", "mirrored_records", "seconds", "gbps", "bad": [...]}.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if larder_engine::lazy::is_lazy_cache(&args.store) {
        return run_lazy(&args);
    }
    if let Some(what) = larder_engine::store_folder::unfinished_store(&args.store) {
        bail!("{}: {what}", args.store.display());
    }
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
        if report.bad.iter().all(|b| b.contains("it cannot run")) {
            bail!(
                "{} problems found in {}: the checkpoint it was packed from contradicts its own config there; \
                 pack a correct checkpoint",
                report.bad.len(),
                args.store.display()
            );
        }
        let copies = report.bad.iter().filter(|b| b.contains("(a mirrored copy")).count();
        let fix = match (copies, report.bad.len() - copies) {
            (0, _) => format!(
                "`larder pack --model CHECKPOINT --out {} --repair` rewrites them",
                args.store.display()
            ),
            (_, 0) => format!("`larder mirror {} --size SIZE` writes the copies anew", args.store.display()),
            _ => format!(
                "`larder pack --model CHECKPOINT --out {0} --repair` rewrites the records and files, then \
                 `larder mirror {0} --size SIZE` the copies",
                args.store.display()
            ),
        };
        bail!("{} problems found in {}; {fix}", report.bad.len(), args.store.display());
    }
    Ok(())
}

/// `larder verify CACHE_DIR` on a lazy cache.
fn run_lazy(args: &Args) -> anyhow::Result<()> {
    let report = super::about(
        larder_engine::lazy::verify_lazy(&args.store),
        "cannot verify the lazy cache",
        &args.store,
    )?;
    if args.json {
        let mut doc = json!(report);
        doc["ok"] = json!(report.bad.is_empty());
        doc["lazy"] = json!(true);
        super::print_json(&doc)?;
    } else {
        eprintln!(
            "[larder] lazy cache of {} ({} source check): spine {} tensors ({}), {} of {} expert records on the drive ({}), \
             {} with a source digest",
            report.source,
            report.source_check,
            report.spine_tensors,
            larder_store::format_size(report.spine_bytes),
            report.present,
            report.records,
            larder_store::format_size(report.present_bytes),
            report.known,
        );
        if report.missing > 0 {
            let layers: Vec<String> = report.missing_by_layer.iter().map(|(l, n)| format!("{l}: {n}")).collect();
            eprintln!(
                "[larder] not fetched yet: {} records (by layer {})",
                report.missing,
                layers.join(", ")
            );
        }
        for f in &report.unverified_files {
            eprintln!("[larder] not checked against the source's sha256: {f}");
        }
        for b in &report.bad {
            eprintln!("[larder] BAD {b}");
        }
        if report.bad.is_empty() {
            eprintln!("[larder] OK: everything the cache holds is what it claims");
        }
    }
    if !report.bad.is_empty() {
        bail!(
            "{} problems found in the lazy cache {}; the records named are fetched again on their next use",
            report.bad.len(),
            args.store.display()
        );
    }
    Ok(())
}
