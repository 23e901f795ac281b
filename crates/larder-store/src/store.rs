//! [`ExpertStore`]: the RAM cache in front of an I/O backend over an
//! [`ExpertIndex`]. `fetch` hands out each requested expert as soon as it is
//! available (hits at once, misses as their reads complete), checks digests,
//! fills the cache and counts everything in [`StoreStats`].

use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::buf::ByteView;
use crate::cache::ExpertCache;
use crate::digest::Digest;
use crate::io::{open_backend, IoBackend, IoOptions};
use crate::location::{ExpertIndex, Extent};
use crate::stats::StoreStats;
use crate::StoreError;

/// One expert's component bytes, in component order.
pub struct ExpertRecord {
    pub parts: Vec<ByteView>,
    /// RAM this record holds (buffer sizes; 0 for mapped views).
    pub bytes: u64,
}

/// How to open a store.
#[derive(Debug, Clone, Copy)]
pub struct StoreOptions {
    pub io: IoOptions,
    /// Bytes the expert cache may hold.
    pub ram_budget: u64,
    /// Check each record's digest when it is read (where the index has one).
    pub verify: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            io: IoOptions::default(),
            ram_budget: 4 << 30,
            verify: true,
        }
    }
}

pub struct ExpertStore {
    index: ExpertIndex,
    backend: Arc<dyn IoBackend>,
    cache: ExpertCache<ExpertRecord>,
    verify: bool,
    stats: Mutex<StoreStats>,
}

impl ExpertStore {
    /// Opens the index's files with the chosen backend.
    pub fn open(index: ExpertIndex, opts: StoreOptions) -> Result<ExpertStore, StoreError> {
        let backend = open_backend(&index.files, opts.io)?;
        Ok(Self::with_backend(index, backend, opts.ram_budget, opts.verify))
    }

    pub fn with_backend(index: ExpertIndex, backend: Arc<dyn IoBackend>, ram_budget: u64, verify: bool) -> ExpertStore {
        let layers = index.expert_layers();
        let stats = StoreStats {
            layers: vec![Default::default(); index.layers.len()],
            ..Default::default()
        };
        ExpertStore {
            cache: ExpertCache::new(ram_budget, layers),
            index,
            backend,
            verify,
            stats: Mutex::new(stats),
        }
    }

    pub fn index(&self) -> &ExpertIndex {
        &self.index
    }

    pub fn backend(&self) -> &dyn IoBackend {
        &*self.backend
    }

    pub fn cache(&self) -> &ExpertCache<ExpertRecord> {
        &self.cache
    }

    pub fn stats(&self) -> StoreStats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Calls `ready(i, record)` for each `ids[i]` of `layer` as soon as its
    /// bytes are available: cached ones first, then reads in completion order.
    /// Stops at the first error (a read, a digest, or one `ready` returned).
    pub fn fetch<E: From<StoreError>>(
        &self,
        layer: usize,
        ids: &[usize],
        ready: &mut dyn FnMut(usize, Arc<ExpertRecord>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut misses: Vec<usize> = Vec::new();
        let mut hits = 0u64;
        for (i, &e) in ids.iter().enumerate() {
            if self.index.get(layer, e).is_none() {
                return Err(StoreError::MissingExpert { layer, expert: e }.into());
            }
            if let Some(rec) = self.cache.get((layer, e)) {
                hits += 1;
                ready(i, rec)?;
            } else {
                misses.push(i);
            }
        }
        self.count(layer, hits, misses.len() as u64);
        if misses.is_empty() {
            return Ok(());
        }
        let jobs: Vec<&[Extent]> = misses
            .iter()
            .map(|&i| self.index.get(layer, ids[i]).map(|l| l.extents.as_slice()).unwrap_or(&[]))
            .collect();
        let started = Instant::now();
        let mut in_ready = 0.0f64;
        let mut verify_s = 0.0f64;
        let mut bytes = 0u64;
        let mut failure: Option<E> = None;
        let mapped = self.backend.is_mapped();
        self.backend.read(&jobs, &mut |job, result| {
            if failure.is_some() {
                return;
            }
            let i = misses[job];
            let expert = ids[i];
            let outcome = result.map_err(E::from).and_then(|views| {
                let loc = self.index.get(layer, expert).ok_or(StoreError::MissingExpert { layer, expert })?;
                let parts: Vec<ByteView> = loc
                    .parts
                    .iter()
                    .map(|p| {
                        let v = &views[p.extent];
                        ByteView::new(v.owner.clone(), v.start + p.offset as usize, p.len as usize)
                    })
                    .collect();
                if let (true, Some(want)) = (self.verify, loc.digest) {
                    let t = Instant::now();
                    let got = Digest::of_parts(parts.iter().map(|p| p.as_slice()));
                    verify_s += t.elapsed().as_secs_f64();
                    if got != want {
                        let x = loc.extents[0];
                        return Err(StoreError::Digest {
                            layer,
                            expert,
                            path: self.index.files[x.file].clone(),
                            offset: x.offset,
                            expected: want.to_string(),
                            got: got.to_string(),
                        }
                        .into());
                    }
                }
                bytes += loc.payload_len();
                // Every view of a job shares the job's one buffer.
                let held = if mapped {
                    0
                } else {
                    views.first().map_or(0, |v| (*v.owner).as_ref().len() as u64)
                };
                let record = Arc::new(ExpertRecord { parts, bytes: held });
                if !mapped {
                    self.cache.insert((layer, expert), record.clone(), held);
                }
                let t = Instant::now();
                let r = ready(i, record);
                in_ready += t.elapsed().as_secs_f64();
                r
            });
            if let Err(e) = outcome {
                failure = Some(e);
            }
        });
        let waited = (started.elapsed().as_secs_f64() - in_ready - verify_s).max(0.0);
        {
            let mut s = self.stats.lock().unwrap_or_else(|e| e.into_inner());
            s.bytes_read += bytes;
            s.reads += misses.len() as u64;
            s.io_wait_s += waited;
            s.verify_s += verify_s;
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn count(&self, layer: usize, hits: u64, misses: u64) {
        let mut s = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        s.hits += hits;
        s.misses += misses;
        if let Some(c) = s.layers.get_mut(layer) {
            c.hits += hits;
            c.misses += misses;
        }
    }
}
