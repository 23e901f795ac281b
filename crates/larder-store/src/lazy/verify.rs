//! `larder verify CACHE_DIR` on a lazy cache, without the network: the
//! description (`lazy.json`), every carried file, the spine's tensors, and
//! every record the log calls present, read from the drive and checked
//! against the digest it was written with and against its source digest.
//! Names what is wrong, how many records are not fetched yet (per layer),
//! and which source files were never checked against a published sha256.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::known::{component_digest, source_digest, Known};
use super::records::Records;
use super::{read_state, records_of, SourceCheck, LAZY_STATE};
use crate::buf::AlignedBuf;
use crate::digest::Digest;
use crate::fsutil::lock_exclusive;
use crate::pack_plan::{load_or_make_plan, resolve, PackSource, LOCK, SPINE};
use crate::pull::scatter::Layout;
use crate::pull::PULL_STATE;
use crate::spine::check_spine;
use crate::StoreError;

/// What [`verify`] found.
#[derive(Debug, Clone, Serialize)]
pub struct LazyVerifyReport {
    pub root: PathBuf,
    /// The SOURCE the cache was made from.
    pub source: String,
    pub store_id: String,
    /// How the source was checked (`stream` or `first-fetch`).
    pub source_check: String,
    pub spine_tensors: usize,
    pub spine_bytes: u64,
    /// Expert records the model has, those on the drive and intact, and
    /// their bytes.
    pub records: usize,
    pub present: usize,
    pub present_bytes: u64,
    /// Records not fetched yet (or evicted), per model layer.
    pub missing: usize,
    pub missing_by_layer: BTreeMap<usize, usize>,
    /// Records whose source digest is known (every later fetch is checked).
    pub known: usize,
    /// Source files streamed whole and matched to their published sha256.
    pub verified_files: Vec<String>,
    /// Source files never checked against a published sha256, and why.
    pub unverified_files: Vec<String>,
    /// Everything wrong; empty when the cache holds exactly what it claims.
    pub bad: Vec<String>,
}

/// Checks the lazy cache in `root` made from `src` (its description, as the
/// cache saved it); see the module docs.
pub fn verify(root: &Path, src: &PackSource) -> Result<LazyVerifyReport, StoreError> {
    let state = read_state(root)?.ok_or_else(|| {
        let started = root.join(PULL_STATE).exists() || root.join(super::stream::STREAM_DIR).exists();
        StoreError::Invalid(format!(
            "{}: {}",
            root.join(LAZY_STATE).display(),
            if started {
                "missing: the cache's first open did not finish; run the same command with --cache-dir again to resume it"
            } else {
                "missing: not a lazy cache (made by `--model SOURCE --cache-dir DIR`)"
            }
        ))
    })?;
    let _lock = lock_exclusive(&root.join(LOCK), "another larder using this cache")?;
    let plan = load_or_make_plan(src, root, &[], &mut |_| {})?;
    let mut bad = Vec::new();
    if plan.store_id != state.store_id {
        bad.push(format!(
            "{}: store id {} but the cache's plan says {}",
            root.join(LAZY_STATE).display(),
            state.store_id,
            plan.store_id
        ));
    }
    let drives: Vec<PathBuf> = plan.drives.iter().map(|d| resolve(root, &d.path)).collect();
    let layout = Layout::new(src, &plan, &drives, root.join(SPINE))?;
    let recs = records_of(src, &layout);
    check_carried(root, &state.carried, &mut bad);
    bad.extend(check_spine(&root.join(&state.spine.file), &state.spine)?);
    let size = |k| recs.iter().find(|r| r.key == k).map(|r| r.len);
    let records = Records::open(root, None, &size, &|_| false)?;
    let known = Known::open(root)?;
    let (mut present, mut present_bytes) = (0, 0);
    let mut missing_by_layer = BTreeMap::new();
    for r in &recs {
        let Some(want) = records.digest(r.key) else {
            *missing_by_layer.entry(r.key.0).or_insert(0) += 1;
            if state.check == SourceCheck::Stream && known.get(r.key).is_none() {
                bad.push(format!(
                    "layer {} expert {}: no source digest was kept ({})",
                    r.key.0,
                    r.key.1,
                    super::SOURCES_LOG
                ));
            }
            continue;
        };
        let path = &layout.outputs[r.file].path;
        match read_record(path, r.offset, r.len) {
            Err(e) => bad.push(format!("layer {} expert {}: {}: {e}", r.key.0, r.key.1, path.display())),
            Ok(buf) => {
                let got = Digest::of_parts_seeded(r.seed, [&buf.as_ref()[..r.payload as usize]]);
                let parts = r.parts.iter().map(|(x, at)| {
                    let at = *at as usize;
                    component_digest(&buf.as_ref()[at..at + x.len as usize])
                });
                let source = source_digest(r.seed, parts);
                if got != want {
                    bad.push(format!(
                        "layer {} expert {}: differs from the digest it was written with ({}); the next run fetches it again",
                        r.key.0,
                        r.key.1,
                        path.display()
                    ));
                } else if known.get(r.key).is_some_and(|k| k != source) {
                    bad.push(format!(
                        "layer {} expert {}: differs from what its source digest says it must be ({})",
                        r.key.0,
                        r.key.1,
                        path.display()
                    ));
                } else {
                    present += 1;
                    present_bytes += r.len;
                }
            }
        }
    }
    let (verified_files, unverified_files) = files_checked(&state);
    Ok(LazyVerifyReport {
        root: root.to_path_buf(),
        source: state.source.clone(),
        store_id: state.store_id.clone(),
        source_check: state.check.name().to_string(),
        spine_tensors: state.spine.tensors.len(),
        spine_bytes: state.spine.size,
        records: recs.len(),
        present,
        present_bytes,
        missing: missing_by_layer.values().sum(),
        missing_by_layer,
        known: known.len(),
        verified_files,
        unverified_files,
        bad,
    })
}

fn read_record(path: &Path, offset: u64, len: u64) -> std::io::Result<AlignedBuf> {
    let file = std::fs::File::open(path)?;
    let mut buf = AlignedBuf::new(len as usize);
    file.read_exact_at(buf.as_mut_slice(), offset)?;
    Ok(buf)
}

fn check_carried(root: &Path, carried: &[crate::manifest::CarriedFile], bad: &mut Vec<String>) {
    for f in carried {
        let path = root.join(&f.name);
        match std::fs::read(&path) {
            Ok(b) if b.len() as u64 == f.size && Digest::of(&b).to_string() == f.digest => {}
            Ok(_) => bad.push(format!("{}: differs from the file the cache was made with", path.display())),
            Err(e) => bad.push(format!("{}: {e}", path.display())),
        }
    }
}

/// Source files matched to a published sha256, and the others with why.
fn files_checked(state: &super::LazyState) -> (Vec<String>, Vec<String>) {
    let (mut yes, mut no) = (Vec::new(), Vec::new());
    for f in &state.files {
        if f.verified {
            yes.push(f.name.clone());
        } else if state.check == SourceCheck::FirstFetch {
            no.push(format!("{}: --source-check first-fetch (ranges trusted on first fetch)", f.name));
        } else {
            no.push(format!("{}: the source published no sha256 (digested as it streamed)", f.name));
        }
    }
    (yes, no)
}
