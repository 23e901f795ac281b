//! What a pack works from and where it puts things, shared by
//! [`crate::pack`], its layer files ([`crate::layer_file`]), `pull`, `lazy`
//! and [`crate::mirror`]: the source checkpoint as pack sees it
//! ([`PackSource`], [`PackLayer`]), the drives asked for ([`DriveSpec`]), the
//! saved plan ([`PLAN`]: store id, drives with their bandwidth, placement of
//! every expert; kept after the pack for `--repair`), the record layout of a
//! layer ([`record_layout`]), the store's folder on each drive and its file
//! names, and the events a pack reports ([`PackEvent`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::buf::align_up;
use crate::digest::Digest;
use crate::drive::{measure_read_gbps, place};
use crate::fsutil::write_atomic;
use crate::location::{Extent, PartDesc};
use crate::manifest::{DriveEntry, PartEntry, SourceIdentity};
use crate::record::source_digest;
use crate::spine::SpineTensor;
use crate::StoreError;

/// The saved plan of a pack (kept after it finishes, for `--repair`).
pub const PLAN: &str = "pack-plan.json";
/// The spine's file in the store root.
pub const SPINE: &str = "spine.safetensors";
/// The lock a running pack holds in the output folder and each drive folder.
pub const LOCK: &str = "pack.lock";

/// One layer's routed experts in the source.
#[derive(Debug, Clone)]
pub struct PackLayer {
    pub layer: usize,
    pub parts: Vec<PartDesc>,
    /// Per expert, one extent per part (in part order).
    pub experts: Vec<Vec<Extent>>,
}

/// Everything pack needs to know about the source checkpoint.
#[derive(Debug, Clone)]
pub struct PackSource {
    pub model_type: String,
    pub identity: SourceIdentity,
    /// Source files the extents index.
    pub files: Vec<PathBuf>,
    pub spine: Vec<SpineTensor>,
    pub layers: Vec<PackLayer>,
    /// Small files copied into the store root (config.json, tokenizer, ...).
    pub copy: Vec<PathBuf>,
}

/// A drive directory, with its bandwidth if the user gave it.
#[derive(Debug, Clone)]
pub struct DriveSpec {
    pub dir: PathBuf,
    pub gbps: Option<f64>,
}

impl DriveSpec {
    /// Parses `DIR` or `DIR:GBps`.
    pub fn parse(s: &str) -> Result<DriveSpec, String> {
        if let Some((dir, bw)) = s.rsplit_once(':') {
            if let Ok(g) = bw.parse::<f64>() {
                if !(g.is_finite() && g > 0.0) {
                    return Err(format!("drive {s:?}: bandwidth must be a positive number of GB/s"));
                }
                return Ok(DriveSpec {
                    dir: PathBuf::from(dir),
                    gbps: Some(g),
                });
            }
        }
        Ok(DriveSpec {
            dir: PathBuf::from(s),
            gbps: None,
        })
    }
}

/// What pack reports as it goes.
#[derive(Debug, Clone)]
pub enum PackEvent {
    MeasuringDrive {
        dir: PathBuf,
    },
    DriveMeasured {
        dir: PathBuf,
        gbps: f64,
    },
    /// Bytes to write or prove in total: expert records, then the spine tensors.
    Started {
        total_bytes: u64,
    },
    /// More bytes are done (expert records written and verified, or proven;
    /// then the spine, at once when it is written).
    Advanced {
        bytes: u64,
    },
    /// A record found from an earlier pack differed and was rewritten.
    RecordRewritten {
        layer: usize,
        expert: usize,
    },
    LayerDone {
        layer: usize,
        resumed: bool,
    },
}

/// A pack's saved plan ([`PLAN`]): what a resumed or repaired pack must reuse.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Plan {
    pub(crate) store_id: String,
    pub(crate) identity: SourceIdentity,
    pub(crate) drives: Vec<DriveEntry>,
    /// Per packed layer: drive of each expert.
    pub(crate) placement: Vec<(usize, Vec<usize>)>,
}

/// The folder of store `id` on every drive.
pub fn store_folder(id: &str) -> String {
    format!("larder-{id}")
}

/// `p` (a drive path as recorded) resolved against the store root.
pub(crate) fn resolve(root: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        root.join(p)
    }
}

/// A new store id: 16 hex digits from the clock, the process and the source.
fn new_store_id(src: &PackSource, out: &Path) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let what = format!(
        "{nanos}\0{}\0{}\0{}",
        std::process::id(),
        out.display(),
        source_digest(&src.identity)
    );
    format!("{:016x}", Digest::seed_of(what.as_bytes()))
}

/// The plan saved in `out` by an earlier run of this pack (checked against
/// `src` and `drives`), or else a new one, saved before anything is written:
/// a new store id, each drive's bandwidth (given, or measured when there
/// are several) and every expert placed.
pub(crate) fn load_or_make_plan(
    src: &PackSource,
    out: &Path,
    drives: &[DriveSpec],
    progress: &mut dyn FnMut(PackEvent),
) -> Result<Plan, StoreError> {
    let path = out.join(PLAN);
    let wanted: Vec<String> = if drives.is_empty() {
        vec![".".into()]
    } else {
        drives.iter().map(|d| drive_path_string(out, &d.dir)).collect::<Result<_, _>>()?
    };
    for (i, w) in wanted.iter().enumerate() {
        if wanted[..i].contains(w) {
            return Err(StoreError::Invalid(format!(
                "--drive {w} is given twice; name each drive folder once"
            )));
        }
    }
    if path.exists() {
        return saved_plan(&path, src, (!drives.is_empty()).then_some(&wanted[..]));
    }
    let specs: Vec<DriveSpec> = if drives.is_empty() {
        vec![DriveSpec {
            dir: out.to_path_buf(),
            gbps: None,
        }]
    } else {
        drives.to_vec()
    };
    let entries = drive_entries(&specs, &wanted, progress)?;
    let weights: Vec<f64> = entries.iter().map(|d| d.gbps).collect();
    let plan = Plan {
        store_id: new_store_id(src, out),
        identity: src.identity.clone(),
        drives: entries,
        placement: src.layers.iter().map(|l| (l.layer, place(l.experts.len(), &weights))).collect(),
    };
    let text = serde_json::to_vec_pretty(&plan).map_err(|e| StoreError::Invalid(e.to_string()))?;
    write_atomic(&path, &text)?;
    Ok(plan)
}

/// The plan saved at `path`, refused when it is another model's or (when
/// drives were named: `wanted`, as recorded) its drives differ.
fn saved_plan(path: &Path, src: &PackSource, wanted: Option<&[String]>) -> Result<Plan, StoreError> {
    let text = std::fs::read_to_string(path).map_err(|e| StoreError::io(path, e))?;
    let plan: Plan = serde_json::from_str(&text).map_err(|e| StoreError::manifest(path, format!("unreadable pack plan: {e}")))?;
    if plan.identity != src.identity {
        return Err(StoreError::manifest(
            path,
            "an unfinished pack of another model is in this folder; choose another --out or remove it",
        ));
    }
    let have: Vec<&str> = plan.drives.iter().map(|d| d.path.as_str()).collect();
    if wanted.is_some_and(|w| have != w.iter().map(|s| s.as_str()).collect::<Vec<_>>()) {
        return Err(StoreError::manifest(
            path,
            format!("this store's pack uses drives {have:?}; resume or repair it with the same --drive list"),
        ));
    }
    Ok(plan)
}

/// The drive entries of `specs` (recorded as `paths`): each folder must
/// exist; a bandwidth not given is measured, unless there is one drive
/// (placement then does not depend on its speed).
fn drive_entries(specs: &[DriveSpec], paths: &[String], progress: &mut dyn FnMut(PackEvent)) -> Result<Vec<DriveEntry>, StoreError> {
    let mut entries = Vec::new();
    for (spec, p) in specs.iter().zip(paths) {
        if !spec.dir.is_dir() {
            return Err(StoreError::io(
                &spec.dir,
                std::io::Error::new(std::io::ErrorKind::NotFound, "drive directory does not exist"),
            ));
        }
        let gbps = match spec.gbps {
            Some(g) => g,
            None if specs.len() == 1 => 1.0,
            None => {
                progress(PackEvent::MeasuringDrive { dir: spec.dir.clone() });
                let g = measure_read_gbps(&spec.dir)?;
                progress(PackEvent::DriveMeasured {
                    dir: spec.dir.clone(),
                    gbps: g,
                });
                g
            }
        };
        entries.push(DriveEntry { path: p.clone(), gbps });
    }
    Ok(entries)
}

/// Drives inside the store root are recorded relative to it (the store can move).
pub(crate) fn drive_path_string(out: &Path, dir: &Path) -> Result<String, StoreError> {
    let abs_out = std::fs::canonicalize(out).map_err(|e| StoreError::io(out, e))?;
    let abs = std::fs::canonicalize(dir).map_err(|e| StoreError::io(dir, e))?;
    Ok(match abs.strip_prefix(&abs_out) {
        Ok(rel) if rel.as_os_str().is_empty() => ".".into(),
        Ok(rel) => rel.to_string_lossy().into_owned(),
        Err(_) => abs.to_string_lossy().into_owned(),
    })
}

/// Components back to back (as shipped); the record padded to 4 KiB.
pub(crate) fn record_layout(parts: &[PartDesc], experts: &[Vec<Extent>]) -> (Vec<PartEntry>, u64) {
    let lens: Vec<u64> = experts.first().map(|x| x.iter().map(|e| e.len).collect()).unwrap_or_default();
    let mut at = 0;
    let entries = parts
        .iter()
        .zip(&lens)
        .map(|(d, &len)| {
            let p = PartEntry {
                desc: d.clone(),
                offset: at,
                len,
            };
            at += len;
            p
        })
        .collect();
    (entries, align_up(at))
}
