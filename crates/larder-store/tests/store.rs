//! ExpertStore over a hand-made index: hits and misses, the budget, digests,
//! and prefetch (a predicted expert is served without a demand read; a wrong
//! or failed prediction changes nothing but timing).

use std::path::PathBuf;
use std::sync::Arc;

use larder_store::io::{open_backend, IoKind, IoOptions};
use larder_store::{Digest, ExpertIndex, ExpertLocation, ExpertStore, Extent, Part, PartDesc, StoreError, StoreOptions};

const RECORD: u64 = 8192;

/// One file of `layers x experts` records of RECORD bytes (two parts each).
fn index(name: &str, layers: usize, experts: usize) -> (ExpertIndex, Vec<u8>) {
    let dir = std::env::temp_dir().join(format!("larder-store-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path: PathBuf = dir.join("layer.experts");
    let n = layers * experts;
    let bytes: Vec<u8> = (0..n as u64 * RECORD).map(|i| (i * 7 + i / 8192) as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    let mut idx = ExpertIndex {
        files: vec![path],
        layers: Vec::new(),
        parts: Vec::new(),
        ..Default::default()
    };
    for l in 0..layers {
        let mut v = Vec::new();
        for e in 0..experts {
            let off = (l * experts + e) as u64 * RECORD;
            let rec = &bytes[off as usize..(off + RECORD) as usize];
            v.push(ExpertLocation {
                extents: vec![Extent {
                    file: 0,
                    offset: off,
                    len: RECORD,
                }],
                parts: vec![
                    Part {
                        extent: 0,
                        offset: 0,
                        len: 4096,
                    },
                    Part {
                        extent: 0,
                        offset: 4096,
                        len: 4096,
                    },
                ],
                digest: Some(Digest::of(rec)),
                digest_seed: 0,
                copies: Vec::new(),
            });
        }
        idx.layers.push(v);
        idx.parts.push(vec![
            PartDesc {
                role: "a".into(),
                dtype: "U8".into(),
                shape: vec![4096],
            },
            PartDesc {
                role: "b".into(),
                dtype: "U8".into(),
                shape: vec![4096],
            },
        ]);
    }
    (idx, bytes)
}

fn fetch_all(store: &ExpertStore, layer: usize, ids: &[usize], bytes: &[u8], experts: usize) -> Result<(), StoreError> {
    let mut seen = vec![false; ids.len()];
    store.fetch::<StoreError>(layer, ids, &mut |i, rec| {
        let off = ((layer * experts + ids[i]) as u64 * RECORD) as usize;
        assert_eq!(rec.parts[0].as_slice(), &bytes[off..off + 4096]);
        assert_eq!(rec.parts[1].as_slice(), &bytes[off + 4096..off + 8192]);
        seen[i] = true;
        Ok(())
    })?;
    assert!(seen.iter().all(|&s| s));
    Ok(())
}

fn opts(budget: u64, prefetch: usize) -> StoreOptions {
    StoreOptions {
        io: IoOptions {
            kind: IoKind::Pread,
            direct: false,
            depth: 2,
        },
        ram_budget: budget,
        verify: true,
        prefetch_threads: prefetch,
    }
}

#[test]
fn hits_misses_and_budget() {
    let (idx, bytes) = index("hits", 2, 8);
    let store = ExpertStore::open(idx, opts(3 * RECORD, 0)).unwrap();
    fetch_all(&store, 0, &[1, 2, 3], &bytes, 8).unwrap();
    fetch_all(&store, 0, &[1, 2, 3], &bytes, 8).unwrap();
    let s = store.stats();
    assert_eq!((s.misses, s.hits, s.reads), (3, 3, 3));
    assert_eq!(s.bytes_read, 3 * RECORD);
    fetch_all(&store, 1, &[0, 7], &bytes, 8).unwrap();
    assert!(store.cache().counts().used_bytes <= 3 * RECORD);
    assert_eq!(store.stats().layers[1].misses, 2);
    let err = store.fetch::<StoreError>(0, &[99], &mut |_, _| Ok(())).unwrap_err();
    assert!(err.to_string().contains("expert 99"), "{err}");
}

#[test]
fn prefetched_experts_need_no_demand_read() {
    let (idx, bytes) = index("prefetch", 2, 8);
    let store = ExpertStore::open(idx, opts(64 * RECORD, 2)).unwrap();
    store.prefetch(1, &[2, 4, 6]);
    // Demand a superset: predicted ones come from the prefetch (waited for if
    // still running, taken back if not started), the rest are read.
    fetch_all(&store, 1, &[2, 3, 4, 6], &bytes, 8).unwrap();
    let s = store.stats();
    assert_eq!(s.hits + s.misses, 4);
    assert!(s.misses >= 1, "expert 3 was not predicted");
    assert_eq!(
        s.prefetch_hits + (s.misses - 1),
        3,
        "every predicted expert came from exactly one read: {s:?}"
    );
    // A wrong prediction only costs a read.
    store.prefetch(0, &[5]);
    fetch_all(&store, 0, &[1], &bytes, 8).unwrap();
}

#[test]
fn corrupt_record_is_a_digest_error_through_prefetch_too() {
    let (mut idx, bytes) = index("corrupt", 1, 4);
    idx.layers[0][2].digest = Some(Digest(0xdead));
    let store = ExpertStore::open(idx.clone(), opts(64 * RECORD, 2)).unwrap();
    store.prefetch(0, &[2]);
    let err = fetch_all(&store, 0, &[1, 2], &bytes, 4).unwrap_err();
    assert!(matches!(err, StoreError::Digest { layer: 0, expert: 2, .. }), "{err}");
    // Any backend reports it the same way.
    let backend = open_backend(
        &idx.files,
        IoOptions {
            kind: IoKind::Mmap,
            direct: false,
            depth: 1,
        },
    )
    .unwrap();
    let store = ExpertStore::with_backend(idx, Arc::clone(&backend), 1 << 20, true);
    assert!(matches!(
        fetch_all(&store, 0, &[2], &bytes, 4).unwrap_err(),
        StoreError::Digest { .. }
    ));
}

#[test]
fn a_layer_whose_predictions_go_unused_stops_prefetching() {
    use larder_store::PREFETCH_PROBE;
    let (idx, bytes) = index("precision", 2, 256);
    // A cache that holds every record, so each prediction is read once.
    let store = ExpertStore::open(idx, opts(512 * RECORD, 2)).unwrap();
    // Prefetch reads run in the background: wait until they stop.
    let wait_idle = |store: &ExpertStore| {
        let mut last = u64::MAX;
        while store.stats().prefetch_reads != last {
            last = store.stats().prefetch_reads;
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    // Layer 1: predict expert 2e+1, demand 2e (never the prediction).
    // Layer 0: predict and demand the same expert.
    for e in 0..(2 * PREFETCH_PROBE as usize) {
        store.prefetch(1, &[(2 * e + 1) % 256]);
        store.prefetch(0, &[e]);
        wait_idle(&store);
        fetch_all(&store, 1, &[(2 * e) % 256], &bytes, 256).unwrap();
        fetch_all(&store, 0, &[e], &bytes, 256).unwrap();
    }
    let s = store.stats();
    let (wrong, right) = (s.layers[1], s.layers[0]);
    assert_eq!(wrong.prefetch_hits, 0);
    // Off after PREFETCH_PROBE wasted reads, then one probe in PREFETCH_PROBE requests.
    assert!(wrong.prefetch_reads <= PREFETCH_PROBE + 2, "{wrong:?}");
    assert!(store.prefetch_skipped()[&1] >= PREFETCH_PROBE - 2);
    // The layer whose predictions are used keeps prefetching (a prediction
    // the demand overtook before it started is read on demand instead).
    assert!(right.prefetch_reads > PREFETCH_PROBE + 2, "{right:?}");
    assert!(right.prefetch_precision() > 0.99 && right.prefetch_recall() > 0.9, "{right:?}");
    assert!(!store.prefetch_skipped().contains_key(&0));
}

/// Demand reads' digests are checked as tasks on the rayon pool when it has
/// more than one thread, on the computing thread otherwise: the same records
/// reach the caller either way, a corrupt one is an error and never cached,
/// and the checks' time is counted.
#[test]
fn digests_checked_on_the_pool_or_inline_give_the_same_records_and_errors() {
    let (mut idx, bytes) = index("pool", 2, 16);
    idx.layers[1][5].digest = Some(Digest(0xbad));
    for threads in [1, 4] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let store = ExpertStore::open(idx.clone(), opts(64 * RECORD, 0)).unwrap();
            let all: Vec<usize> = (0..16).collect();
            fetch_all(&store, 0, &all, &bytes, 16).unwrap();
            // Now cached: handed over without a read.
            fetch_all(&store, 0, &all, &bytes, 16).unwrap();
            let s = store.stats();
            assert_eq!((s.misses, s.hits, s.bytes_read), (16, 16, 16 * RECORD), "{threads} threads");
            assert!(s.verify_s > 0.0);
            let err = fetch_all(&store, 1, &[2, 5, 9], &bytes, 16).unwrap_err();
            assert!(matches!(err, StoreError::Digest { layer: 1, expert: 5, .. }), "{err}");
            assert!(!store.cache().contains((1, 5)), "a record that failed its digest is never cached");
            assert!(fetch_all(&store, 1, &[5], &bytes, 16).is_err(), "and fails again when asked again");
            fetch_all(&store, 1, &[2, 9], &bytes, 16).unwrap();
        });
    }
}

/// A callback error stops the handing over at once, whichever thread
/// checked the digests, and the fetch returns that error.
#[test]
fn a_callback_error_stops_the_fetch_with_it() {
    let (idx, _) = index("callback", 1, 8);
    let store = ExpertStore::open(idx, opts(64 * RECORD, 0)).unwrap();
    let mut calls = 0;
    let err = store
        .fetch::<StoreError>(0, &[0, 1, 2, 3, 4, 5], &mut |_, _| {
            calls += 1;
            Err(StoreError::Invalid("stop".into()))
        })
        .unwrap_err();
    assert!(err.to_string().contains("stop"), "{err}");
    assert_eq!(calls, 1);
}
