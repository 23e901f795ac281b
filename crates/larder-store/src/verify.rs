//! `verify`: re-reads every record of a packed store (O_DIRECT where the
//! file system allows, so the drive itself is checked, not the page cache)
//! and checks its digest, reporting every bad record rather than the first.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::digest::Digest;
use crate::io::{FileTable, IoBackend, PreadPool};
use crate::location::Extent;
use crate::manifest::Manifest;
use crate::StoreError;

#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    pub records: usize,
    pub bytes: u64,
    pub seconds: f64,
    /// One line per bad record: layer, expert, file and what is wrong.
    pub bad: Vec<String>,
}

/// Checks every record of the store at `dir`; `progress(bytes)` after each.
pub fn verify_store(dir: &Path, progress: &mut dyn FnMut(u64)) -> Result<VerifyReport, StoreError> {
    let manifest = Manifest::read(dir)?;
    let index = manifest.index(dir)?;
    let files = FileTable::open(&index.files, true).or_else(|_| FileTable::open(&index.files, false))?;
    let pool = PreadPool::new(files, 4)?;
    let t = Instant::now();
    let mut report = VerifyReport {
        records: 0,
        bytes: 0,
        seconds: 0.0,
        bad: Vec::new(),
    };
    for (layer, experts) in index.layers.iter().enumerate() {
        for batch in (0..experts.len()).collect::<Vec<_>>().chunks(8) {
            let jobs: Vec<&[Extent]> = batch.iter().map(|&e| experts[e].extents.as_slice()).collect();
            pool.read(&jobs, &mut |job, result| {
                let e = batch[job];
                let loc = &experts[e];
                let path = index.files[loc.extents[0].file].display();
                report.records += 1;
                report.bytes += loc.payload_len();
                progress(loc.payload_len());
                match result {
                    Err(err) => report.bad.push(format!("layer {layer} expert {e}: {err}")),
                    Ok(views) => {
                        let got = Digest::of_parts(loc.parts.iter().map(|p| {
                            let v = &views[p.extent];
                            &v.as_slice()[p.offset as usize..(p.offset + p.len) as usize]
                        }));
                        if Some(got) != loc.digest {
                            report.bad.push(format!(
                                "layer {layer} expert {e}: digest mismatch in {path} at offset {}",
                                loc.extents[0].offset
                            ));
                        }
                    }
                }
            });
        }
    }
    report.seconds = t.elapsed().as_secs_f64();
    Ok(report)
}
