//! Where each expert's bytes are: the [`ExpertIndex`] maps (layer, expert) to
//! the file extents to read and the place of each component (gate, up, down,
//! scales) in them. A packed store has one aligned extent per expert; direct
//! streaming from safetensors has one extent per tensor. The I/O backends and
//! the cache only ever see this index.

use std::path::PathBuf;

use crate::digest::Digest;

/// A byte range of one file of the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub file: usize,
    pub offset: u64,
    pub len: u64,
}

impl Extent {
    /// The first `bytes / record` records of `file`, back to back: how the drive probes read.
    pub fn tiling(file: usize, bytes: u64, record: u64) -> Vec<Extent> {
        (0..bytes / record)
            .map(|i| Extent {
                file,
                offset: i * record,
                len: record,
            })
            .collect()
    }
}

/// One component's bytes: a range inside one of the expert's extents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub extent: usize,
    pub offset: u64,
    pub len: u64,
}

/// One expert's extents and components.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExpertLocation {
    pub extents: Vec<Extent>,
    /// In component order (the order the model expects, e.g. gate, up, down).
    pub parts: Vec<Part>,
    /// Digest of the components' bytes concatenated in order (packed stores).
    pub digest: Option<Digest>,
    /// The seed binding `digest` to this record's place (see `crate::record`).
    pub digest_seed: u64,
    /// Other copies of the same bytes (mirrors, see [`crate::mirror`]): extent
    /// lists shaped like `extents` (same count and lengths), so `parts`
    /// and `digest` hold for each. Reads go to the copy that should finish
    /// first (`crate::drive_load`).
    pub copies: Vec<Vec<Extent>>,
}

impl ExpertLocation {
    /// Bytes of the components (what the model computes on).
    pub fn payload_len(&self) -> u64 {
        self.parts.iter().map(|p| p.len).sum()
    }

    /// Copy `c`'s extents: 0 is the primary, 1.. the mirrors (an unknown
    /// copy reads the primary).
    pub fn copy(&self, c: usize) -> &[Extent] {
        match c {
            0 => &self.extents,
            _ => self.copies.get(c - 1).map_or(&self.extents, |x| x.as_slice()),
        }
    }

    /// Bytes one read of a copy fetches (every copy is shaped alike).
    pub(crate) fn read_len(&self) -> u64 {
        self.extents.iter().map(|x| x.len).sum()
    }
}

/// What one component of a layer's experts is (the same for every expert of
/// the layer): its role (`gate`, `up`, `down`, `gate.scale`, ...), stored
/// dtype as safetensors names it (`BF16`, `F8_E4M3`, ...) and shape.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PartDesc {
    pub role: String,
    pub dtype: String,
    pub shape: Vec<usize>,
}

/// Every routed expert's location, by layer then expert id.
#[derive(Debug, Clone, Default)]
pub struct ExpertIndex {
    pub files: Vec<PathBuf>,
    /// `parts[l]`: the components of layer `l`'s experts, in `Part` order.
    pub parts: Vec<Vec<PartDesc>>,
    /// `layers[l][e]`; layers without routed experts are empty.
    pub layers: Vec<Vec<ExpertLocation>>,
    /// The drive each of `files` is on (empty: all on drive 0).
    pub file_drive: Vec<usize>,
    /// Each drive's read bandwidth in GB/s, where known (packed stores).
    pub drive_gbps: Vec<f64>,
}

impl ExpertIndex {
    pub fn get(&self, layer: usize, expert: usize) -> Option<&ExpertLocation> {
        self.layers.get(layer)?.get(expert)
    }

    /// Layers that hold routed experts.
    pub fn expert_layers(&self) -> usize {
        self.layers.iter().filter(|l| !l.is_empty()).count()
    }

    /// Total payload bytes of all experts.
    pub fn total_bytes(&self) -> u64 {
        self.layers.iter().flatten().map(|e| e.payload_len()).sum()
    }

    /// Checks every extent lies inside its file and every part inside its
    /// extent, given the files' sizes.
    pub(crate) fn check_bounds(&self, sizes: &[u64]) -> Result<(), crate::StoreError> {
        for (l, experts) in self.layers.iter().enumerate() {
            for (e, loc) in experts.iter().enumerate() {
                for x in loc.extents.iter().chain(loc.copies.iter().flatten()) {
                    let size = *sizes
                        .get(x.file)
                        .ok_or_else(|| crate::StoreError::Invalid(format!("layer {l} expert {e}: file index {} out of range", x.file)))?;
                    let end = x.offset.saturating_add(x.len);
                    if end > size {
                        return Err(crate::StoreError::Truncated {
                            path: self.files[x.file].clone(),
                            needed: end,
                            size,
                        });
                    }
                }
                for p in &loc.parts {
                    let ok = loc
                        .extents
                        .get(p.extent)
                        .is_some_and(|x| p.offset.checked_add(p.len).is_some_and(|end| end <= x.len));
                    if !ok {
                        return Err(crate::StoreError::Invalid(format!(
                            "layer {l} expert {e}: component range outside its extent"
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}
