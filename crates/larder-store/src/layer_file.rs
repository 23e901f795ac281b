//! One layer's records on one drive: `<drive>/larder-<store id>/layer-LLL.experts`,
//! a [`LayerHeader`] block then one 4 KiB-aligned record per expert, with a
//! sidecar (`.json`) listing the records and their bound digests.
//!
//! A new file is written under a temporary name, read back and checked,
//! then renamed. A file found from an earlier pack is kept only as far as it
//! is proven: every record is read again from the source and from the file,
//! and a record whose source bytes changed, or whose stored bytes differ,
//! is rewritten in place (this is also how `pack --repair` mends exactly the
//! records `verify` finds bad).

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::buf::AlignedBuf;
use crate::digest::Digest;
use crate::fsutil::{commit, temp_path, write_atomic};
use crate::io::{open_checking, IoBackend};
use crate::location::Extent;
use crate::manifest::{ExpertEntry, PartEntry};
use crate::pack_plan::{record_layout, store_folder, PackEvent, PackLayer, PackSource, Plan};
use crate::record::{record_seed, source_digest, LayerHeader, LAYER_HEADER_LEN};
use crate::StoreError;

/// What one layer file holds: its header, record size and records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Sidecar {
    header: LayerHeader,
    record_len: u64,
    entries: Vec<ExpertEntry>,
}

/// One layer file of a store: one layer's records placed on one drive.
pub(crate) struct LayerOut {
    /// Index into `PackSource::layers`.
    pub layer: usize,
    /// Experts placed on this drive, in file order.
    pub mine: Vec<usize>,
    pub parts: Vec<PartEntry>,
    pub record_len: u64,
    /// Digest seed of each expert of the layer (by expert id).
    pub seeds: Vec<u64>,
    pub header: LayerHeader,
    /// Name relative to the drive directory, and full path.
    pub name: String,
    pub path: PathBuf,
}

impl LayerOut {
    /// The file, reading records from `sources` (its layer's source files).
    pub(crate) fn file<'a>(&'a self, src: &'a PackSource, sources: &'a dyn IoBackend) -> LayerFile<'a> {
        LayerFile {
            sources,
            layer: &src.layers[self.layer],
            out: self,
        }
    }
}

/// Every layer file of the store `plan` makes of `src`, layer by layer,
/// then drive by drive (`drive_dirs`: the plan's drives resolved); an error
/// when an expert's components differ in size from expert 0's.
pub(crate) fn layer_outs(src: &PackSource, plan: &Plan, drive_dirs: &[PathBuf]) -> Result<Vec<LayerOut>, StoreError> {
    let source = source_digest(&src.identity);
    let mut outs = Vec::new();
    for (li, (layer, (_, placement))) in src.layers.iter().zip(&plan.placement).enumerate() {
        let (parts, record_len) = record_layout(&layer.parts, &layer.experts);
        if let Some(e) = layer
            .experts
            .iter()
            .position(|x| x.len() != parts.len() || x.iter().zip(&parts).any(|(x, p)| x.len != p.len))
        {
            return Err(StoreError::Invalid(format!(
                "layer {} expert {e}: components differ in size from expert 0's",
                layer.layer
            )));
        }
        let seeds: Vec<u64> = (0..layer.experts.len())
            .map(|e| record_seed(&plan.store_id, layer.layer, e, &parts))
            .collect();
        for (k, dir) in drive_dirs.iter().enumerate() {
            let mine: Vec<usize> = (0..layer.experts.len()).filter(|&e| placement.get(e) == Some(&k)).collect();
            if mine.is_empty() {
                continue;
            }
            let name = format!("{}/layer-{:03}.experts", store_folder(&plan.store_id), layer.layer);
            outs.push(LayerOut {
                layer: li,
                mine,
                parts: parts.clone(),
                record_len,
                seeds: seeds.clone(),
                header: LayerHeader {
                    store_id: plan.store_id.clone(),
                    source: source.clone(),
                    layer: layer.layer,
                    drive: k,
                },
                path: dir.join(&name),
                name,
            });
        }
    }
    Ok(outs)
}

/// One layer file to write, prove or seal.
pub(crate) struct LayerFile<'a> {
    /// The checkpoint's files, read through the store's one I/O path.
    pub sources: &'a dyn IoBackend,
    pub layer: &'a PackLayer,
    pub out: &'a LayerOut,
}

impl LayerFile<'_> {
    /// Writes the file, or proves and mends one left by an earlier pack.
    /// Returns its entries and how many records were rewritten in place
    /// (`None` when the whole file was written anew).
    pub(crate) fn pack(&self, progress: &mut dyn FnMut(PackEvent)) -> Result<(Vec<ExpertEntry>, Option<usize>), StoreError> {
        match self.read_sidecar() {
            Some(entries) if self.out.header.check(&self.out.path).is_ok() => {
                let (entries, rewritten) = self.prove(entries, progress)?;
                Ok((entries, Some(rewritten)))
            }
            _ => Ok((self.write(progress)?, None)),
        }
    }

    /// Seals a file whose records `pull` wrote in place under its temporary
    /// name (header block first): digests every record as it lies, reads
    /// the file back against the digests, commits it and writes its
    /// sidecar. A file an interrupted earlier seal already committed (its
    /// sidecar and header match) is kept as it is.
    #[cfg(feature = "remote")]
    pub(crate) fn seal(&self) -> Result<Vec<ExpertEntry>, StoreError> {
        let tmp = temp_path(&self.out.path);
        if !tmp.exists() {
            if let Some(entries) = self.read_sidecar().filter(|_| self.out.header.check(&self.out.path).is_ok()) {
                return Ok(entries);
            }
        }
        let file = File::open(&tmp).map_err(|e| StoreError::io(&tmp, e))?;
        let mut buf = AlignedBuf::new(self.out.record_len as usize);
        let mut entries = Vec::with_capacity(self.out.mine.len());
        for (i, &e) in self.out.mine.iter().enumerate() {
            file.read_exact_at(buf.as_mut_slice(), self.offset(i))
                .map_err(|err| StoreError::io(&tmp, err))?;
            let digest = Digest::of_parts_seeded(self.out.seeds[e], [&buf.as_ref()[..self.payload_len() as usize]]);
            entries.push(self.entry(i, e, digest));
        }
        file.sync_all().map_err(|e| StoreError::io(&tmp, e))?;
        drop(file);
        self.check_file(&tmp, &entries)?;
        commit(&tmp, &self.out.path)?;
        self.write_sidecar(&entries)?;
        Ok(entries)
    }

    /// The manifest entry of expert `e`, record `i` of this file.
    fn entry(&self, i: usize, e: usize, digest: Digest) -> ExpertEntry {
        ExpertEntry {
            expert: e,
            drive: self.out.header.drive,
            file: self.out.name.clone(),
            offset: self.offset(i),
            len: self.out.record_len,
            digest: digest.to_string(),
        }
    }

    fn payload_len(&self) -> u64 {
        self.out.parts.iter().map(|p| p.len).sum()
    }

    /// The sidecar of an existing file, if it describes what we would write.
    fn read_sidecar(&self) -> Option<Vec<ExpertEntry>> {
        let side: Sidecar = serde_json::from_slice(&std::fs::read(sidecar(&self.out.path)).ok()?).ok()?;
        let size = std::fs::metadata(&self.out.path).ok()?.len();
        let ok =
            side.header == self.out.header
                && side.record_len == self.out.record_len
                && side.entries.len() == self.out.mine.len()
                && side.entries.iter().zip(&self.out.mine).enumerate().all(|(i, (e, &m))| {
                    e.expert == m && e.len == self.out.record_len && e.offset == self.offset(i) && e.file == self.out.name
                })
                && size == LAYER_HEADER_LEN + self.out.record_len * self.out.mine.len() as u64;
        ok.then_some(side.entries)
    }

    fn offset(&self, i: usize) -> u64 {
        record_offset(i, self.out.record_len)
    }

    /// Reads expert `e`'s components from the source into `buf` (zero
    /// padded to the record) and returns their bound digest.
    fn read_source(&self, e: usize, buf: &mut AlignedBuf) -> Result<Digest, StoreError> {
        let extents: &[Extent] = &self.layer.experts[e];
        if extents.len() != self.out.parts.len() || extents.iter().zip(&self.out.parts).any(|(x, p)| x.len != p.len) {
            return Err(StoreError::Invalid(format!(
                "layer {} expert {e}: components differ in size from expert 0's",
                self.layer.layer
            )));
        }
        let views = self.sources.read_blocking(extents)?;
        let b = buf.as_mut_slice();
        b.fill(0);
        for (v, p) in views.iter().zip(&self.out.parts) {
            b[p.offset as usize..(p.offset + p.len) as usize].copy_from_slice(v.as_slice());
        }
        Ok(Digest::of_parts_seeded(
            self.out.seeds[e],
            [&buf.as_ref()[..self.payload_len() as usize]],
        ))
    }

    /// Writes the whole file under a temporary name, checks it, commits it.
    fn write(&self, progress: &mut dyn FnMut(PackEvent)) -> Result<Vec<ExpertEntry>, StoreError> {
        let tmp = temp_path(&self.out.path);
        let result = (|| {
            let mut f = File::create(&tmp).map_err(|e| StoreError::io(&tmp, e))?;
            f.write_all(&self.out.header.to_block()).map_err(|e| StoreError::io(&tmp, e))?;
            let mut buf = AlignedBuf::new(self.out.record_len as usize);
            let mut entries = Vec::with_capacity(self.out.mine.len());
            for (i, &e) in self.out.mine.iter().enumerate() {
                let digest = self.read_source(e, &mut buf)?;
                f.write_all(&buf.as_ref()[..self.out.record_len as usize])
                    .map_err(|err| StoreError::io(&tmp, err))?;
                entries.push(self.entry(i, e, digest));
                progress(PackEvent::Advanced { bytes: self.payload_len() });
            }
            f.sync_all().map_err(|e| StoreError::io(&tmp, e))?;
            drop(f);
            self.check_file(&tmp, &entries)?;
            Ok(entries)
        })();
        match result {
            Ok(entries) => {
                commit(&tmp, &self.out.path)?;
                self.write_sidecar(&entries)?;
                Ok(entries)
            }
            Err(e) => {
                // Do not leave a half-written file (it also frees the space of a full disk).
                let _ = std::fs::remove_file(&tmp);
                Err(e)
            }
        }
    }

    /// Re-reads every record from the source and from the file; rewrites in
    /// place each one that differs. Returns the entries and the rewrite count.
    fn prove(&self, mut entries: Vec<ExpertEntry>, progress: &mut dyn FnMut(PackEvent)) -> Result<(Vec<ExpertEntry>, usize), StoreError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.out.path)
            .map_err(|e| StoreError::io(&self.out.path, e))?;
        let mut src = AlignedBuf::new(self.out.record_len as usize);
        let mut have = AlignedBuf::new(self.out.record_len as usize);
        let mut bad = Vec::new();
        for (i, entry) in entries.iter_mut().enumerate() {
            let want = self.read_source(entry.expert, &mut src)?;
            let stored = file
                .read_exact_at(have.as_mut_slice(), entry.offset)
                .ok()
                .map(|_| Digest::of_parts_seeded(self.out.seeds[entry.expert], [&have.as_ref()[..self.payload_len() as usize]]));
            if want.to_string() != entry.digest || stored != Some(want) {
                file.write_all_at(&src.as_ref()[..self.out.record_len as usize], entry.offset)
                    .map_err(|e| StoreError::io(&self.out.path, e))?;
                entry.digest = want.to_string();
                bad.push(i);
                progress(PackEvent::RecordRewritten {
                    layer: self.layer.layer,
                    expert: entry.expert,
                });
            }
            progress(PackEvent::Advanced { bytes: self.payload_len() });
        }
        if !bad.is_empty() {
            file.sync_all().map_err(|e| StoreError::io(&self.out.path, e))?;
            self.check_file(&self.out.path, &entries)?;
            self.write_sidecar(&entries)?;
        }
        Ok((entries, bad.len()))
    }

    fn write_sidecar(&self, entries: &[ExpertEntry]) -> Result<(), StoreError> {
        let side = Sidecar {
            header: self.out.header.clone(),
            record_len: self.out.record_len,
            entries: entries.to_vec(),
        };
        let text = serde_json::to_vec(&side).map_err(|e| StoreError::Invalid(e.to_string()))?;
        write_atomic(&sidecar(&self.out.path), &text)
    }

    /// Reads a layer file back (O_DIRECT where the file system allows) and
    /// checks its header and every record's digest.
    fn check_file(&self, path: &Path, entries: &[ExpertEntry]) -> Result<(), StoreError> {
        self.out.header.check(path)?;
        let file = open_checking(&[path.to_path_buf()], 1)?;
        for e in entries {
            let record = Extent {
                file: 0,
                offset: e.offset,
                len: e.len,
            };
            let views = file.read_blocking(&[record])?;
            let got = Digest::of_parts_seeded(self.out.seeds[e.expert], [&views[0].as_slice()[..self.payload_len() as usize]]);
            if got.to_string() != e.digest {
                return Err(StoreError::Digest {
                    layer: self.layer.layer,
                    expert: e.expert,
                    path: path.to_path_buf(),
                    offset: e.offset,
                    expected: e.digest.clone(),
                    got: got.to_string(),
                });
            }
        }
        Ok(())
    }
}

/// Where the `i`-th record of a layer file starts (after the header block).
pub(crate) fn record_offset(i: usize, record_len: u64) -> u64 {
    LAYER_HEADER_LEN + i as u64 * record_len
}

fn sidecar(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".json");
    path.with_file_name(name)
}
