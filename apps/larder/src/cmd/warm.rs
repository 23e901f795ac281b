//! `larder warm STORE`: reads the store's hottest experts (its saved heat,
//! `heat.json`, which every streamed run adds to) into a RAM cache of the
//! given budget and says how many, how many bytes and how fast. `run` and
//! `serve` do the same at start with `--warm`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::bail;
use larder_store::{format_size, Manifest};
use serde_json::json;

/// Arguments of `larder warm`.
#[derive(clap::Args)]
pub struct Args {
    /// A packed store (its heat.json lists how often each expert was used).
    #[arg(value_name = "STORE")]
    store: PathBuf,
    #[command(flatten)]
    experts: super::ExpertArgs,
    /// Print {"experts", "bytes", "seconds", "gbps", "ram_budget"}.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if !Manifest::is_store(&a.store) {
        bail!("{}: not a packed store (make one with `larder pack`)", a.store.display());
    }
    let saved = larder_store::heat::read_saved(&a.store).map_err(|e| anyhow::anyhow!("{e}"))?;
    if saved.is_none_or(|h| h.demands.is_empty()) {
        bail!(
            "{}: no heat yet ({} is written when a streamed run ends); run the model once first",
            a.store.display(),
            larder_store::heat::HEAT_FILE
        );
    }
    let engine = super::load_engine_with(&a.store, &a.experts, a.json)?;
    let budget = engine.store().map_or(0, |s| s.cache().budget());
    let started = Instant::now();
    let (experts, bytes) = engine.warm()?;
    let seconds = started.elapsed().as_secs_f64();
    let gbps = if seconds > 0.0 { bytes as f64 / seconds / 1e9 } else { 0.0 };
    if a.json {
        return super::print_json(&json!({"experts": experts, "bytes": bytes, "seconds": seconds, "gbps": gbps, "ram_budget": budget}));
    }
    println!(
        "warmed {experts} experts ({}) into a {} cache in {seconds:.2} s ({gbps:.2} GB/s)",
        format_size(bytes),
        format_size(budget)
    );
    Ok(())
}
