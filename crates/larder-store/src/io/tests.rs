use std::path::PathBuf;

use super::*;

fn temp_file(name: &str, len: usize) -> (PathBuf, Vec<u8>) {
    let dir = std::env::temp_dir().join(format!("larder-io-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("data.bin");
    let bytes: Vec<u8> = (0..len).map(|i| (i * 31 + i / 4096) as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    (path, bytes)
}

fn backends(path: &PathBuf) -> Vec<Arc<dyn IoBackend>> {
    let mut v: Vec<Arc<dyn IoBackend>> = Vec::new();
    for kind in [IoKind::Pread, IoKind::Uring, IoKind::Mmap] {
        if kind == IoKind::Uring && IoKind::best() != IoKind::Uring {
            continue;
        }
        for direct in [false, true] {
            match open_backend(std::slice::from_ref(path), IoOptions { kind, direct, depth: 3 }) {
                Ok(b) => v.push(b),
                // Some file systems (tmpfs) refuse O_DIRECT; the buffered arm still runs.
                Err(e) if direct => eprintln!("skipping {} direct: {e}", kind.name()),
                Err(e) => panic!("{e}"),
            }
        }
    }
    v
}

#[test]
fn every_backend_reads_exact_bytes() {
    // Unaligned extents, one crossing the 1 MiB read chunk, one ending at EOF.
    let len = 3 * 1024 * 1024 + 777;
    let (path, bytes) = temp_file("exact", len);
    let jobs: Vec<Vec<Extent>> = vec![
        vec![Extent {
            file: 0,
            offset: 13,
            len: 5000,
        }],
        vec![
            Extent {
                file: 0,
                offset: 1_000_000,
                len: 1_200_000,
            },
            Extent {
                file: 0,
                offset: 7,
                len: 1,
            },
        ],
        vec![Extent {
            file: 0,
            offset: (len - 100) as u64,
            len: 100,
        }],
        vec![Extent {
            file: 0,
            offset: 0,
            len: len as u64,
        }],
    ];
    let refs: Vec<&[Extent]> = jobs.iter().map(|j| j.as_slice()).collect();
    for b in backends(&path) {
        let mut seen = vec![false; jobs.len()];
        b.read(&refs, &mut |job, r| {
            let views = r.unwrap_or_else(|e| panic!("{} direct={}: {e}", b.name(), b.is_direct()));
            for (v, x) in views.iter().zip(&jobs[job]) {
                assert_eq!(v.as_slice(), &bytes[x.offset as usize..(x.offset + x.len) as usize], "{}", b.name());
            }
            assert!(!seen[job]);
            seen[job] = true;
        });
        assert!(seen.iter().all(|&s| s), "{}: every job reported", b.name());
    }
}

#[test]
fn reads_past_the_end_are_truncation_errors() {
    let (path, _) = temp_file("short", 10_000);
    let jobs = [vec![Extent {
        file: 0,
        offset: 9_000,
        len: 5_000,
    }]];
    let refs: Vec<&[Extent]> = jobs.iter().map(|j| j.as_slice()).collect();
    for b in backends(&path) {
        let mut got = None;
        b.read(&refs, &mut |_, r| got = Some(r.map(|_| ())));
        let err = got.unwrap().expect_err("must fail");
        assert!(matches!(err, StoreError::Truncated { .. }), "{}: {err}", b.name());
        assert!(err.to_string().contains("data.bin"), "{err}");
    }
}
