//! `larder mirror STORE --size SIZE`: copies a packed store's hottest
//! experts (its saved heat, or `--heat FILE`) onto its fastest drive (or
//! `--drive DIR[:GBps]`), so reads of them go to whichever copy should
//! finish first. `--size 0` removes the mirrors. `pack --mirror-hot SIZE`
//! does the same after packing.

use std::path::{Path, PathBuf};

use larder_store::pack::DriveSpec;
use larder_store::{format_size, Manifest};
use larder_tools::mirror::Mirrored;
use serde_json::json;

use super::progress::Shown;

/// Arguments of `larder mirror`.
#[derive(clap::Args)]
#[command(
    after_help = "With several drives, the most demanded experts are read most often; a copy of them on the \
fastest drive lets each read go to whichever copy should finish first (bytes already in flight on each drive over \
its bandwidth). Copies are the same bytes under the same digests, checked on every read as the records are; \
`larder verify` checks them too. Output never changes.\n\n\
Heat comes from the store's heat.json (every streamed run adds to it: demands, and reads from the drives) or \
--heat FILE; records are ranked by reads where recorded (--by), since what the RAM cache keeps is rarely read. The drive is the store's \
fastest (by the bandwidth pack measured or was given) unless --drive names one; a drive that is not one of the \
store's is measured (a 256 MiB probe) unless given as DIR:GBps. Records whose primary copy is already on that \
drive are left out. Writing is atomic: new files, then mirrors.json, then the old files are removed.\n\n\
Examples:\n  larder mirror ./k3.store --size 64GiB\n  larder mirror ./k3.store --size 64GiB --drive /mnt/nvme0:6.5\n  \
larder mirror ./k3.store --size 0          # remove the mirrors"
)]
pub struct Args {
    /// A packed store.
    #[arg(value_name = "STORE")]
    store: PathBuf,
    /// Bytes of records to copy, hottest first (e.g. 64GiB); 0 removes the mirrors.
    #[arg(long, value_name = "SIZE", value_parser = larder_store::parse_size)]
    size: u64,
    /// The drive to copy onto, optionally with its read bandwidth (DIR:GBps). Default: the store's fastest drive.
    #[arg(long, value_name = "DIR[:GBps]", value_parser = DriveSpec::parse)]
    drive: Option<DriveSpec>,
    /// A heat file (heat.json of this store, saved elsewhere) instead of the store's own.
    #[arg(long, value_name = "FILE")]
    heat: Option<PathBuf>,
    /// Rank records by how often they were read from a drive (`reads`: what the drives served under the
    /// RAM budgets of earlier runs; the hottest experts the RAM cache kept are not worth a copy) or by how
    /// often they were demanded (`demands`). `auto`: reads where the heat file has them.
    #[arg(long, value_name = "auto|reads|demands", default_value = "auto", value_parser = ["auto", "reads", "demands"])]
    by: String,
    /// Print one JSON report: {"experts", "bytes", "layers", "already_on_drive", "removed_files", "drive", "gbps",
    /// "chosen_by"}.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let report = mirror_store(&a.store, a.size, a.drive.as_ref(), a.heat.as_deref(), &a.by, a.json)?;
    if a.json {
        return super::print_json(&json!(report));
    }
    if report.report.experts == 0 {
        eprintln!("[larder] no mirrors ({} removed files)", report.report.removed_files);
    } else {
        eprintln!(
            "[larder] mirrored {} experts of {} layers ({}, the most {}) onto {} ({:.2} GB/s); {} hot records already there",
            report.report.experts,
            report.report.layers,
            format_size(report.report.bytes),
            report.chosen_by,
            report.drive.display(),
            report.gbps,
            report.report.already_on_drive
        );
    }
    Ok(())
}

/// Mirrors `store`'s hottest `size` bytes of records (see [`Args`] and
/// `larder_tools::mirror`), progress shown as `json` (the command's --json) says.
pub fn mirror_store(
    store: &Path,
    size: u64,
    drive: Option<&DriveSpec>,
    heat: Option<&Path>,
    by: &str,
    json: bool,
) -> anyhow::Result<Mirrored> {
    let manifest = super::about(Manifest::read(store), "cannot read the store", store)?;
    Ok(larder_tools::mirror::mirror_store(
        store,
        &manifest,
        size,
        drive,
        heat,
        by,
        &Shown { json },
    )?)
}
