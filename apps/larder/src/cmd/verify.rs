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
    if let Some(what) = larder_engine::unfinished_store(&args.store) {
        bail!("{}: {what}", args.store.display());
    }
    let manifest = super::about(larder_store::Manifest::read(&args.store), "cannot read the store", &args.store)?;
    let total = larder_engine::integrity::verify_bytes(&args.store, &manifest);
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
        eprint!("{}", larder_tools::text::verify_text(&report, gbps));
    }
    if let Some(problem) = larder_tools::text::verify_problem(&report, &args.store) {
        bail!(problem);
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
        eprint!("{}", larder_tools::text::lazy_verify_text(&report));
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
