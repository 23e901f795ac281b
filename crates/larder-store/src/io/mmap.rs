//! The baseline backend: every file memory-mapped once; a "read" is a view
//! into the mapping (no copy), and the bytes arrive by page faults while the
//! model computes. Kept for comparison and for machines where it is all
//! there is; its I/O time shows up as compute time, not as `io_wait`.

use std::path::PathBuf;
use std::sync::Arc;

use memmap2::Mmap;

use super::{IoBackend, ReadResult};
use crate::buf::{ByteOwner, ByteView};
use crate::location::Extent;
use crate::StoreError;

pub struct MmapBackend {
    paths: Vec<PathBuf>,
    maps: Vec<ByteOwner>,
}

impl MmapBackend {
    pub fn open(paths: &[PathBuf]) -> Result<MmapBackend, StoreError> {
        let mut maps = Vec::with_capacity(paths.len());
        for p in paths {
            let f = std::fs::File::open(p).map_err(|e| StoreError::io(p, e))?;
            // SAFETY: read-only mapping of a file larder never writes while serving;
            // external truncation while mapped is outside what a reader can defend against.
            let map = unsafe { Mmap::map(&f) }.map_err(|e| StoreError::io(p, e))?;
            maps.push(Arc::new(map) as ByteOwner);
        }
        Ok(MmapBackend {
            paths: paths.to_vec(),
            maps,
        })
    }
}

impl IoBackend for MmapBackend {
    fn name(&self) -> &'static str {
        "mmap"
    }

    fn is_mapped(&self) -> bool {
        true
    }

    fn is_direct(&self) -> bool {
        false
    }

    fn read(&self, jobs: &[&[Extent]], done: &mut dyn FnMut(usize, ReadResult)) {
        for (job, extents) in jobs.iter().enumerate() {
            let result = extents
                .iter()
                .map(|x| {
                    let map = &self.maps[x.file];
                    let size = (**map).as_ref().len() as u64;
                    if x.offset + x.len > size {
                        return Err(StoreError::Truncated {
                            path: self.paths[x.file].clone(),
                            needed: x.offset + x.len,
                            size,
                        });
                    }
                    Ok(ByteView::new(map.clone(), x.offset as usize, x.len as usize))
                })
                .collect();
            done(job, result);
        }
    }
}
