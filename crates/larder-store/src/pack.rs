//! `pack`: turns a checkpoint's routed experts into a packed store.
//!
//! Each expert becomes **one contiguous record** (its components, bytes as
//! shipped, back to back) starting on a 4 KiB boundary, so one O_DIRECT read
//! fetches it whole. Records are grouped per layer per drive, under a folder
//! named after the store's random id (`<drive>/larder-<id>/layer-LLL.experts`,
//! see [`crate::layer_file`]), so several stores share a drive folder without
//! ambiguity; each layer's experts are spread over drives in proportion to
//! their read bandwidth.
//!
//! Atomic, resumable and locked: the output folder and each drive folder are
//! locked (`flock`) while a pack runs; the plan (store id, drives,
//! bandwidths, placement) is saved first and kept; a resumed pack keeps a
//! finished layer file only as far as it proves every record equal to the
//! source bytes; the spine, the copied config files and finally
//! `manifest.json` come last. An interrupted pack leaves no manifest, so
//! nothing mistakes it for a store. `repair` re-proves a complete store the
//! same way and rewrites exactly the records that differ.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::buf::align_up;
use crate::digest::Digest;
use crate::drive::{measure_read_gbps, place};
use crate::fsutil::{lock_exclusive, write_atomic, FileLock};
use crate::io::{open_backend, IoKind, IoOptions};
use crate::layer_file::layer_outs;
use crate::location::{Extent, PartDesc};
use crate::manifest::{CarriedFile, DriveEntry, LayerEntry, Manifest, PartEntry, SourceIdentity, FORMAT, MANIFEST, VERSION};
use crate::record::source_digest;
use crate::spine::write_spine;
pub use crate::spine::SpineTensor;
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

/// How to pack.
#[derive(Debug, Clone, Copy, Default)]
pub struct PackOptions {
    /// Re-prove a complete store (or one whose manifest is damaged) against
    /// the source and rewrite what differs, instead of refusing it.
    pub repair: bool,
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

/// The outcome of a pack.
#[derive(Debug, Clone, Serialize)]
pub struct PackReport {
    pub out: PathBuf,
    pub store_id: String,
    pub layers: usize,
    pub experts: usize,
    pub expert_bytes: u64,
    /// Layer files found from an earlier pack and proven (records rewritten or not).
    pub resumed_layers: usize,
    /// Records of resumed layer files rewritten because they differed from the source.
    pub rewritten_records: usize,
    pub drives: Vec<DriveEntry>,
    pub seconds: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Plan {
    pub(crate) store_id: String,
    pub(crate) identity: SourceIdentity,
    pub(crate) drives: Vec<DriveEntry>,
    /// Per packed layer: drive of each expert.
    pub(crate) placement: Vec<(usize, Vec<usize>)>,
}

/// Packs `src` into `out`, layer files on `drives` (the store root when empty).
pub fn pack(src: &PackSource, out: &Path, drives: &[DriveSpec], progress: &mut dyn FnMut(PackEvent)) -> Result<PackReport, StoreError> {
    pack_with(src, out, drives, PackOptions::default(), progress)
}

/// [`pack`] with options (`repair`).
pub fn pack_with(
    src: &PackSource,
    out: &Path,
    drives: &[DriveSpec],
    opts: PackOptions,
    progress: &mut dyn FnMut(PackEvent),
) -> Result<PackReport, StoreError> {
    let started = Instant::now();
    std::fs::create_dir_all(out).map_err(|e| StoreError::io(out, e))?;
    let _out_lock = lock_exclusive(&out.join(LOCK), "another `larder pack` into this --out")?;
    check_existing_store(src, out, opts)?;
    let plan = load_or_make_plan(src, out, drives, progress)?;
    let drive_dirs: Vec<PathBuf> = plan.drives.iter().map(|d| resolve(out, &d.path)).collect();
    let mut _drive_locks: Vec<FileLock> = Vec::new();
    for dir in &drive_dirs {
        let sub = dir.join(store_folder(&plan.store_id));
        std::fs::create_dir_all(&sub).map_err(|e| StoreError::io(&sub, e))?;
        _drive_locks.push(lock_exclusive(&sub.join(LOCK), "another `larder pack` of this store")?);
    }
    // From here until the new manifest is written the folder is an unfinished pack.
    let manifest_path = out.join(MANIFEST);
    if manifest_path.exists() {
        std::fs::remove_file(&manifest_path).map_err(|e| StoreError::io(&manifest_path, e))?;
    }
    let sources = open_backend(
        &src.files,
        IoOptions {
            kind: IoKind::Pread,
            direct: false,
            depth: 1,
        },
    )?;
    let total: u64 = src
        .layers
        .iter()
        .map(|l| l.experts.iter().flatten().map(|x| x.len).sum::<u64>())
        .sum();
    let spine_bytes: u64 = src.spine.iter().map(|t| t.extent.len).sum();
    progress(PackEvent::Started {
        total_bytes: total + spine_bytes,
    });

    let outs = layer_outs(src, &plan, &drive_dirs)?;
    let (mut resumed, mut rewritten) = (0, 0);
    let mut layers = Vec::with_capacity(src.layers.len());
    for (li, layer) in src.layers.iter().enumerate() {
        let mut entries = vec![None; layer.experts.len()];
        let mut layer_resumed = true;
        for lo in outs.iter().filter(|o| o.layer == li) {
            let (done, proven) = lo.file(src, sources.as_ref()).pack(progress)?;
            match proven {
                Some(n) => rewritten += n,
                None => layer_resumed = false,
            }
            for entry in done {
                let slot = entry.expert;
                entries[slot] = Some(entry);
            }
        }
        resumed += layer_resumed as usize;
        progress(PackEvent::LayerDone {
            layer: layer.layer,
            resumed: layer_resumed,
        });
        layers.push(LayerEntry {
            layer: layer.layer,
            parts: record_layout(&layer.parts, &layer.experts).0,
            experts: entries
                .into_iter()
                .map(|e| e.ok_or_else(|| StoreError::Invalid(format!("layer {}: an expert was not placed", layer.layer))))
                .collect::<Result<_, _>>()?,
        });
    }

    let spine = write_spine(sources.as_ref(), &src.spine, out, SPINE)?;
    progress(PackEvent::Advanced { bytes: spine_bytes });
    let files = copy_files(&src.copy, out)?;
    let manifest = Manifest {
        format: FORMAT.into(),
        version: VERSION,
        store_id: plan.store_id.clone(),
        model_type: src.model_type.clone(),
        source: src.identity.clone(),
        files,
        spine: vec![spine],
        drives: plan.drives.clone(),
        layers,
        digest: String::new(),
    };
    manifest.write(out)?;
    Ok(PackReport {
        out: out.to_path_buf(),
        store_id: plan.store_id,
        layers: manifest.layers.len(),
        experts: manifest.layers.iter().map(|l| l.experts.len()).sum(),
        expert_bytes: total,
        resumed_layers: resumed,
        rewritten_records: rewritten,
        drives: plan.drives,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The folder of store `id` on every drive.
pub fn store_folder(id: &str) -> String {
    format!("larder-{id}")
}

/// Refuses a complete store unless repairing it; refuses another model's store.
pub(crate) fn check_existing_store(src: &PackSource, out: &Path, opts: PackOptions) -> Result<(), StoreError> {
    if !Manifest::is_store(out) {
        return Ok(());
    }
    let m = match Manifest::read(out) {
        Ok(m) => m,
        // A damaged manifest: --repair rebuilds it from the plan (checked next).
        Err(_) if opts.repair && out.join(PLAN).exists() => return Ok(()),
        Err(e) => return Err(e),
    };
    if m.source != src.identity {
        return Err(StoreError::Invalid(format!(
            "{} already holds a store of another model; choose another --out",
            out.display()
        )));
    }
    if !opts.repair {
        return Err(StoreError::Invalid(format!(
            "{} already holds a complete store of this model: `larder verify` checks it; \
             `larder pack --repair` re-checks it against this checkpoint and rewrites what differs",
            out.display()
        )));
    }
    if !out.join(PLAN).exists() {
        return Err(StoreError::Invalid(format!(
            "{}: no {PLAN} (packed by an older larder), so it cannot be repaired; pack into a new --out",
            out.display()
        )));
    }
    Ok(())
}

pub(crate) fn resolve(root: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        root.join(p)
    }
}

/// Copies the small files into the store root, with their digests.
pub(crate) fn copy_files(copy: &[PathBuf], out: &Path) -> Result<Vec<CarriedFile>, StoreError> {
    copy.iter()
        .map(|f| {
            let name = f
                .file_name()
                .ok_or_else(|| StoreError::Invalid(format!("{}: not a file", f.display())))?
                .to_string_lossy()
                .into_owned();
            let bytes = std::fs::read(f).map_err(|e| StoreError::io(f, e))?;
            write_atomic(&out.join(&name), &bytes)?;
            Ok(CarriedFile {
                name,
                size: bytes.len() as u64,
                digest: Digest::of(&bytes).to_string(),
            })
        })
        .collect()
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
        let text = std::fs::read_to_string(&path).map_err(|e| StoreError::io(&path, e))?;
        let plan: Plan = serde_json::from_str(&text).map_err(|e| StoreError::manifest(&path, format!("unreadable pack plan: {e}")))?;
        if plan.identity != src.identity {
            return Err(StoreError::manifest(
                &path,
                "an unfinished pack of another model is in this folder; choose another --out or remove it",
            ));
        }
        let have: Vec<&str> = plan.drives.iter().map(|d| d.path.as_str()).collect();
        if !drives.is_empty() && have != wanted.iter().map(|s| s.as_str()).collect::<Vec<_>>() {
            return Err(StoreError::manifest(
                &path,
                format!("this store's pack uses drives {have:?}; resume or repair it with the same --drive list"),
            ));
        }
        return Ok(plan);
    }
    let specs: Vec<DriveSpec> = if drives.is_empty() {
        vec![DriveSpec {
            dir: out.to_path_buf(),
            gbps: None,
        }]
    } else {
        drives.to_vec()
    };
    let mut entries = Vec::new();
    for (spec, p) in specs.iter().zip(&wanted) {
        if !spec.dir.is_dir() {
            return Err(StoreError::io(
                &spec.dir,
                std::io::Error::new(std::io::ErrorKind::NotFound, "drive directory does not exist"),
            ));
        }
        let gbps = match spec.gbps {
            Some(g) => g,
            // One drive: placement does not depend on its speed.
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

/// Whether `dir` holds an unfinished pack (a plan but no manifest).
pub fn is_unfinished(dir: &Path) -> bool {
    dir.join(PLAN).exists() && !dir.join(MANIFEST).exists()
}
