//! `manifest.json` of a packed store (docs/store.md): format
//! version, the store's id, the identity of the source checkpoint, the
//! digests of the carried files (config, tokenizer, templates) and of every
//! spine tensor, the drives, and for every (layer, expert) its drive, file,
//! offset, length and bound digest, with the components' dtype, shape and
//! place inside the record. A digest over all of it closes the manifest:
//! an edited field is refused at read.
//!
//! The manifest is written last, atomically; a folder without one is not a
//! store, and a manifest from another format version or another model is
//! refused with an error saying so.
//!
//! The index of a store's records is built here from the manifest
//! (`Manifest::index_without_mirrors`); [`Manifest::index`], which also
//! attaches the mirrored copies `mirrors.json` lists, is defined beside them
//! in [`crate::mirror`]. The record layout and source identity types are
//! `crate::record`'s, re-exported here.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::location::{ExpertIndex, ExpertLocation, Extent, Part};
use crate::record::{record_seed, source_digest, LayerHeader};
pub use crate::record::{PartEntry, SourceFile, SourceIdentity};
use crate::StoreError;

pub const MANIFEST: &str = "manifest.json";
pub const FORMAT: &str = "larder-store";
pub(crate) const VERSION: u32 = 2;
/// Most layers a store may have (no model comes near; config.json has the same bound).
pub const MAX_LAYERS: usize = 4096;

/// A file copied from the checkpoint (config.json, tokenizer.json, templates).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CarriedFile {
    pub name: String,
    pub size: u64,
    pub digest: String,
}

/// One tensor of a spine file: where it is and the digest of its bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpineTensorEntry {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    /// Absolute byte range in the spine file.
    pub offset: u64,
    pub len: u64,
    pub digest: String,
}

/// A spine safetensors file of the store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpineFile {
    /// Relative to the store root.
    pub file: String,
    pub size: u64,
    /// Digest of the safetensors header (bytes 8 .. 8 + header length).
    pub header_digest: String,
    pub tensors: Vec<SpineTensorEntry>,
}

impl SpineTensorEntry {
    /// Checks a tensor the model takes from the spine is this entry, bytes included.
    pub fn check(&self, dtype: &str, shape: &[usize], offset: u64, bytes: &[u8]) -> Result<(), String> {
        if self.dtype != dtype || self.shape != shape || self.offset != offset || self.len != bytes.len() as u64 {
            return Err(format!(
                "is {dtype} {shape:?} at offset {offset} ({} bytes), the manifest says {} {:?} at {} ({} bytes)",
                bytes.len(),
                self.dtype,
                self.shape,
                self.offset,
                self.len
            ));
        }
        let got = Digest::of(bytes).to_string();
        if got != self.digest {
            return Err(format!(
                "digest mismatch (expected {}, got {got}): the spine is corrupt; `larder pack --repair` rewrites it",
                self.digest
            ));
        }
        Ok(())
    }
}

/// A drive directory holding layer files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriveEntry {
    /// Relative to the store root when inside it, else absolute.
    pub path: String,
    /// Read bandwidth used for placement (measured during pack, or given).
    pub gbps: f64,
}

/// One layer's experts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerEntry {
    pub layer: usize,
    /// Components of every record of this layer, in record order.
    pub parts: Vec<PartEntry>,
    pub experts: Vec<ExpertEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExpertEntry {
    pub expert: usize,
    pub drive: usize,
    /// Relative to the drive directory.
    pub file: String,
    /// 4 KiB-aligned record start and padded length.
    pub offset: u64,
    pub len: u64,
    /// Digest of the record's components, concatenated, seeded with the
    /// record's binding (`crate::record::record_seed`).
    pub digest: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    /// Random id of this store; layer files live under `larder-<id>/` on
    /// each drive and carry it in their header.
    pub store_id: String,
    pub model_type: String,
    pub source: SourceIdentity,
    /// Files copied from the checkpoint, in the store root.
    pub files: Vec<CarriedFile>,
    pub spine: Vec<SpineFile>,
    pub drives: Vec<DriveEntry>,
    pub layers: Vec<LayerEntry>,
    /// Digest of this manifest with this field empty (see [`Manifest::seal`]).
    pub digest: String,
}

/// The location of a packed record: one extent, its components at their
/// offsets inside it.
pub(crate) fn record_location(record: Extent, parts: &[PartEntry], digest: Option<Digest>, digest_seed: u64) -> ExpertLocation {
    ExpertLocation {
        extents: vec![record],
        parts: parts
            .iter()
            .map(|p| Part {
                extent: 0,
                offset: p.offset,
                len: p.len,
            })
            .collect(),
        digest,
        digest_seed,
        copies: Vec::new(),
    }
}

impl Manifest {
    /// Whether `dir` is a packed store (has a manifest).
    pub fn is_store(dir: &Path) -> bool {
        dir.join(MANIFEST).is_file()
    }

    /// Reads and checks `dir/manifest.json`.
    pub fn read(dir: &Path) -> Result<Manifest, StoreError> {
        let path = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path).map_err(|e| StoreError::io(&path, e))?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| StoreError::manifest(&path, format!("not valid JSON: {e}")))?;
        let format = value.get("format").and_then(|f| f.as_str()).unwrap_or("");
        if format != FORMAT {
            return Err(StoreError::manifest(
                &path,
                format!("not a larder store manifest (format {format:?})"),
            ));
        }
        let version = value.get("version").and_then(|v| v.as_u64()).unwrap_or(0);
        if version != VERSION as u64 {
            return Err(StoreError::manifest(
                &path,
                format!(
                    "store format version {version}, this larder reads version {VERSION}; \
                     pack the checkpoint again into a new folder (`larder pack --model CHECKPOINT --out NEW_STORE`)"
                ),
            ));
        }
        let m: Manifest = serde_json::from_value(value).map_err(|e| StoreError::manifest(&path, format!("malformed: {e}")))?;
        let want = m.sealed_digest();
        if m.digest != want {
            return Err(StoreError::manifest(
                &path,
                format!(
                    "the manifest was changed after packing (its digest is {:?}, its content gives {want}); \
                     `larder pack --model CHECKPOINT --out STORE --repair` rebuilds it",
                    m.digest
                ),
            ));
        }
        Ok(m)
    }

    /// The digest of this manifest's content, `digest` field left empty.
    fn sealed_digest(&self) -> String {
        let mut bare = self.clone();
        bare.digest.clear();
        Digest::of(&serde_json::to_vec(&bare).unwrap_or_default()).to_string()
    }

    /// Sets `digest` from the content: call after the last change.
    pub fn seal(&mut self) {
        self.digest = self.sealed_digest();
    }

    /// Writes `dir/manifest.json` atomically (temp file, fsync, rename), sealed.
    pub fn write(&self, dir: &Path) -> Result<(), StoreError> {
        let mut sealed = self.clone();
        sealed.seal();
        let text = serde_json::to_vec_pretty(&sealed).map_err(|e| StoreError::Invalid(format!("manifest: {e}")))?;
        crate::fsutil::write_atomic(&dir.join(MANIFEST), &text)
    }

    /// The header every layer file of drive `drive` for `layer` carries.
    pub(crate) fn layer_header(&self, layer: usize, drive: usize) -> LayerHeader {
        LayerHeader {
            store_id: self.store_id.clone(),
            source: source_digest(&self.source),
            layer,
            drive,
        }
    }

    /// The absolute directory of drive `d`.
    pub fn drive_dir(&self, root: &Path, d: usize) -> PathBuf {
        let p = Path::new(&self.drives[d].path);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            root.join(p)
        }
    }

    /// The store drive whose directory is `dir` (compared as canonical paths).
    pub fn drive_of(&self, root: &Path, dir: &Path) -> Option<usize> {
        let want = std::fs::canonicalize(dir).ok()?;
        (0..self.drives.len()).find(|&d| std::fs::canonicalize(self.drive_dir(root, d)).ok().as_ref() == Some(&want))
    }

    /// [`index`](Self::index) without the mirrored copies.
    pub(crate) fn index_without_mirrors(&self, root: &Path) -> Result<ExpertIndex, StoreError> {
        let index = self.primary_index(root)?;
        check_sizes(&index)?;
        Ok(index)
    }

    /// Every expert's primary record, drives and layer headers checked
    /// (file sizes are not: see [`check_sizes`]).
    pub(crate) fn primary_index(&self, root: &Path) -> Result<ExpertIndex, StoreError> {
        let mpath = root.join(MANIFEST);
        for d in 0..self.drives.len() {
            let dir = self.drive_dir(root, d);
            if !dir.is_dir() {
                return Err(StoreError::manifest(
                    &mpath,
                    format!("drive directory {} is missing (is the drive mounted?)", dir.display()),
                ));
            }
        }
        let mut index = ExpertIndex::default();
        let mut file_ids: std::collections::HashMap<PathBuf, usize> = Default::default();
        let mut seen = std::collections::HashSet::new();
        for le in &self.layers {
            if le.layer >= MAX_LAYERS || !seen.insert(le.layer) {
                return Err(StoreError::manifest(
                    &mpath,
                    format!("layer {}: repeated or beyond the {MAX_LAYERS} layers a store may have", le.layer),
                ));
            }
        }
        let max_layer = self.layers.iter().map(|l| l.layer + 1).max().unwrap_or(0);
        index.layers = vec![Vec::new(); max_layer];
        index.parts = vec![Vec::new(); max_layer];
        for le in &self.layers {
            let mut experts: Vec<Option<ExpertLocation>> = vec![None; le.experts.len()];
            for ee in &le.experts {
                if ee.drive >= self.drives.len() {
                    return Err(StoreError::manifest(
                        &mpath,
                        format!("layer {} expert {}: no drive {}", le.layer, ee.expert, ee.drive),
                    ));
                }
                if ee.file.contains("..") || Path::new(&ee.file).is_absolute() {
                    return Err(StoreError::manifest(
                        &mpath,
                        format!("layer {} expert {}: bad file name {:?}", le.layer, ee.expert, ee.file),
                    ));
                }
                let path = self.drive_dir(root, ee.drive).join(&ee.file);
                let next = file_ids.len();
                let file = *file_ids.entry(path.clone()).or_insert(next);
                if file == index.files.len() {
                    self.layer_header(le.layer, ee.drive).check(&path)?;
                    index.files.push(path);
                    index.file_drive.push(ee.drive);
                }
                let digest = Digest::parse(&ee.digest).ok_or_else(|| {
                    StoreError::manifest(
                        &mpath,
                        format!("layer {} expert {}: bad digest {:?}", le.layer, ee.expert, ee.digest),
                    )
                })?;
                let slot = experts
                    .get_mut(ee.expert)
                    .ok_or_else(|| StoreError::manifest(&mpath, format!("layer {}: expert id {} out of range", le.layer, ee.expert)))?;
                let record = Extent {
                    file,
                    offset: ee.offset,
                    len: ee.len,
                };
                let seed = record_seed(&self.store_id, le.layer, ee.expert, &le.parts);
                *slot = Some(record_location(record, &le.parts, Some(digest), seed));
            }
            index.layers[le.layer] = experts
                .into_iter()
                .enumerate()
                .map(|(e, x)| x.ok_or_else(|| StoreError::manifest(&mpath, format!("layer {}: expert {e} missing", le.layer))))
                .collect::<Result<_, _>>()?;
            index.parts[le.layer] = le.parts.iter().map(|p| p.desc.clone()).collect();
        }
        index.drive_gbps = self.drives.iter().map(|d| d.gbps).collect();
        Ok(index)
    }
}

/// Checks every extent of `index` lies inside its file.
pub(crate) fn check_sizes(index: &ExpertIndex) -> Result<(), StoreError> {
    let mut sizes = Vec::with_capacity(index.files.len());
    for f in &index.files {
        let meta = std::fs::metadata(f).map_err(|e| StoreError::io(f, e))?;
        sizes.push(meta.len());
    }
    index.check_bounds(&sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest_with_layers(layers: &[usize]) -> Manifest {
        Manifest {
            format: FORMAT.into(),
            version: VERSION,
            store_id: "0123456789abcdef".into(),
            model_type: "qwen3_moe".into(),
            source: SourceIdentity {
                config_digest: String::new(),
                files: Vec::new(),
            },
            files: Vec::new(),
            spine: Vec::new(),
            drives: Vec::new(),
            layers: layers
                .iter()
                .map(|&layer| LayerEntry {
                    layer,
                    parts: Vec::new(),
                    experts: Vec::new(),
                })
                .collect(),
            digest: String::new(),
        }
    }

    /// Found by the manifest fuzz target: a huge layer number overflowed
    /// `layer + 1` and the index allocation.
    #[test]
    fn huge_or_repeated_layer_numbers_are_errors_not_panics() {
        let root = std::env::temp_dir();
        for layers in [vec![usize::MAX], vec![usize::MAX - 1], vec![MAX_LAYERS], vec![3, 3]] {
            let e = manifest_with_layers(&layers).index(&root).unwrap_err().to_string();
            assert!(e.contains("repeated or beyond"), "{layers:?}: {e}");
        }
        assert!(manifest_with_layers(&[0, 2]).index(&root).is_ok());
    }
}
