//! Counters of an expert store, cumulative since it was opened; callers take
//! differences ([`StoreStats::since`]) to report one request.

use serde::Serialize;

/// Hits, misses and prefetch outcomes of one layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LayerCounts {
    pub hits: u64,
    pub misses: u64,
    /// Records of this layer read in the background on a prediction.
    pub prefetch_reads: u64,
    /// Demands of this layer a prefetch had already read (or was reading).
    pub prefetch_hits: u64,
}

impl LayerCounts {
    /// Share of this layer's prefetched records a demand used.
    pub fn prefetch_precision(&self) -> f64 {
        ratio(self.prefetch_hits, self.prefetch_reads)
    }

    /// Share of this layer's demands not already cached before the
    /// prediction that prefetch supplied: prefetch hits over prefetch hits
    /// plus demand misses.
    pub fn prefetch_recall(&self) -> f64 {
        ratio(self.prefetch_hits, self.prefetch_hits + self.misses)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StoreStats {
    /// Expert bytes read from files (mmap: bytes handed out as mapped views).
    pub bytes_read: u64,
    /// Expert records read.
    pub reads: u64,
    /// Demands served from the cache or an in-flight prefetch.
    pub hits: u64,
    /// Demands read on the spot.
    pub misses: u64,
    /// Records read in the background on a prediction.
    pub prefetch_reads: u64,
    /// Demands a prefetch had already read (or was reading).
    pub prefetch_hits: u64,
    /// Predictions cancelled before being read: their layer's demand came first.
    pub prefetch_cancelled: u64,
    /// Time the computing thread waited for reads.
    pub io_wait_s: f64,
    /// Time spent checking digests.
    pub verify_s: f64,
    /// Per layer (index = layer number; dense layers stay zero).
    pub layers: Vec<LayerCounts>,
    /// Bytes read from each drive (index = drive; as fetched, padding
    /// included): where mirrored records were read from.
    pub drive_bytes: Vec<u64>,
}

impl StoreStats {
    /// `self - earlier`.
    pub fn since(&self, earlier: &StoreStats) -> StoreStats {
        StoreStats {
            bytes_read: self.bytes_read - earlier.bytes_read,
            reads: self.reads - earlier.reads,
            hits: self.hits - earlier.hits,
            misses: self.misses - earlier.misses,
            prefetch_reads: self.prefetch_reads - earlier.prefetch_reads,
            prefetch_hits: self.prefetch_hits - earlier.prefetch_hits,
            prefetch_cancelled: self.prefetch_cancelled - earlier.prefetch_cancelled,
            io_wait_s: self.io_wait_s - earlier.io_wait_s,
            verify_s: self.verify_s - earlier.verify_s,
            layers: self
                .layers
                .iter()
                .enumerate()
                .map(|(l, c)| {
                    let e = earlier.layers.get(l).copied().unwrap_or_default();
                    LayerCounts {
                        hits: c.hits - e.hits,
                        misses: c.misses - e.misses,
                        prefetch_reads: c.prefetch_reads - e.prefetch_reads,
                        prefetch_hits: c.prefetch_hits - e.prefetch_hits,
                    }
                })
                .collect(),
            drive_bytes: self
                .drive_bytes
                .iter()
                .enumerate()
                .map(|(d, b)| b - earlier.drive_bytes.get(d).copied().unwrap_or(0))
                .collect(),
        }
    }

    pub fn hit_rate(&self) -> f64 {
        let n = self.hits + self.misses;
        if n == 0 {
            0.0
        } else {
            self.hits as f64 / n as f64
        }
    }

    /// Share of prefetched records a demand used.
    pub fn prefetch_accuracy(&self) -> f64 {
        if self.prefetch_reads == 0 {
            0.0
        } else {
            self.prefetch_hits as f64 / self.prefetch_reads as f64
        }
    }

    /// Bytes read per second of I/O wait (0 when nothing was waited for).
    pub fn effective_gbps(&self) -> f64 {
        if self.io_wait_s > 0.0 {
            self.bytes_read as f64 / self.io_wait_s / 1e9
        } else {
            0.0
        }
    }
}
