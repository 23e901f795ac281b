//! The end of a pull: every output written in place becomes a store file
//! as `pack` would have written it. Each layer file's records are digested
//! as they lie, read back against the digests and committed with their
//! sidecar ([`LayerFile::seal`]); the spine's tensors are digested, the
//! file checked ([`check_spine`]) and committed. A seal interrupted half way
//! resumes: files already committed are kept.

use std::os::unix::fs::FileExt;
use std::path::Path;

use larder_tensor::safetensors_write::Header;

use super::scatter::Layout;
use crate::digest::Digest;
use crate::fsutil::{commit, temp_path};
use crate::io::{open_backend, IoKind, IoOptions};
use crate::manifest::{ExpertEntry, LayerEntry, SpineFile};
use crate::pack_plan::{record_layout, PackSource, SPINE};
use crate::spine::check_spine;
use crate::StoreError;

/// Seals every layer file and the spine; their manifest entries.
pub(crate) fn seal(src: &PackSource, layout: &Layout, out: &Path) -> Result<(Vec<LayerEntry>, SpineFile), StoreError> {
    // Sealing reads no source: the records are already in place.
    let no_sources = open_backend(
        &[],
        IoOptions {
            kind: IoKind::Mmap,
            direct: false,
            depth: 1,
        },
    )?;
    let mut experts: Vec<Vec<Option<ExpertEntry>>> = src.layers.iter().map(|l| vec![None; l.experts.len()]).collect();
    for lo in &layout.layers {
        let file = lo.file(src, no_sources.as_ref());
        for entry in file.seal()? {
            let slot = experts[lo.layer]
                .get_mut(entry.expert)
                .ok_or_else(|| StoreError::Invalid(format!("{}: record of an unknown expert", lo.path.display())))?;
            *slot = Some(entry);
        }
    }
    let layers = src
        .layers
        .iter()
        .zip(experts)
        .map(|(layer, entries)| {
            Ok(LayerEntry {
                layer: layer.layer,
                parts: record_layout(&layer.parts, &layer.experts).0,
                experts: entries
                    .into_iter()
                    .map(|e| e.ok_or_else(|| StoreError::Invalid(format!("layer {}: an expert was not placed", layer.layer))))
                    .collect::<Result<_, _>>()?,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    let spine = seal_spine(src, &layout.spine_header, out)?;
    Ok((layers, spine))
}

/// Digests the spine written in place, checks and commits it (or, when an
/// earlier seal committed it, digests the committed file).
pub(crate) fn seal_spine(src: &PackSource, header: &Header, out: &Path) -> Result<SpineFile, StoreError> {
    let path = out.join(SPINE);
    let tmp = temp_path(&path);
    let written = if tmp.exists() { tmp.clone() } else { path.clone() };
    let file = std::fs::File::open(&written).map_err(|e| StoreError::io(&written, e))?;
    let mut buf = vec![0u8; 8 << 20];
    let mut tensors = Vec::with_capacity(src.spine.len());
    let mut at = header.data_start();
    for t in &src.spine {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        let mut off = 0;
        while off < t.extent.len {
            let n = (t.extent.len - off).min(buf.len() as u64) as usize;
            file.read_exact_at(&mut buf[..n], at + off)
                .map_err(|e| StoreError::io(&written, e))?;
            h.update(&buf[..n]);
            off += n as u64;
        }
        tensors.push(t.entry(at, Digest(h.digest128())));
        at += t.extent.len;
    }
    let entry = SpineFile {
        file: SPINE.to_string(),
        size: at,
        header_digest: Digest::of(header.json()).to_string(),
        tensors,
    };
    if written == tmp {
        file.sync_all().map_err(|e| StoreError::io(&tmp, e))?;
        if let Some(first) = check_spine(&tmp, &entry)?.first() {
            return Err(StoreError::Invalid(format!(
                "{}: read back after writing: {first} (is the drive failing?)",
                tmp.display()
            )));
        }
        commit(&tmp, &path)?;
    }
    Ok(entry)
}
