//! What binds a record to its place: the layout of its components
//! ([`PartEntry`]) and the identity of the checkpoint it was packed from
//! ([`SourceIdentity`]), both listed in the manifest (which re-exports them);
//! the digest seed of an expert record (store id, layer, expert, and every
//! component's role, dtype, shape, offset and length); and the header at the
//! start of every layer file naming the store, source checkpoint, layer and
//! drive it belongs to.
//!
//! With both, a layer file of another store (two stores packed onto one
//! drive folder), a record moved to another expert id, or a manifest whose
//! dtype, shape or offsets were edited can no longer pass as valid: the
//! digest of the same bytes under another binding differs, and the header
//! names the store the file was written for.

use std::os::unix::fs::FileExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::location::PartDesc;
use crate::StoreError;

/// Bytes reserved at the start of a layer file for its header; records follow.
pub(crate) const LAYER_HEADER_LEN: u64 = 4096;
const LAYER_MAGIC: &[u8] = b"LARDER-LAYER-FILE\n";

/// The checkpoint a store was packed from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceIdentity {
    /// Digest of the source's `config.json` bytes (the copy in the store must match).
    pub config_digest: String,
    pub files: Vec<SourceFile>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceFile {
    pub name: String,
    pub size: u64,
    /// Digest of the safetensors header (names, dtypes, shapes, offsets).
    pub header_digest: String,
}

/// One component of a record: what it is and its byte range inside the
/// record (the layout every record of a layer shares; part of the binding).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartEntry {
    #[serde(flatten)]
    pub desc: PartDesc,
    /// Byte range inside the record.
    pub offset: u64,
    pub len: u64,
}

/// The seed of record (`layer`, `expert`)'s digest in store `store_id`.
pub(crate) fn record_seed(store_id: &str, layer: usize, expert: usize, parts: &[PartEntry]) -> u64 {
    let layout = serde_json::to_string(parts).unwrap_or_default();
    let what = format!("larder-record/2\0store={store_id}\0layer={layer}\0expert={expert}\0parts={layout}");
    Digest::seed_of(what.as_bytes())
}

/// The digest of a source identity (what a layer file header names).
pub(crate) fn source_digest(source: &SourceIdentity) -> String {
    Digest::of(&serde_json::to_vec(source).unwrap_or_default()).to_string()
}

/// The identity a layer file carries in its first [`LAYER_HEADER_LEN`] bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerHeader {
    pub store_id: String,
    /// [`source_digest`] of the checkpoint the store was packed from.
    pub source: String,
    pub layer: usize,
    pub drive: usize,
}

impl LayerHeader {
    /// The header block, padded to [`LAYER_HEADER_LEN`] bytes.
    pub(crate) fn to_block(&self) -> Vec<u8> {
        let mut block = LAYER_MAGIC.to_vec();
        block.extend_from_slice(&serde_json::to_vec(self).unwrap_or_default());
        block.push(b'\n');
        block.resize(LAYER_HEADER_LEN as usize, 0);
        block
    }

    /// Reads the header of the layer file at `path`.
    pub fn read(path: &Path) -> Result<LayerHeader, StoreError> {
        let bad = |m: &str| StoreError::manifest(path, format!("not a layer file of a larder store ({m}); re-pack it"));
        let f = std::fs::File::open(path).map_err(|e| StoreError::io(path, e))?;
        let mut block = vec![0u8; LAYER_HEADER_LEN as usize];
        f.read_exact_at(&mut block, 0).map_err(|_| bad("shorter than its header"))?;
        let rest = block.strip_prefix(LAYER_MAGIC).ok_or_else(|| bad("no header"))?;
        let end = rest.iter().position(|&b| b == b'\n').ok_or_else(|| bad("unterminated header"))?;
        serde_json::from_slice(&rest[..end]).map_err(|_| bad("unreadable header"))
    }

    /// Checks the file at `path` carries this header; the error names both stores.
    pub fn check(&self, path: &Path) -> Result<(), StoreError> {
        let got = LayerHeader::read(path)?;
        if got != *self {
            let what = if got.store_id != self.store_id {
                format!("belongs to store {}, not to this store ({})", got.store_id, self.store_id)
            } else {
                format!(
                    "is layer {} drive {} of source {}, expected layer {} drive {} of source {}",
                    got.layer, got.drive, got.source, self.layer, self.drive, self.source
                )
            };
            return Err(StoreError::manifest(path, format!("this layer file {what}")));
        }
        Ok(())
    }
}
