//! Fail-closed loading and checking of a packed store: before a store's
//! model is built, its carried files (config, tokenizer, templates) must be
//! the ones packed and no unlisted file that changes the output may sit
//! beside them; while it is built, every spine tensor the model takes is
//! checked against the manifest (place, dtype, shape, digest). [`verify`]
//! adds to larder-store's byte checks the proof that the store loads.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use larder_model::arch::read_spec;
use larder_model::checkpoint::{Checkpoint, TensorCheck, TensorInfo};
use larder_model::DecoderModel;
use larder_store::manifest::{CarriedFile, SpineFile, SpineTensorEntry};
use larder_store::VerifyReport;
use larder_store::{Digest, ExpertIndex, ExpertStore, Manifest, StoreOptions};

use crate::error::{store_err, EngineError};
use crate::experts::StoreExperts;
use crate::pack::CARRIED_FILES;

/// Checks the store's carried files against its manifest: each listed file
/// has its packed digest, and no file larder reads (config, tokenizer,
/// templates) is present without being listed.
pub(crate) fn check_carried_files(dir: &Path, manifest: &Manifest) -> Result<(), EngineError> {
    check_carried(dir, &manifest.files)
}

/// Checks carried files against their list (a manifest's or a lazy cache's).
pub(crate) fn check_carried(dir: &Path, files: &[CarriedFile]) -> Result<(), EngineError> {
    for f in files {
        let path = dir.join(&f.name);
        let bytes = std::fs::read(&path).map_err(|source| EngineError::Io {
            path: path.clone(),
            source,
        })?;
        if bytes.len() as u64 != f.size || Digest::of(&bytes).to_string() != f.digest {
            return Err(EngineError::File {
                path,
                message: "differs from the file this store was packed with; restore it, or re-pack with `larder pack --repair`".into(),
            });
        }
    }
    for name in CARRIED_FILES {
        let path = dir.join(name);
        if path.exists() && !files.iter().any(|f| f.name == *name) {
            return Err(EngineError::File {
                path,
                message: "is not part of this store (the manifest does not list it) but would change the output; remove it".into(),
            });
        }
    }
    Ok(())
}

/// The index of a packed store at `dir`, after checking its config.json is
/// the one it was packed from and its carried files are the ones packed.
pub(crate) fn packed_index(dir: &Path) -> Result<(Manifest, ExpertIndex), EngineError> {
    let manifest = Manifest::read(dir).map_err(store_err)?;
    let cfg = dir.join("config.json");
    let bytes = std::fs::read(&cfg).map_err(|source| EngineError::Io { path: cfg.clone(), source })?;
    if Digest::of(&bytes).to_string() != manifest.source.config_digest {
        return Err(EngineError::File {
            path: cfg,
            message: "differs from the config.json the store's manifest was packed from; the manifest belongs to another model".into(),
        });
    }
    check_carried_files(dir, &manifest)?;
    let index = manifest.index(dir).map_err(store_err)?;
    Ok((manifest, index))
}

/// The check every spine tensor must pass as the model takes it.
fn spine_check_of(spine: &[SpineFile]) -> Arc<TensorCheck> {
    let entries: HashMap<String, SpineTensorEntry> = spine
        .iter()
        .flat_map(|s| s.tensors.iter())
        .map(|t| (t.name.clone(), t.clone()))
        .collect();
    Arc::new(move |name: &str, info: &TensorInfo, bytes: &[u8]| match entries.get(name) {
        Some(e) => e.check(&info.dtype, &info.shape, info.offset, bytes),
        None => Err("is not in the store's manifest; the spine file was changed after packing".into()),
    })
}

/// Opens a store's spine as a checkpoint whose every tensor is checked
/// against the manifest, after checking the spine files' names, sizes and headers.
pub(crate) fn open_spine(dir: &Path, manifest: &Manifest) -> Result<Checkpoint, EngineError> {
    open_spine_files(dir, &manifest.spine)
}

/// Opens spine files as a checkpoint whose every tensor is checked against
/// their entries (a manifest's or a lazy cache's).
pub(crate) fn open_spine_files(dir: &Path, spine: &[SpineFile]) -> Result<Checkpoint, EngineError> {
    for s in spine {
        let path = dir.join(&s.file);
        if !path.is_file() {
            return Err(EngineError::File {
                path,
                message: "missing: the store's manifest.json lists it as a spine file; \
                          `larder pack --model CHECKPOINT --out STORE --repair` writes it again"
                    .into(),
            });
        }
    }
    let mut ckpt = Checkpoint::open(dir)?;
    check_spine_files(dir, spine, &ckpt)?;
    ckpt.set_tensor_check(spine_check_of(spine));
    Ok(ckpt)
}

/// The checkpoint's safetensors files are exactly the manifest's spine
/// files, with their packed sizes and headers.
fn check_spine_files(dir: &Path, spine: &[SpineFile], ckpt: &Checkpoint) -> Result<(), EngineError> {
    let files = ckpt.file_paths();
    let spine_names: Vec<_> = spine.iter().map(|s| dir.join(&s.file)).collect();
    if files != spine_names {
        return Err(EngineError::File {
            path: dir.to_path_buf(),
            message: format!(
                "the store's safetensors files are {files:?}, its manifest lists {spine_names:?}; remove extra files or re-pack"
            ),
        });
    }
    for (i, s) in spine.iter().enumerate() {
        let path = &files[i];
        let size = std::fs::metadata(path)
            .map_err(|source| EngineError::Io {
                path: path.clone(),
                source,
            })?
            .len();
        if size != s.size || Digest::of(ckpt.file_header(i)).to_string() != s.header_digest {
            return Err(EngineError::File {
                path: path.clone(),
                message: "differs from the spine this store was packed with (size or header); `larder pack --repair` rewrites it".into(),
            });
        }
    }
    Ok(())
}

/// The bytes [`verify`] reads of the store in `dir` (its `manifest`): the
/// spine, every expert record and every mirrored copy (its progress total).
pub fn verify_bytes(dir: &Path, manifest: &Manifest) -> u64 {
    let record = |l: &larder_store::manifest::LayerEntry| l.parts.iter().map(|p| p.len).sum::<u64>();
    let spine: u64 = manifest.spine.iter().map(|s| s.size).sum();
    let records: u64 = manifest.layers.iter().map(|l| l.experts.len() as u64 * record(l)).sum();
    let mirrored: u64 = larder_store::mirror::listed(dir)
        .into_iter()
        .filter_map(|(layer, _)| manifest.layers.iter().find(|l| l.layer == layer))
        .map(record)
        .sum();
    spine + records + mirrored
}

/// `larder verify`: larder-store's checks of every byte, then whether the
/// store loads as a model (config, every tensor the architecture needs,
/// expert records matching the config). Problems are added to `bad`.
pub fn verify(dir: &Path, progress: &mut dyn FnMut(u64)) -> Result<VerifyReport, EngineError> {
    let loaded = check_loads(dir);
    let check = |layer: usize, _: usize, parts: &[&[u8]]| match &loaded {
        Ok(experts) => experts.check_parts(layer, parts),
        Err(_) => Ok(()),
    };
    let mut report = larder_store::verify_store_with(dir, progress, &check).map_err(store_err)?;
    if let Err(e) = loaded {
        report.bad.push(format!("the store does not load: {e}"));
    }
    Ok(report)
}

/// Loads the store as a model (headers only, no weight bytes read); its
/// expert provider, whose checks every record must pass as well.
fn check_loads(dir: &Path) -> Result<Arc<StoreExperts>, EngineError> {
    // Spine bytes are checked by the store's verify; here only whether they load.
    let (manifest, index) = packed_index(dir)?;
    let spec = read_spec(dir)?;
    let ckpt = Checkpoint::open_unread(dir)?;
    check_spine_files(dir, &manifest.spine, &ckpt)?;
    let store = Arc::new(
        ExpertStore::open(
            index,
            StoreOptions {
                prefetch_threads: 0,
                ram_budget: 0,
                ..StoreOptions::default()
            },
        )
        .map_err(store_err)?,
    );
    let provider = Arc::new(StoreExperts::new(store, &spec)?);
    DecoderModel::load(spec, &ckpt, Some(provider.clone()))?;
    Ok(provider)
}
