//! Options out of range fail closed in the library (users of the crate
//! bypass the command line's checks): I/O depths, pread threads and prefetch
//! threads out of range are errors naming the option, never an abort or a
//! panic; a RAM budget smaller than one record is refused (0: no cache).

use std::path::PathBuf;

use larder_store::io::{open_backend, FileTable, IoKind, IoOptions, PreadPool, MAX_IO_DEPTH};
use larder_store::{smallest_budget, MAX_PREFETCH_THREADS};
use larder_store::{ExpertIndex, ExpertLocation, ExpertStore, Extent, Part, StoreError, StoreOptions};

/// One file of `n` records of `len` bytes each, one layer.
fn index(name: &str, n: usize, len: u64) -> ExpertIndex {
    let dir = std::env::temp_dir().join(format!("larder-limits-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path: PathBuf = dir.join("layer.experts");
    std::fs::write(&path, vec![7u8; n * len as usize]).unwrap();
    let layer = (0..n as u64)
        .map(|e| ExpertLocation {
            extents: vec![Extent {
                file: 0,
                offset: e * len,
                len,
            }],
            parts: vec![Part { extent: 0, offset: 0, len }],
            digest: None,
            digest_seed: 0,
            copies: Vec::new(),
        })
        .collect();
    ExpertIndex {
        files: vec![path],
        parts: vec![Vec::new()],
        layers: vec![layer],
        ..Default::default()
    }
}

fn opts(kind: IoKind, depth: usize, prefetch: usize, budget: u64) -> StoreOptions {
    StoreOptions {
        io: IoOptions {
            kind,
            direct: false,
            depth,
        },
        ram_budget: budget,
        verify: false,
        prefetch_threads: prefetch,
    }
}

fn error_of(r: Result<impl Sized, StoreError>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

fn kinds() -> Vec<IoKind> {
    let mut k = vec![IoKind::Pread];
    if IoKind::best() == IoKind::Uring {
        k.push(IoKind::Uring);
    }
    k
}

#[test]
fn io_depth_out_of_range_is_an_error_naming_it() {
    let idx = index("depth", 4, 8192);
    for kind in kinds() {
        for depth in [0, MAX_IO_DEPTH + 1, 100_000] {
            let io = IoOptions {
                kind,
                direct: false,
                depth,
            };
            let msg = error_of(open_backend(&idx.files, io));
            assert!(msg.contains("--io-depth") && msg.contains(&MAX_IO_DEPTH.to_string()), "{msg}");
            let msg = error_of(ExpertStore::open(idx.clone(), opts(kind, depth, 0, 1 << 20)));
            assert!(msg.contains("--io-depth"), "{msg}");
        }
        // The ends of the range open.
        for depth in [1, MAX_IO_DEPTH] {
            ExpertStore::open(idx.clone(), opts(kind, depth, 0, 1 << 20)).unwrap();
        }
    }
    let files = FileTable::open(&idx.files, false).unwrap();
    let msg = error_of(PreadPool::new(files, 0));
    assert!(msg.contains("out of range"), "{msg}");
}

#[test]
fn prefetch_threads_out_of_range_is_an_error_naming_it() {
    let idx = index("prefetch", 4, 8192);
    for threads in [MAX_PREFETCH_THREADS + 1, 100_000] {
        let msg = error_of(ExpertStore::open(idx.clone(), opts(IoKind::Pread, 2, threads, 1 << 20)));
        assert!(
            msg.contains("--prefetch") && msg.contains(&MAX_PREFETCH_THREADS.to_string()),
            "{msg}"
        );
    }
    ExpertStore::open(idx, opts(IoKind::Pread, 2, MAX_PREFETCH_THREADS, 1 << 20)).unwrap();
}

#[test]
fn budget_below_one_record_is_refused_and_zero_means_no_cache() {
    // Records of 10000 bytes take 12 KiB buffers (whole 4 KiB blocks).
    let idx = index("budget", 3, 10_000);
    assert_eq!(smallest_budget(&idx, false), 12288);
    for budget in [1, 4096, 12287] {
        let msg = error_of(opts(IoKind::Pread, 2, 0, budget).check_budget(&idx));
        assert!(
            msg.contains("--ram-budget") && msg.contains("smallest usable budget is 12288 bytes"),
            "{msg}"
        );
    }
    for budget in [0, 12288, u64::MAX] {
        opts(IoKind::Pread, 2, 0, budget).check_budget(&idx).unwrap();
    }
}
