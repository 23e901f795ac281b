//! `larder pack`: write a packed expert store from a checkpoint folder
//! (contiguous 4 KiB-aligned expert records, grouped per layer per drive,
//! placed in proportion to drive bandwidth), with a progress bar.

use std::path::PathBuf;

use anyhow::Context;
use larder_store::pack::{pack_with, DriveSpec, PackEvent, PackOptions};
use serde_json::json;

use super::progress::{Progress, Unit};

/// Arguments of `larder pack`.
#[derive(clap::Args)]
#[command(
    after_help = "The checkpoint is first opened as `larder run` would open it (config, every tensor the \
architecture needs, shapes, dtypes); nothing is written if it cannot load.\n\n\
The store is resumable (re-run the same command after an interruption) and atomic: layer files appear only \
complete and verified, and manifest.json is written last, so a folder without it is never mistaken for a store. \
A resumed pack keeps a finished layer file only after re-reading every record from the checkpoint and the file \
and finding them equal; records that differ are rewritten. `--repair` does the same on a complete store (after \
`larder verify` reported bad records, or a damaged manifest). One pack at a time per --out (a lock file).\n\n\
Layer files go to <drive>/larder-<store id>/, so several stores can share a drive folder. Drives are measured \
during pack (a 256 MiB probe each) unless given as DIR:GBps.\n\n\
Examples:\n  larder pack --model ./k3mini --out ./k3mini.store\n  \
larder pack --model ~/models/Kimi-K2 --out /fast/k2 --drive /mnt/ssd0 --drive /mnt/ssd1:3.5\n  \
larder pack --model ~/models/Kimi-K2 --out /fast/k2 --repair\n  \
larder pack --model ~/models/Kimi-K2 --out /fast/k2 --drive /mnt/ssd0 --drive /mnt/nvme0 --mirror-hot 64GiB --heat old/heat.json"
)]
pub struct Args {
    /// Checkpoint folder to pack.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// Store folder to create (manifest, spine, config and tokenizer files; layer files unless --drive is given).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// A drive directory for layer files, optionally with its read bandwidth (DIR:GBps). Repeat for several drives.
    #[arg(long = "drive", value_name = "DIR[:GBps]", value_parser = DriveSpec::parse)]
    drives: Vec<DriveSpec>,
    /// Re-check a complete store (or one whose manifest is damaged) against the checkpoint and rewrite
    /// exactly the records, spine and files that differ.
    #[arg(long)]
    repair: bool,
    /// After packing, copy the hottest experts (up to SIZE bytes) onto the fastest drive, as `larder mirror`
    /// does: heat from --heat FILE, or the store's own heat.json when re-packing a store that has run.
    #[arg(long, value_name = "SIZE", value_parser = larder_store::parse_size)]
    mirror_hot: Option<u64>,
    /// The heat file --mirror-hot chooses by (a store's heat.json).
    #[arg(long, value_name = "FILE", requires = "mirror_hot")]
    heat: Option<std::path::PathBuf>,
    /// Print one JSON report on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let src = super::about(
        larder_engine::pack::pack_source(&args.model),
        "cannot read the checkpoint",
        &args.model,
    )?;
    if args.mirror_hot.is_some_and(|s| s > 0) {
        // The heat --mirror-hot chooses by must be there before the work starts.
        larder_tools::mirror::check_pack_heat(&args.out, args.heat.as_deref())?;
    }
    let progress = Progress::new("pack", 0, Unit::Bytes, args.json);
    let layers = src.layers.len();
    let mut layers_done = 0;
    let opts = PackOptions { repair: args.repair };
    let report = pack_with(&src, &args.out, &args.drives, opts, &mut |ev| match ev {
        PackEvent::MeasuringDrive { dir } => progress.set_message(&format!("measuring {}", dir.display())),
        PackEvent::DriveMeasured { dir, gbps } => {
            progress.note(&format!("{}: {gbps:.2} GB/s read", dir.display()));
            progress.set_message("experts");
        }
        PackEvent::Started { total_bytes } => progress.set_total(total_bytes),
        PackEvent::Advanced { bytes } => progress.inc(bytes),
        PackEvent::RecordRewritten { layer, expert } => {
            progress.note(&format!("layer {layer} expert {expert}: differed from the checkpoint; rewritten"))
        }
        PackEvent::LayerDone { layer, .. } => {
            layers_done += 1;
            let next = if layers_done < layers {
                format!("{layers_done} of {layers} layers done (layer {layer})")
            } else {
                "spine and files".into()
            };
            progress.set_message(&next);
        }
    })
    .with_context(|| format!("pack into {} failed", args.out.display()))?;
    progress.finish();
    let mirrored = match args.mirror_hot {
        Some(size) => Some(super::mirror::mirror_store(
            &args.out,
            size,
            None,
            args.heat.as_deref(),
            "auto",
            args.json,
        )?),
        None => None,
    };
    if args.json {
        let mut doc = json!(report);
        if let Some(m) = &mirrored {
            doc["mirror"] = json!(m);
        }
        return super::print_json(&doc);
    }
    if let Some(m) = &mirrored {
        eprintln!(
            "[larder] mirrored {} hot experts ({}) onto {}",
            m.report.experts,
            larder_store::format_size(m.report.bytes),
            m.drive.display()
        );
    }
    eprintln!(
        "[larder] packed {} experts of {} layers ({}) into {} in {:.1}s ({} layers resumed, {} records rewritten)",
        report.experts,
        report.layers,
        larder_store::format_size(report.expert_bytes),
        report.out.display(),
        report.seconds,
        report.resumed_layers,
        report.rewritten_records
    );
    Ok(())
}
