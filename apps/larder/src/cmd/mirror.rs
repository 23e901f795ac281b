//! `larder mirror STORE --size SIZE`: copies a packed store's hottest
//! experts (its saved heat, or `--heat FILE`) onto its fastest drive (or
//! `--drive DIR[:GBps]`), so reads of them go to whichever copy should
//! finish first. `--size 0` removes the mirrors. `pack --mirror-hot SIZE`
//! does the same after packing.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use larder_store::mirror::{mirror, MirrorPlan, MirrorReport};
use larder_store::pack::DriveSpec;
use larder_store::{format_size, Manifest};
use serde_json::json;

use super::progress::{Progress, Unit};

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

/// What `mirror` reports: [`MirrorReport`] and the drive used.
#[derive(serde::Serialize)]
pub struct Mirrored {
    #[serde(flatten)]
    pub report: MirrorReport,
    pub drive: PathBuf,
    pub gbps: f64,
    /// `reads` or `demands`: what the records were ranked by.
    pub chosen_by: &'static str,
}

/// Mirrors `store`'s hottest `size` bytes of records (see [`Args`]).
pub fn mirror_store(
    store: &Path,
    size: u64,
    drive: Option<&DriveSpec>,
    heat: Option<&Path>,
    by: &str,
    quiet: bool,
) -> anyhow::Result<Mirrored> {
    let manifest = super::about(Manifest::read(store), "cannot read the store", store)?;
    let profile = match heat {
        Some(f) => larder_store::heat::load_file(f).map_err(|e| anyhow::anyhow!("--heat {e}"))?,
        None => larder_store::heat::read_saved(store)
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .unwrap_or_default(),
    };
    let (heat, chosen_by) = match by {
        "demands" => (profile.demands, "demands"),
        "reads" => (profile.reads, "reads"),
        _ if profile.reads.is_empty() => (profile.demands, "demands"),
        _ => (profile.reads, "reads"),
    };
    if heat.is_empty() && size > 0 {
        bail!(
            "{}: no heat to choose the hottest experts by ({} is written when a streamed run ends); run the model \
             once first or give --heat FILE",
            store.display(),
            larder_store::heat::HEAT_FILE
        );
    }
    let (dir, gbps) = mirror_drive(&manifest, store, drive)?;
    let progress = Progress::new("mirror", size, Unit::Bytes, quiet);
    progress.set_message(&format!("copying hot experts onto {}", dir.display()));
    let plan = MirrorPlan {
        drive: dir.clone(),
        gbps,
        bytes: size,
    };
    let report = mirror(store, &heat, &plan, &mut |b| progress.inc(b))
        .with_context(|| format!("mirroring {} onto {} failed", store.display(), dir.display()))?;
    progress.finish();
    Ok(Mirrored {
        report,
        drive: dir,
        gbps,
        chosen_by,
    })
}

/// The drive to mirror onto and its bandwidth: the one given (its GB/s
/// given, the store's figure for one of its drives, or measured), else the
/// store's fastest.
fn mirror_drive(m: &Manifest, store: &Path, given: Option<&DriveSpec>) -> anyhow::Result<(PathBuf, f64)> {
    let fastest = (0..m.drives.len()).max_by(|&a, &b| m.drives[a].gbps.total_cmp(&m.drives[b].gbps).then(b.cmp(&a)));
    let Some(spec) = given else {
        let d = fastest.context("the store lists no drives")?;
        return Ok((m.drive_dir(store, d), m.drives[d].gbps));
    };
    if !spec.dir.is_dir() {
        bail!("--drive {}: not a directory", spec.dir.display());
    }
    if let Some(g) = spec.gbps {
        return Ok((spec.dir.clone(), g));
    }
    if let Some(d) = m.drive_of(store, &spec.dir) {
        return Ok((spec.dir.clone(), m.drives[d].gbps));
    }
    let g = larder_store::drive::measure_read_gbps(&spec.dir).with_context(|| {
        format!(
            "--drive {}: measuring its read bandwidth failed (give it as DIR:GBps)",
            spec.dir.display()
        )
    })?;
    Ok((spec.dir.clone(), g))
}
