//! Every fault the test hub injects (tests/common), against range reads and
//! whole-file streams: transient ones (5xx, resets mid-body, stalled and
//! short bodies) are retried and resumed where the body stopped, fetching
//! only the unfinished range; the rest (416, 404, a file that changed
//! between requests, attempts spent) are clear errors. The bytes returned
//! are always the file's, and the transfer counters say exactly what moved.

mod common;

use std::time::Duration;

use common::{client_options, Fault, HubServer, Op, REPO};
use larder_store::remote::{open_source, CheckpointSource, FileSource, HubEnv, RemoteError, StreamState};

const MODEL: &str = "model.safetensors";

fn setup() -> (HubServer, Box<dyn FileSource>) {
    let server = HubServer::start(&common::fixture());
    let env = HubEnv {
        endpoint: Some(server.url.clone()),
        token: None,
    };
    let src = CheckpointSource::parse(REPO, &env).unwrap();
    let src = open_source(&src, &env, &client_options(400)).unwrap();
    (server, src)
}

/// The Range headers of the data GETs, in order.
fn get_ranges(server: &HubServer) -> Vec<String> {
    server
        .log()
        .into_iter()
        .filter(|s| s.op == Op::Get)
        .filter_map(|s| s.range)
        .collect()
}

#[test]
fn server_errors_then_success_are_retried() {
    let (server, src) = setup();
    server.fault(Op::Get, MODEL, Fault::Status(500));
    server.fault(Op::Get, MODEL, Fault::Status(503));
    let want = server.file(MODEL);
    assert_eq!(src.read_range(MODEL, 4096, 8192).unwrap(), want[4096..12288]);
    let t = src.transferred();
    assert_eq!((t.requests, t.retries, t.bytes), (3, 2, 8192));

    server.fault(Op::Head, MODEL, Fault::Status(429));
    assert_eq!(src.file_meta(MODEL).unwrap().size, want.len() as u64);
}

#[test]
fn attempts_are_bounded() {
    let (server, src) = setup();
    for _ in 0..4 {
        server.fault(Op::Get, MODEL, Fault::Status(503));
    }
    let err = src.read_range(MODEL, 0, 10).unwrap_err();
    assert!(matches!(err, RemoteError::GaveUp { attempts: 4, .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&format!("resolve/main/{MODEL}")) && msg.contains("HTTP 503"), "{msg}");
    assert_eq!(src.transferred().bytes, 0);
}

#[test]
fn reset_mid_body_resumes_only_the_rest() {
    let (server, src) = setup();
    let want = server.file(MODEL);
    let size = want.len();
    server.fault(Op::Get, MODEL, Fault::Reset { after: 100_000 });
    let mut out = Vec::new();
    let report = src.stream_file(MODEL, &mut out, &mut StreamState::default()).unwrap();
    assert!(report.verified);
    assert_eq!(out, want);
    assert_eq!(src.transferred().bytes, size as u64, "no byte fetched twice");
    assert_eq!(
        get_ranges(&server),
        [format!("bytes=0-{}", size - 1), format!("bytes=100000-{}", size - 1)]
    );
    assert_eq!(server.sent(MODEL), size);

    // The same inside one range read.
    server.clear_log();
    server.fault(Op::Get, MODEL, Fault::Reset { after: 500 });
    assert_eq!(src.read_range(MODEL, 1000, 2000).unwrap(), want[1000..3000]);
    assert_eq!(get_ranges(&server), ["bytes=1000-2999", "bytes=1500-2999"]);
}

#[test]
fn stalled_body_times_out_and_resumes() {
    let (server, src) = setup();
    let want = server.file(MODEL);
    server.fault(
        Op::Get,
        MODEL,
        Fault::Slow {
            after: 3000,
            pause: Duration::from_millis(1500),
        },
    );
    assert_eq!(src.read_range(MODEL, 0, 50_000).unwrap(), want[..50_000]);
    assert_eq!(src.transferred().retries, 1);
    assert_eq!(get_ranges(&server), ["bytes=0-49999", "bytes=3000-49999"]);

    // A pause shorter than the read timeout is just slow.
    server.fault(
        Op::Get,
        MODEL,
        Fault::Slow {
            after: 10,
            pause: Duration::from_millis(100),
        },
    );
    assert_eq!(src.read_range(MODEL, 0, 100).unwrap(), want[..100]);
    assert_eq!(src.transferred().retries, 1);
}

#[test]
fn short_body_is_resumed() {
    let (server, src) = setup();
    let want = server.file(MODEL);
    server.fault(Op::Get, MODEL, Fault::Short { len: 700 });
    server.fault(Op::Get, MODEL, Fault::Short { len: 300 });
    assert_eq!(src.read_range(MODEL, 10, 2000).unwrap(), want[10..2010]);
    assert_eq!(get_ranges(&server), ["bytes=10-2009", "bytes=710-2009", "bytes=1010-2009"]);
    assert_eq!(src.transferred().bytes, 2000);
}

#[test]
fn unsatisfiable_range_and_missing_file_fail_at_once() {
    let (server, src) = setup();
    let size = server.file(MODEL).len() as u64;
    let err = src.read_range(MODEL, size - 5, 10).unwrap_err();
    assert!(matches!(err, RemoteError::BadRange { .. }), "short file: {err}");
    let err = src.read_range(MODEL, size + 5, 10).unwrap_err();
    assert!(matches!(err, RemoteError::RangeNotSatisfiable { .. }), "{err}");
    assert!(err.to_string().contains(MODEL) && err.to_string().contains("416"), "{err}");

    server.fault(Op::Get, MODEL, Fault::Status(404));
    let err = src.read_range(MODEL, 0, 10).unwrap_err();
    assert!(matches!(err, RemoteError::NotFound { .. }), "{err}");
    server.fault(Op::Get, MODEL, Fault::Status(403));
    let err = src.read_range(MODEL, 0, 10).unwrap_err();
    assert!(matches!(err, RemoteError::Unauthorized { status: 403, .. }), "{err}");
    assert!(err.to_string().contains("HF_TOKEN"), "{err}");
    assert_eq!(src.transferred().retries, 0, "client errors are not retried");
}

#[test]
fn a_file_changed_between_requests_is_an_error_never_mixed_bytes() {
    let (server, src) = setup();
    let want = server.file(MODEL);
    assert_eq!(src.read_range(MODEL, 0, 100).unwrap(), want[..100]);
    server.fault(Op::Get, MODEL, Fault::Change);
    let err = src.read_range(MODEL, 100, 100).unwrap_err();
    assert!(matches!(err, RemoteError::FileChanged { .. }), "{err}");
    assert!(err.to_string().contains(MODEL), "{err}");

    // Mid-stream: the resumed request finds a new version.
    let (server, src) = setup();
    let want = server.file(MODEL);
    server.fault(Op::Get, MODEL, Fault::Reset { after: 40_000 });
    server.fault(Op::Get, MODEL, Fault::Change);
    let mut out = Vec::new();
    let mut state = StreamState::default();
    let err = src.stream_file(MODEL, &mut out, &mut state).unwrap_err();
    assert!(matches!(err, RemoteError::FileChanged { .. }), "{err}");
    assert_eq!(state.offset, 40_000);
    assert_eq!(out, want[..40_000], "only bytes of the first version");
}

#[test]
fn without_etags_a_change_is_caught_by_the_sha256() {
    let (server, src) = setup();
    *server.state.no_etag.lock().unwrap() = true;
    server.fault(Op::Get, MODEL, Fault::Reset { after: 40_000 });
    server.fault(Op::Get, MODEL, Fault::Change);
    let err = src.stream_file(MODEL, &mut Vec::new(), &mut StreamState::default()).unwrap_err();
    assert!(matches!(err, RemoteError::Sha256Mismatch { .. }), "{err}");
}

#[test]
fn a_failed_stream_resumes_from_its_state() {
    let (server, src) = setup();
    let want = server.file(MODEL);
    for after in [10_000, 20_000, 30_000, 40_000] {
        server.fault(Op::Get, MODEL, Fault::Reset { after });
    }
    let mut out = Vec::new();
    let mut state = StreamState::default();
    let err = src.stream_file(MODEL, &mut out, &mut state).unwrap_err();
    assert!(matches!(err, RemoteError::GaveUp { .. }), "{err}");
    assert_eq!(state.offset, 100_000);
    assert_eq!(out, want[..100_000]);
    let report = src.stream_file(MODEL, &mut out, &mut state).unwrap();
    assert!(report.verified);
    assert_eq!(out, want);
    assert_eq!(src.transferred().bytes, want.len() as u64);
    assert_eq!(get_ranges(&server).last().unwrap(), &format!("bytes=100000-{}", want.len() - 1));
}

#[test]
fn parallel_ranges_survive_faults() {
    let (server, src) = setup();
    let want = server.file(MODEL);
    server.fault(Op::Get, MODEL, Fault::Status(503));
    server.fault(Op::Get, MODEL, Fault::Reset { after: 1000 });
    server.fault(Op::Get, MODEL, Fault::Short { len: 10 });
    let ranges: Vec<(u64, u64)> = (0..16).map(|i| (i * 30_000, 20_000)).collect();
    let got = src.read_ranges(MODEL, &ranges, 4).unwrap();
    for ((offset, len), bytes) in ranges.iter().zip(&got) {
        assert_eq!(bytes[..], want[*offset as usize..(offset + len) as usize]);
    }
    assert_eq!(src.transferred().bytes, 16 * 20_000);
    assert_eq!(src.transferred().retries, 3);
}
