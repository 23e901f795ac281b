//! `pack`: turns a checkpoint's routed experts into a packed store.
//!
//! Each expert becomes **one contiguous record** (its components, bytes as
//! shipped, back to back) starting on a 4 KiB boundary, so one O_DIRECT read
//! fetches it whole. Records are grouped per layer per drive, under a folder
//! named after the store's random id (`<drive>/larder-<id>/layer-LLL.experts`,
//! see `crate::layer_file`), so several stores share a drive folder without
//! ambiguity; each layer's experts are spread over drives in proportion to
//! their read bandwidth.
//!
//! Atomic, resumable and locked: the output folder and each drive folder are
//! locked (`flock`) while a pack runs; the plan (store id, drives,
//! bandwidths, placement; made in `pack_plan.rs`) is saved first and kept;
//! a resumed pack keeps a finished layer file only as far as it proves every
//! record equal to the source bytes; the spine, the copied config files and finally
//! `manifest.json` come last. An interrupted pack leaves no manifest, so
//! nothing mistakes it for a store. `repair` re-proves a complete store the
//! same way and rewrites exactly the records that differ.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::digest::Digest;
use crate::fsutil::{lock_exclusive, write_atomic, FileLock};
use crate::io::{open_backend, IoKind, IoOptions};
use crate::layer_file::layer_outs;
use crate::manifest::{CarriedFile, DriveEntry, LayerEntry, Manifest, FORMAT, MANIFEST, VERSION};
use crate::pack_plan::{load_or_make_plan, record_layout, resolve};
pub use crate::pack_plan::{store_folder, DriveSpec, PackEvent, PackLayer, PackSource, LOCK, PLAN, SPINE};
use crate::spine::write_spine;
pub use crate::spine::SpineTensor;
use crate::StoreError;

/// How to pack.
#[derive(Debug, Clone, Copy, Default)]
pub struct PackOptions {
    /// Re-prove a complete store (or one whose manifest is damaged) against
    /// the source and rewrite what differs, instead of refusing it.
    pub repair: bool,
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

/// Whether `dir` holds an unfinished pack (a plan but no manifest).
pub fn is_unfinished(dir: &Path) -> bool {
    dir.join(PLAN).exists() && !dir.join(MANIFEST).exists()
}
