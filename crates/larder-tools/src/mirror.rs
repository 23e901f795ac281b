//! `larder mirror` and `pack --mirror-hot`: a packed store's hottest
//! records (by its heat, or a heat file) copied onto its fastest drive, or a
//! drive given (measured when its speed is not given), with larder-store's
//! `mirror` doing the copying; and what was done, as reported. Also the
//! check that `pack --mirror-hot` has heat to choose by before it packs.

use std::path::{Path, PathBuf};

use larder_bench::{Observer, Unit};
use larder_store::mirror::{mirror, MirrorPlan, MirrorReport};
use larder_store::pack::DriveSpec;
use larder_store::Manifest;

use crate::error::{Result, ToolsError};

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

/// Mirrors the hottest `size` bytes of records of `store` (its `manifest`)
/// onto `drive` (default: the store's fastest), ranked `by` `reads`,
/// `demands` or `auto` (reads where the heat has them) in `heat` (default:
/// the store's own heat.json); `size` 0 removes the mirrors.
pub fn mirror_store(
    store: &Path,
    manifest: &Manifest,
    size: u64,
    drive: Option<&DriveSpec>,
    heat: Option<&Path>,
    by: &str,
    observer: &dyn Observer,
) -> Result<Mirrored> {
    let profile = match heat {
        Some(f) => larder_store::heat::load_file(f).map_err(|e| ToolsError::Invalid(format!("--heat {e}")))?,
        None => larder_store::heat::read_saved(store)
            .map_err(|e| ToolsError::Invalid(e.to_string()))?
            .unwrap_or_default(),
    };
    let (heat, chosen_by) = match by {
        "demands" => (profile.demands, "demands"),
        "reads" => (profile.reads, "reads"),
        _ if profile.reads.is_empty() => (profile.demands, "demands"),
        _ => (profile.reads, "reads"),
    };
    if heat.is_empty() && size > 0 {
        return Err(ToolsError::Invalid(format!(
            "{}: no heat to choose the hottest experts by ({} is written when a streamed run ends); run the model \
             once first or give --heat FILE",
            store.display(),
            larder_store::heat::HEAT_FILE
        )));
    }
    let (dir, gbps) = mirror_drive(manifest, store, drive)?;
    let progress = observer.task("mirror", size, Unit::Bytes);
    progress.set_message(&format!("copying hot experts onto {}", dir.display()));
    let plan = MirrorPlan {
        drive: dir.clone(),
        gbps,
        bytes: size,
    };
    let report = mirror(store, &heat, &plan, &mut |b| progress.inc(b))
        .map_err(|e| ToolsError::from(e).during(format!("mirroring {} onto {} failed", store.display(), dir.display())))?;
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
fn mirror_drive(m: &Manifest, store: &Path, given: Option<&DriveSpec>) -> Result<(PathBuf, f64)> {
    let fastest = (0..m.drives.len()).max_by(|&a, &b| m.drives[a].gbps.total_cmp(&m.drives[b].gbps).then(b.cmp(&a)));
    let Some(spec) = given else {
        let d = fastest.ok_or_else(|| ToolsError::Invalid("the store lists no drives".into()))?;
        return Ok((m.drive_dir(store, d), m.drives[d].gbps));
    };
    if !spec.dir.is_dir() {
        return Err(ToolsError::Invalid(format!("--drive {}: not a directory", spec.dir.display())));
    }
    if let Some(g) = spec.gbps {
        return Ok((spec.dir.clone(), g));
    }
    if let Some(d) = m.drive_of(store, &spec.dir) {
        return Ok((spec.dir.clone(), m.drives[d].gbps));
    }
    let g = larder_store::drive::measure_read_gbps(&spec.dir).map_err(|e| {
        ToolsError::from(e).during(format!(
            "--drive {}: measuring its read bandwidth failed (give it as DIR:GBps)",
            spec.dir.display()
        ))
    })?;
    Ok((spec.dir.clone(), g))
}

/// `pack --mirror-hot`'s heat, checked before packing starts: `heat` (a
/// heat file) or the heat.json of the store at `out` must rank some experts.
pub fn check_pack_heat(out: &Path, heat: Option<&Path>) -> Result<()> {
    let heat = match heat {
        Some(f) => larder_store::heat::load_file(f).map_err(|e| ToolsError::Invalid(format!("--heat {e}")))?,
        None => larder_store::heat::read_saved(out)
            .map_err(|e| ToolsError::Invalid(format!("--mirror-hot: {e}")))?
            .unwrap_or_default(),
    };
    if heat.demands.is_empty() && heat.reads.is_empty() {
        return Err(ToolsError::Invalid(
            "--mirror-hot: no heat to choose the hottest experts by: give --heat FILE (a store's heat.json), \
             or pack first and run `larder mirror STORE --size SIZE` after the model has run"
                .into(),
        ));
    }
    Ok(())
}
