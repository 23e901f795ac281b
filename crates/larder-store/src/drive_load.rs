//! Which copy of a record to read. A record mirrored onto another drive
//! ([`crate::mirror`]) can be read from either; each read goes to the copy
//! whose drive should finish it first: the bytes already in flight on that
//! drive plus this record's, over the drive's bandwidth. [`DriveLoad`]
//! keeps the bytes in flight per drive (a [`Ticket`] per read, given back
//! when the read ends) and the bytes read from each drive.
//!
//! The choice decides only where bytes come from: every copy holds the
//! same bytes under the same bound digest, checked as any record is.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::location::{ExpertIndex, ExpertLocation};

/// Bytes in flight and bytes read, per drive of an index.
pub(crate) struct DriveLoad {
    in_flight: Vec<AtomicU64>,
    read: Vec<AtomicU64>,
    gbps: Vec<f64>,
    file_drive: Vec<usize>,
}

/// One read's share of its drive's load; given back when dropped.
pub(crate) struct Ticket<'a> {
    load: &'a DriveLoad,
    drive: usize,
    len: u64,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.load.in_flight[self.drive].fetch_sub(self.len, Ordering::Relaxed);
    }
}

impl DriveLoad {
    /// The drives of `index` (its `file_drive` and `drive_gbps`; an index
    /// without them is one drive). Unknown bandwidths count as equal.
    pub(crate) fn new(index: &ExpertIndex) -> DriveLoad {
        let drives = index
            .file_drive
            .iter()
            .map(|&d| d + 1)
            .max()
            .unwrap_or(1)
            .max(index.drive_gbps.len())
            .max(1);
        let gbps = (0..drives)
            .map(|d| {
                index
                    .drive_gbps
                    .get(d)
                    .copied()
                    .filter(|g| g.is_finite() && *g > 0.0)
                    .unwrap_or(1.0)
            })
            .collect();
        DriveLoad {
            in_flight: (0..drives).map(|_| AtomicU64::new(0)).collect(),
            read: (0..drives).map(|_| AtomicU64::new(0)).collect(),
            gbps,
            file_drive: index.file_drive.clone(),
        }
    }

    fn drive_of(&self, loc: &ExpertLocation, copy: usize) -> usize {
        let file = loc.copy(copy).first().map_or(0, |x| x.file);
        self.file_drive.get(file).copied().unwrap_or(0).min(self.in_flight.len() - 1)
    }

    /// The copy of `loc` to read (0: the primary) and its ticket: the copy
    /// whose drive should finish it first (ties: the earlier copy).
    pub(crate) fn choose(&self, loc: &ExpertLocation) -> (usize, Ticket<'_>) {
        let len = loc.read_len();
        let finish = |c: usize| {
            let d = self.drive_of(loc, c);
            (self.in_flight[d].load(Ordering::Relaxed) + len) as f64 / self.gbps[d]
        };
        let mut best = 0;
        let mut best_t = finish(0);
        for c in 1..=loc.copies.len() {
            let t = finish(c);
            if t < best_t {
                (best, best_t) = (c, t);
            }
        }
        let drive = self.drive_of(loc, best);
        self.in_flight[drive].fetch_add(len, Ordering::Relaxed);
        self.read[drive].fetch_add(len, Ordering::Relaxed);
        (best, Ticket { load: self, drive, len })
    }

    /// The primary copy of `loc` and its ticket (its mirror copy failed).
    pub(crate) fn primary(&self, loc: &ExpertLocation) -> (usize, Ticket<'_>) {
        let len = loc.read_len();
        let drive = self.drive_of(loc, 0);
        self.in_flight[drive].fetch_add(len, Ordering::Relaxed);
        self.read[drive].fetch_add(len, Ordering::Relaxed);
        (0, Ticket { load: self, drive, len })
    }

    /// Bytes read from each drive so far (as fetched, padding included).
    pub(crate) fn bytes_read(&self) -> Vec<u64> {
        self.read.iter().map(|r| r.load(Ordering::Relaxed)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::location::Extent;

    fn loc(files: &[usize], len: u64) -> ExpertLocation {
        let x = |f: usize| vec![Extent { file: f, offset: 0, len }];
        ExpertLocation {
            extents: x(files[0]),
            copies: files[1..].iter().map(|&f| x(f)).collect(),
            ..Default::default()
        }
    }

    fn index(gbps: &[f64]) -> ExpertIndex {
        ExpertIndex {
            file_drive: (0..gbps.len()).collect(),
            drive_gbps: gbps.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn reads_go_where_they_finish_first_in_proportion_to_bandwidth() {
        // Drive 1 is three times as fast: of 8 reads in flight together, 6 go there.
        let idx = index(&[1.0, 3.0]);
        let load = DriveLoad::new(&idx);
        let l = loc(&[0, 1], 100);
        let held: Vec<_> = (0..8).map(|_| load.choose(&l)).collect();
        let on_fast = held.iter().filter(|(c, _)| *c == 1).count();
        assert_eq!(on_fast, 6);
        assert_eq!(load.bytes_read(), vec![200, 600]);
        drop(held);
        // Nothing in flight: the fastest copy again, and the load was given back.
        assert_eq!(load.choose(&l).0, 1);
        assert!(load.in_flight.iter().all(|x| x.load(Ordering::Relaxed) == 0));
    }

    #[test]
    fn one_copy_is_always_the_primary_and_equal_drives_prefer_it() {
        let load = DriveLoad::new(&index(&[1.0, 1.0]));
        assert_eq!(load.choose(&loc(&[1], 10)).0, 0);
        assert_eq!(load.choose(&loc(&[0, 1], 10)).0, 0);
        // A busy primary drive sends the next read to the mirror.
        let _busy = load.choose(&loc(&[0], 1000));
        assert_eq!(load.choose(&loc(&[0, 1], 10)).0, 1);
        // An index without drive figures is one drive.
        let single = DriveLoad::new(&ExpertIndex::default());
        assert_eq!(single.choose(&loc(&[0, 3], 10)).0, 0);
    }
}
