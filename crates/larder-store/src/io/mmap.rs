//! The mmap backend (`--io mmap`, opt-in): every file memory-mapped once; a
//! read is a view into the mapping (no copy) whose pages are faulted in by
//! the read itself, so I/O time shows as `io_wait` as with the other backends.
//!
//! It honours `--ram-budget`: each job's view owns the page-aligned span it
//! covers, the RAM cache counts that span against the budget like a read
//! buffer, and when the last user of an evicted record lets go its pages are
//! dropped from the process with `madvise(MADV_DONTNEED)` (the page cache may
//! keep them; the process's RSS does not). A job over several files (an
//! expert split across checkpoint shards) is copied into one read buffer so
//! the cache counts it whole.
//!
//! **Unsafe against files changing underneath**: a mapped file truncated
//! while larder runs kills the process with SIGBUS on the next access of a
//! page past the new end. Each read checks the file's current size first
//! (a file already shorter is a clear `Truncated` error), but a truncation
//! racing a read, or one under a record being computed on, cannot be caught.
//! `pread` and `uring` (the default) read into memory the process owns and
//! have no such failure.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use memmap2::{Mmap, UncheckedAdvice};

use super::{IoBackend, ReadResult};
use crate::buf::{align_down, align_up, ByteOwner, SharedBytes, ALIGN};
use crate::location::Extent;
use crate::StoreError;

pub(crate) struct MmapBackend {
    paths: Vec<PathBuf>,
    files: Vec<File>,
    maps: Vec<Arc<Mmap>>,
}

/// The page-aligned span of a mapping one job's views point into; dropping
/// it drops its pages from the process.
struct MappedSpan {
    map: Arc<Mmap>,
    start: usize,
    len: usize,
}

impl AsRef<[u8]> for MappedSpan {
    fn as_ref(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }
}

impl Drop for MappedSpan {
    fn drop(&mut self) {
        // SAFETY: a read-only shared file mapping: MADV_DONTNEED only drops
        // page-table entries; a later access (another record's view of a
        // boundary page) faults the page back in from the file, unchanged.
        let _ = unsafe { self.map.unchecked_advise_range(UncheckedAdvice::DontNeed, self.start, self.len) };
    }
}

impl MmapBackend {
    pub(crate) fn open(paths: &[PathBuf]) -> Result<MmapBackend, StoreError> {
        let mut maps = Vec::with_capacity(paths.len());
        let mut files = Vec::with_capacity(paths.len());
        for p in paths {
            let f = File::open(p).map_err(|e| StoreError::io(p, e))?;
            // SAFETY: read-only mapping of a file larder never writes while
            // serving. A file truncated underneath makes later accesses
            // SIGBUS: that is why this backend is opt-in and documented as
            // unsafe against files changing (module doc, docs/store.md).
            let map = unsafe { Mmap::map(&f) }.map_err(|e| StoreError::io(p, e))?;
            maps.push(Arc::new(map));
            files.push(f);
        }
        Ok(MmapBackend {
            paths: paths.to_vec(),
            files,
            maps,
        })
    }

    /// One job: its extents checked against the files' current sizes, one
    /// span per file covering them, every page of the extents touched.
    fn read_job(&self, extents: &[Extent]) -> ReadResult {
        let mut spans: Vec<(usize, ByteOwner, usize)> = Vec::new();
        for x in extents {
            if spans.iter().any(|s| s.0 == x.file) {
                continue;
            }
            let map = self
                .maps
                .get(x.file)
                .ok_or_else(|| StoreError::Invalid(format!("extent in file {} of {}", x.file, self.maps.len())))?;
            let mine = || extents.iter().filter(|y| y.file == x.file);
            let lo = mine().map(|y| y.offset).min().unwrap_or(x.offset);
            let hi = mine().map(|y| y.offset + y.len).max().unwrap_or(x.offset + x.len);
            let path = &self.paths[x.file];
            let size = self.files[x.file].metadata().map_err(|e| StoreError::io(path, e))?.len();
            let size = size.min(map.len() as u64);
            if hi > size {
                return Err(StoreError::Truncated {
                    path: path.clone(),
                    needed: hi,
                    size,
                });
            }
            let start = align_down(lo) as usize;
            let end = (align_up(hi) as usize).min(map.len());
            let mut sink = 0u8;
            for y in mine() {
                for b in map[y.offset as usize..(y.offset + y.len) as usize].iter().step_by(ALIGN) {
                    sink ^= *b;
                }
            }
            std::hint::black_box(sink);
            let span = MappedSpan {
                map: map.clone(),
                start,
                len: end - start,
            };
            spans.push((x.file, Arc::new(span), start));
        }
        if spans.len() > 1 {
            return Ok(copy_job(&spans, extents));
        }
        Ok(extents
            .iter()
            .filter_map(|x| {
                let (_, owner, start) = spans.iter().find(|s| s.0 == x.file)?;
                Some(SharedBytes::new(owner.clone(), x.offset as usize - start, x.len as usize))
            })
            .collect())
    }
}

/// A job over several files (an expert split across checkpoint shards): its
/// bytes copied into one buffer, as the store's RAM cache counts one buffer
/// per job. The spans (already faulted in) are let go at once.
fn copy_job(spans: &[(usize, ByteOwner, usize)], extents: &[Extent]) -> Vec<SharedBytes> {
    let (plan, total) = super::plan(extents, false);
    let mut buf = crate::buf::AlignedBuf::for_read(total as usize);
    for (p, x) in plan.iter().zip(extents) {
        if let Some((_, owner, start)) = spans.iter().find(|s| s.0 == x.file) {
            let src = &(**owner).as_ref()[x.offset as usize - start..][..x.len as usize];
            buf.as_mut_slice()[p.buf_offset as usize..][..x.len as usize].copy_from_slice(src);
        }
    }
    super::views(buf, &plan, extents)
}

impl IoBackend for MmapBackend {
    fn name(&self) -> &'static str {
        "mmap"
    }

    fn is_direct(&self) -> bool {
        false
    }

    fn read_blocking(&self, extents: &[Extent]) -> ReadResult {
        self.read_job(extents)
    }

    fn read(&self, jobs: &[&[Extent]], done: &mut dyn FnMut(usize, ReadResult)) {
        for (job, extents) in jobs.iter().enumerate() {
            done(job, self.read_job(extents));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_truncated_before_a_read_is_an_error_naming_it_and_spans_own_whole_pages() {
        let dir = std::env::temp_dir().join(format!("larder-mmap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("layer.experts");
        let bytes: Vec<u8> = (0..5 * ALIGN).map(|i| (i * 7) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let b = MmapBackend::open(std::slice::from_ref(&path)).unwrap();
        let job = [
            Extent {
                file: 0,
                offset: 100,
                len: 5000,
            },
            Extent {
                file: 0,
                offset: 9000,
                len: 10,
            },
        ];
        let views = b.read_job(&job).unwrap();
        assert_eq!(views[0].as_slice(), &bytes[100..5100]);
        assert_eq!(views[1].as_slice(), &bytes[9000..9010]);
        // One owner per job, whole pages: what the RAM cache counts.
        assert!(views[0].same_owner(&views[1]));
        assert_eq!(views[0].owner_len(), 3 * ALIGN);
        drop(views);
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(4096).unwrap();
        let err = b.read_job(&job).unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::Truncated {
                    needed: 9010,
                    size: 4096,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("layer.experts"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_job_over_two_files_is_one_buffer() {
        let dir = std::env::temp_dir().join(format!("larder-mmap2-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let paths = [dir.join("a"), dir.join("b")];
        let a: Vec<u8> = (0..3 * ALIGN).map(|i| (i * 3) as u8).collect();
        let b: Vec<u8> = (0..2 * ALIGN).map(|i| (i * 5 + 1) as u8).collect();
        std::fs::write(&paths[0], &a).unwrap();
        std::fs::write(&paths[1], &b).unwrap();
        let backend = MmapBackend::open(&paths).unwrap();
        let job = [
            Extent {
                file: 1,
                offset: 10,
                len: 5000,
            },
            Extent {
                file: 0,
                offset: 4000,
                len: 300,
            },
        ];
        let views = backend.read_job(&job).unwrap();
        assert_eq!(views[0].as_slice(), &b[10..5010]);
        assert_eq!(views[1].as_slice(), &a[4000..4300]);
        assert!(views[0].same_owner(&views[1]));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
