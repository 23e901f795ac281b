//! [`RangeBackend`]: an [`IoBackend`] whose files are a remote source's
//! files: each extent is one range request, several in flight over the
//! source's connections, and a job is reported (on the calling thread, as
//! every backend reports) the moment its last range lands. Anything that
//! reads through a backend (the expert store, a lazy store's fetches) reads
//! a URL the way it reads a drive.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use super::FileSource;
use crate::buf::AlignedBuf;
use crate::io::{plan, views, IoBackend, ReadResult};
use crate::location::Extent;
use crate::StoreError;

pub struct RangeBackend {
    remote: Arc<dyn FileSource>,
    /// The source's name of each file an extent may index.
    names: Vec<String>,
    /// Range requests in flight per read.
    parallel: usize,
}

impl RangeBackend {
    pub fn new(remote: Arc<dyn FileSource>, names: Vec<String>, parallel: usize) -> RangeBackend {
        RangeBackend {
            remote,
            names,
            parallel: parallel.max(1),
        }
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Exactly `x.len` bytes of extent `x`, or an error naming the file.
    fn range(&self, x: &Extent) -> Result<Vec<u8>, StoreError> {
        let name = self
            .names
            .get(x.file)
            .ok_or_else(|| StoreError::Invalid(format!("range backend: no file {}", x.file)))?;
        let bytes = self.remote.read_range(name, x.offset, x.len).map_err(|e| e.into_store())?;
        if bytes.len() as u64 != x.len {
            return Err(StoreError::Invalid(format!(
                "{name}: {} bytes came for the {} at offset {} asked",
                bytes.len(),
                x.len,
                x.offset
            )));
        }
        Ok(bytes)
    }
}

impl IoBackend for RangeBackend {
    fn name(&self) -> &'static str {
        "range"
    }

    fn is_direct(&self) -> bool {
        false
    }

    fn read_blocking(&self, extents: &[Extent]) -> ReadResult {
        let mut out = None;
        self.read(&[extents], &mut |_, r| out = Some(r));
        out.unwrap_or_else(|| Err(StoreError::Invalid("range backend: a read reported nothing".into())))
    }

    fn read(&self, jobs: &[&[Extent]], done: &mut dyn FnMut(usize, ReadResult)) {
        let items: Vec<(usize, usize)> = jobs
            .iter()
            .enumerate()
            .flat_map(|(j, x)| (0..x.len()).map(move |k| (j, k)))
            .collect();
        let layouts: Vec<_> = jobs.iter().map(|x| plan(x, false)).collect();
        let mut bufs: Vec<Option<AlignedBuf>> = layouts.iter().map(|(_, size)| Some(AlignedBuf::for_read(*size as usize))).collect();
        let mut left: Vec<usize> = jobs.iter().map(|x| x.len()).collect();
        let mut failed = vec![false; jobs.len()];
        for (j, x) in jobs.iter().enumerate() {
            if x.is_empty() {
                failed[j] = true;
                done(j, Ok(Vec::new()));
            }
        }
        let next = AtomicUsize::new(0);
        // Set when the source proves unreachable: no range after it is asked
        // for (each would wait out its own retries); they fail with its error.
        let down: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
        std::thread::scope(|scope| {
            let (tx, rx) = mpsc::channel();
            for _ in 0..self.parallel.min(items.len().max(1)) {
                let (tx, items, next, down) = (tx.clone(), &items, &next, &down);
                scope.spawn(move || {
                    while let Some(&(j, k)) = items.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let known = down.lock().unwrap_or_else(|p| p.into_inner()).clone();
                        let got = match known {
                            Some(message) => Err(StoreError::SourceUnavailable { message, retry_after_s: 0 }),
                            None => self.range(&jobs[j][k]),
                        };
                        if let Err(StoreError::SourceUnavailable { message, .. }) = &got {
                            down.lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .get_or_insert_with(|| message.clone());
                        }
                        if tx.send((j, k, got)).is_err() {
                            return;
                        }
                    }
                });
            }
            drop(tx);
            for (j, k, got) in rx {
                if failed[j] {
                    continue;
                }
                match got {
                    Ok(bytes) => {
                        let span = layouts[j].0[k];
                        if let Some(buf) = bufs[j].as_mut() {
                            let at = (span.buf_offset + span.skip) as usize;
                            buf.as_mut_slice()[at..at + bytes.len()].copy_from_slice(&bytes);
                        }
                        left[j] -= 1;
                        if left[j] == 0 {
                            let buf = bufs[j].take().unwrap_or_else(|| AlignedBuf::new(0));
                            done(j, Ok(views(buf, &layouts[j].0, jobs[j])));
                        }
                    }
                    Err(e) => {
                        failed[j] = true;
                        done(j, Err(e));
                    }
                }
            }
        });
    }
}
