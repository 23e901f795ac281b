//! `verify`: checks that a packed store is exactly what its manifest says:
//! the manifest's own digest (at read), every carried file (config,
//! tokenizer, templates), the spine file's header and every spine tensor,
//! every layer file's header (store, source, layer, drive), and every
//! record's bound digest (mirrored copies too), re-read with O_DIRECT where the file system
//! allows (so the drive itself is checked, not the page cache). Every
//! problem is listed, not only the first.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::digest::Digest;
use crate::io::open_checking;
use crate::location::Extent;
use crate::manifest::{Manifest, SourceFile};
use crate::spine::check_spine;
use crate::StoreError;

#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    pub store_id: String,
    pub model_type: String,
    /// The checkpoint the store was packed from (file names, sizes, header digests).
    pub source: Vec<SourceFile>,
    pub files: usize,
    pub spine_tensors: usize,
    pub spine_bytes: u64,
    pub records: usize,
    pub bytes: u64,
    /// Mirrored copies checked besides the records ([`crate::mirror`]).
    pub mirrored_records: usize,
    pub seconds: f64,
    /// One line per problem: what, where and what is wrong.
    pub bad: Vec<String>,
}

/// Checks the store at `dir`; `progress(bytes)` as spine files and record
/// bytes are checked (in all, the spine files' sizes plus the records' and
/// their mirrored copies' payload bytes).
/// An unreadable or altered manifest is an error (nothing else can be trusted).
pub fn verify_store(dir: &Path, progress: &mut dyn FnMut(u64)) -> Result<VerifyReport, StoreError> {
    verify_store_with(dir, progress, &|_, _, _| Ok(()))
}

/// What a record's bytes must also satisfy to be usable, beyond its digest
/// (the model's own checks, e.g. a compressed-tensors `weight_shape` that
/// matches the config): `check(layer, expert, parts)` with the record's
/// parts in index order; an error says what is wrong.
pub(crate) type RecordCheck<'a> = &'a dyn Fn(usize, usize, &[&[u8]]) -> Result<(), String>;

/// [`verify_store`], every record's parts also passed to `check`.
pub fn verify_store_with(dir: &Path, progress: &mut dyn FnMut(u64), check: RecordCheck<'_>) -> Result<VerifyReport, StoreError> {
    let manifest = Manifest::read(dir)?;
    let t = Instant::now();
    let mut report = VerifyReport {
        store_id: manifest.store_id.clone(),
        model_type: manifest.model_type.clone(),
        source: manifest.source.files.clone(),
        files: manifest.files.len(),
        spine_tensors: manifest.spine.iter().map(|s| s.tensors.len()).sum(),
        spine_bytes: manifest.spine.iter().map(|s| s.size).sum(),
        records: 0,
        bytes: 0,
        mirrored_records: 0,
        seconds: 0.0,
        bad: Vec::new(),
    };
    for f in &manifest.files {
        let path = dir.join(&f.name);
        match std::fs::read(&path) {
            Ok(bytes) if bytes.len() as u64 == f.size && Digest::of(&bytes).to_string() == f.digest => {}
            Ok(_) => report.bad.push(format!("file {}: differs from the one packed", path.display())),
            Err(e) => report.bad.push(format!("file {}: {e}", path.display())),
        }
    }
    for s in &manifest.spine {
        report.bad.extend(check_spine(&dir.join(&s.file), s)?);
        progress(s.size);
    }
    match manifest.index(dir) {
        Ok(index) => check_records(&index, &mut report, progress, check)?,
        Err(e) => report.bad.push(format!("layer files: {e}")),
    }
    report.seconds = t.elapsed().as_secs_f64();
    Ok(report)
}

/// Re-reads every record and checks its bound digest.
fn check_records(
    index: &crate::ExpertIndex,
    report: &mut VerifyReport,
    progress: &mut dyn FnMut(u64),
    check: RecordCheck<'_>,
) -> Result<(), StoreError> {
    let pool = open_checking(&index.files, 4)?;
    for (layer, experts) in index.layers.iter().enumerate() {
        // Every copy of every record: the primary (copy 0) and its mirrors.
        let copies: Vec<(usize, usize)> = (0..experts.len())
            .flat_map(|e| (0..=experts[e].copies.len()).map(move |c| (e, c)))
            .collect();
        for batch in copies.chunks(8) {
            let jobs: Vec<&[Extent]> = batch.iter().map(|&(e, c)| experts[e].copy(c)).collect();
            pool.read(&jobs, &mut |job, result| {
                let (e, c) = batch[job];
                let loc = &experts[e];
                let at = loc.copy(c)[0];
                let path = index.files[at.file].display();
                if c == 0 {
                    report.records += 1;
                    report.bytes += loc.payload_len();
                } else {
                    report.mirrored_records += 1;
                }
                progress(loc.payload_len());
                match result {
                    Err(err) => report.bad.push(format!("layer {layer} expert {e}: {err}")),
                    Ok(views) => {
                        let parts: Vec<&[u8]> = loc
                            .parts
                            .iter()
                            .map(|p| &views[p.extent].as_slice()[p.offset as usize..(p.offset + p.len) as usize])
                            .collect();
                        let got = Digest::of_parts_seeded(loc.digest_seed, parts.iter().copied());
                        if let (0, Err(m)) = (c, check(layer, e, &parts)) {
                            report.bad.push(format!(
                                "layer {layer} expert {e}: {m} (in {path}; the checkpoint it was packed from says so too: it cannot run)"
                            ));
                        }
                        if Some(got) != loc.digest {
                            let what = if c == 0 {
                                ""
                            } else {
                                " (a mirrored copy; `larder mirror` makes it again)"
                            };
                            report.bad.push(format!(
                                "layer {layer} expert {e}: digest mismatch in {path} at offset {}{what}",
                                at.offset
                            ));
                        }
                    }
                }
            });
        }
    }
    Ok(())
}
