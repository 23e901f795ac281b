//! `larder doctor`: what this machine is and what it can run. Machine facts
//! (`larder_engine::Machine`), a probe of each drive folder
//! (`larder_engine::drive_probe`), a model's shape and sizes
//! (`larder_engine::sizing`) and the plan larder-engine's first planner makes
//! from them: whether it fits, the `--ram-budget` and `--io` to use, and the
//! expected decode tok/s with the bound that sets it (the probing and the
//! report's text: `larder_tools::doctor`). docs/doctor.md describes every
//! figure and the `--json` keys.

use std::path::PathBuf;

use anyhow::Context;
use larder_engine::recommend::{recommend, Recommendation};
use larder_store::parse_size;
use larder_tools::doctor::Drive;
use serde_json::json;

use larder_engine::drive_probe::DriveReport;
use larder_engine::sizing::ModelReport;
use larder_engine::Machine;

use super::progress::Shown;

/// Largest `--probe-mib`.
const MAX_PROBE_MIB: usize = 64 << 10;

/// Arguments of `larder doctor`.
#[derive(clap::Args)]
#[command(after_help = "Measures this machine (CPU, ISA features, kernel path, RAM, one-thread RAM read), \
probes each drive folder (file system, free space, O_DIRECT, io_uring, read GB/s at expert-sized reads through \
a temporary probe file, removed afterwards) and, with --model, plans the run: whether it fits, the --ram-budget \
and --io to use, and the expected decode tok/s (a first estimate: uniform routing, no overlap of reads and \
compute; see docs/doctor.md).\n\nExamples:\n  larder doctor\n  larder doctor --model ~/models/Qwen3-30B-A3B \
--drive /mnt/ssd0 --json\n  larder doctor --model ./Kimi-K2/config.json --ram-budget 96GiB")]
pub struct Args {
    /// A folder to probe (repeatable; default: the current folder). The
    /// model's folder is probed too when --model is given.
    #[arg(long = "drive", value_name = "DIR")]
    drives: Vec<PathBuf>,
    /// A checkpoint folder, a packed store, or a config.json file (sizes
    /// then estimated from shapes and dtype) to plan for.
    #[arg(long, value_name = "M")]
    model: Option<PathBuf>,
    /// Estimate decode speed for an expert cache of SIZE (e.g. 8GiB)
    /// instead of the recommended one.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    ram_budget: Option<u64>,
    /// Size of each drive's probe file in MiB, 1 to 65536 (read back in
    /// records of up to 16 MiB).
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = super::range(1, MAX_PROBE_MIB))]
    probe_mib: usize,
    /// Print one JSON document on stdout (progress goes to stderr).
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let model = args.model.as_deref().map(super::inspect_model).transpose()?;
    if let Some(budget) = args.ram_budget {
        larder_tools::doctor::check_budget(budget, model.as_ref())?;
    }
    let shown = Shown { json: args.json };
    let drives = larder_tools::doctor::probe_drives(&args.drives, model.as_ref(), args.probe_mib, &shown)?;
    let machine = Machine::inspect();
    let probed: Vec<&DriveReport> = drives.iter().filter_map(|d| d.result.as_ref().ok()).collect();
    let rec = match &model {
        Some(m) => Some(recommend(&machine, &probed, m, args.ram_budget).context("planning the model")?),
        None => None,
    };
    if args.json {
        let doc = json!({
            "machine": machine.to_json(),
            "drives": drives.iter().map(Drive::to_json).collect::<Vec<_>>(),
            "model": model.as_ref().map(ModelReport::to_json),
            "recommendation": rec.as_ref().map(Recommendation::to_json),
        });
        return super::print_json(&doc);
    }
    print!("{}", larder_tools::doctor::report(&machine, &drives, model.as_ref(), rec.as_ref()));
    Ok(())
}
