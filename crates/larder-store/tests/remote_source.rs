//! Remote sources against the test hub (tests/common): source parsing with
//! the hub env, the hub listing and its LFS sha256, metadata from HEAD (with
//! and without the hub's CDN redirect), whole-file streams checked by
//! sha256, a plain base URL listed from its files, a local folder, and the
//! clear errors: 401/403 (token), 404 (repo, revision, file), a source
//! that disagrees with its listing.

mod common;

use std::path::PathBuf;

use common::{client_options, HubServer, Op, COMMIT, REPO};
use larder_store::remote::{open_source, CheckpointSource, FileSource, HubEnv, RemoteError, StreamState};

fn hub_env(server: &HubServer, token: Option<&str>) -> HubEnv {
    HubEnv {
        endpoint: Some(server.url.clone()),
        token: token.map(str::to_string),
    }
}

fn open_hub(server: &HubServer, arg: &str, token: Option<&str>) -> Box<dyn FileSource> {
    let env = hub_env(server, token);
    let src = CheckpointSource::parse(arg, &env).unwrap();
    open_source(&src, &env, &client_options(500)).unwrap()
}

#[test]
fn hub_listing_meta_and_verified_stream() {
    let server = HubServer::start(&common::fixture());
    let src = open_hub(&server, REPO, None);
    server.fault(Op::Api, "", common::Fault::Status(502));
    let listing = src.list_files().unwrap();
    assert_eq!(src.transferred().retries, 1, "a 502 on the listing is retried");
    assert_eq!(listing.commit.as_deref(), Some(COMMIT));
    let names: Vec<_> = listing.files.iter().map(|f| f.name.as_str()).collect();
    assert!(names.contains(&"config.json") && names.contains(&"model.safetensors"), "{names:?}");
    let model = listing.get("model.safetensors").unwrap();
    assert_eq!(model.sha256.as_deref(), Some(server.sha256("model.safetensors").as_str()));

    let meta = src.file_meta("model.safetensors").unwrap();
    assert_eq!(meta.size, server.file("model.safetensors").len() as u64);
    assert_eq!(meta.sha256, model.sha256);
    assert_eq!(meta.commit.as_deref(), Some(COMMIT));

    let mut out = Vec::new();
    let report = src.stream_file("model.safetensors", &mut out, &mut StreamState::default()).unwrap();
    assert!(report.verified);
    assert_eq!(out, server.file("model.safetensors"));
    // After the listing, every read is at the listed commit.
    let gets: Vec<_> = server.log().into_iter().filter(|s| s.op == Op::Get).collect();
    assert!(gets.iter().all(|s| s.path.contains(&format!("/resolve/{COMMIT}/"))), "{gets:?}");
    let t = src.transferred();
    assert_eq!(t.retries, 1);
    assert!(t.bytes >= out.len() as u64);

    // A small file (no LFS sha): streamed, not verified.
    let mut cfg = Vec::new();
    let report = src.stream_file("config.json", &mut cfg, &mut StreamState::default()).unwrap();
    assert!(!report.verified);
    assert_eq!(cfg, server.file("config.json"));
}

#[test]
fn cdn_redirect_keeps_lfs_headers_and_ranges() {
    let server = HubServer::start(&common::fixture());
    *server.state.redirect_lfs.lock().unwrap() = true;
    let src = open_hub(&server, &format!("{REPO}@main"), None);
    src.list_files().unwrap();
    let meta = src.file_meta("model.safetensors").unwrap();
    assert_eq!(meta.sha256.as_deref(), Some(server.sha256("model.safetensors").as_str()));
    let want = server.file("model.safetensors");
    assert_eq!(src.read_range("model.safetensors", 100, 1000).unwrap(), want[100..1100]);
    let mut out = Vec::new();
    src.stream_file("model.safetensors", &mut out, &mut StreamState::default()).unwrap();
    assert_eq!(out, want);
    assert!(server.log().iter().any(|s| s.path.starts_with("/cdn/") && s.status == 206));
}

#[test]
fn token_missing_or_wrong_is_a_clear_error() {
    let server = HubServer::start(&common::fixture());
    *server.state.token.lock().unwrap() = Some("secret".into());
    let err = open_hub(&server, REPO, None).list_files().unwrap_err();
    assert!(matches!(err, RemoteError::Unauthorized { status: 401, .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("HF_TOKEN") && msg.contains(&server.url), "{msg}");

    let err = open_hub(&server, REPO, Some("wrong")).file_meta("config.json").unwrap_err();
    assert!(matches!(err, RemoteError::Unauthorized { status: 403, .. }), "{err}");
    assert!(err.to_string().contains("HF_TOKEN") && err.to_string().contains("refused"), "{err}");

    let src = open_hub(&server, REPO, Some("secret"));
    assert_eq!(src.read_range("config.json", 0, 10).unwrap(), server.file("config.json")[..10]);
}

#[test]
fn missing_repo_revision_and_file_are_named() {
    let server = HubServer::start(&common::fixture());
    let err = open_hub(&server, "nobody/nothing", None).list_files().unwrap_err();
    assert!(matches!(&err, RemoteError::NotFound { what, .. } if what == "repository"), "{err}");
    assert!(err.to_string().contains("nobody/nothing"), "{err}");

    let err = open_hub(&server, &format!("{REPO}@v9"), None).list_files().unwrap_err();
    assert!(matches!(&err, RemoteError::NotFound { what, .. } if what == "revision"), "{err}");
    assert!(err.to_string().contains("/revision/v9"), "{err}");

    let err = open_hub(&server, REPO, None).file_meta("nope.safetensors").unwrap_err();
    assert!(matches!(&err, RemoteError::NotFound { what, .. } if what == "file"), "{err}");
    assert!(err.to_string().contains("resolve/main/nope.safetensors"), "{err}");
}

#[test]
fn wrong_sha256_fails_the_stream() {
    let server = HubServer::start(&common::fixture());
    server.state.wrong_sha.lock().unwrap().push("model.safetensors".into());
    let src = open_hub(&server, REPO, None);
    // Without a listing: the served X-Linked-Etag is the only sha256 known.
    let mut out = Vec::new();
    let err = src
        .stream_file("model.safetensors", &mut out, &mut StreamState::default())
        .unwrap_err();
    assert!(matches!(err, RemoteError::Sha256Mismatch { .. }), "{err}");
    assert!(
        err.to_string().contains("model.safetensors") && err.to_string().contains(&"f".repeat(64)),
        "{err}"
    );
    // With a listing: the source disagrees with its own listing.
    src.list_files().unwrap();
    let err = src.file_meta("model.safetensors").unwrap_err();
    assert!(matches!(err, RemoteError::ListingMismatch { .. }), "{err}");
}

#[test]
fn plain_base_url_lists_its_files() {
    let server = HubServer::start(&common::fixture());
    let env = HubEnv::default();
    let src = CheckpointSource::parse(&format!("{}/{REPO}", server.url), &env).unwrap();
    assert!(matches!(src, CheckpointSource::Http { .. }));
    let src = open_source(&src, &env, &client_options(500)).unwrap();
    let listing = src.list_files().unwrap();
    let mut names: Vec<_> = listing.files.iter().map(|f| f.name.clone()).collect();
    names.sort();
    assert_eq!(names, ["config.json", "generation_config.json", "model.safetensors"]);
    let model = listing.get("model.safetensors").unwrap();
    assert_eq!(model.size, Some(server.file("model.safetensors").len() as u64));
    assert_eq!(model.sha256.as_deref(), Some(server.sha256("model.safetensors").as_str()));
}

#[test]
fn local_folder_has_the_same_api() {
    let env = HubEnv::default();
    let src = CheckpointSource::parse(common::fixture().to_str().unwrap(), &env).unwrap();
    let src = open_source(&src, &env, &client_options(500)).unwrap();
    let listing = src.list_files().unwrap();
    assert!(listing.get("model.safetensors").is_some());
    let want = std::fs::read(common::fixture().join("model.safetensors")).unwrap();
    assert_eq!(src.read_range("model.safetensors", 8, 100).unwrap(), want[8..108]);
    let mut out = Vec::new();
    let mut state = StreamState::from_prefix(&want[..1000]).unwrap();
    out.extend_from_slice(&want[..1000]);
    let report = src.stream_file("model.safetensors", &mut out, &mut state).unwrap();
    assert_eq!((out, report.size), (want.clone(), want.len() as u64));
    assert_eq!(src.transferred().bytes, 100 + want.len() as u64 - 1000);
    let err = src.read_range("model.safetensors", want.len() as u64 - 10, 20).unwrap_err();
    assert!(err.to_string().contains("model.safetensors"), "{err}");
    assert!(src.read_range("../etc/passwd", 0, 1).is_err());
}

/// A folder holding a sharded checkpoint: config.json, an index naming
/// `shards` (the first `present` of them written).
fn sharded_dir(tag: &str, shards: &[&str], present: usize) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("larder-remote-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), b"{}").unwrap();
    let map: serde_json::Map<String, serde_json::Value> = shards
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("t{i}"), serde_json::json!(s)))
        .collect();
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    for (i, s) in shards.iter().take(present).enumerate() {
        std::fs::write(dir.join(s), vec![i as u8; 1000 + i]).unwrap();
    }
    dir
}

#[test]
fn base_url_index_names_the_shards() {
    let shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];
    let dir = sharded_dir("index", &shards, 2);
    let server = HubServer::start(&dir);
    let env = HubEnv::default();
    let src = CheckpointSource::parse(&format!("{}/{REPO}@{COMMIT}", server.url), &env).unwrap();
    let src = open_source(&src, &env, &client_options(500)).unwrap();
    let listing = src.list_files().unwrap();
    let mut names: Vec<_> = listing.files.iter().map(|f| f.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["config.json", shards[0], shards[1], "model.safetensors.index.json"]);
    assert_eq!(listing.get(shards[1]).unwrap().size, Some(1001));
    let mut out = Vec::new();
    assert!(src.stream_file(shards[1], &mut out, &mut StreamState::default()).unwrap().verified);
    assert_eq!(out, vec![1u8; 1001]);
    std::fs::remove_dir_all(&dir).unwrap();

    // An index naming a shard the source does not serve.
    let dir = sharded_dir("missing", &shards, 1);
    let server = HubServer::start(&dir);
    let src = CheckpointSource::parse(&format!("{}/{REPO}", server.url), &env).unwrap();
    let err = open_source(&src, &env, &client_options(500)).unwrap().list_files().unwrap_err();
    assert!(matches!(err, RemoteError::NotFound { .. }), "{err}");
    assert!(err.to_string().contains(shards[1]), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn cdn_redirect_change_mid_stream_is_caught() {
    let server = HubServer::start(&common::fixture());
    *server.state.redirect_lfs.lock().unwrap() = true;
    let src = open_hub(&server, REPO, None);
    let want = server.file("model.safetensors");
    server.fault(Op::Get, "model.safetensors", common::Fault::Reset { after: 50_000 });
    server.fault(Op::Get, "model.safetensors", common::Fault::Change);
    let mut out = Vec::new();
    let mut state = StreamState::default();
    let err = src.stream_file("model.safetensors", &mut out, &mut state).unwrap_err();
    assert!(matches!(err, RemoteError::FileChanged { .. }), "{err}");
    assert_eq!((state.offset, &out[..]), (50_000, &want[..50_000]));
}

#[test]
fn renamed_repo_redirects_are_followed() {
    let server = HubServer::start(&common::fixture());
    *server.state.redirect_lfs.lock().unwrap() = true;
    let src = open_hub(&server, common::OLD_REPO, None);
    let meta = src.file_meta("model.safetensors").unwrap();
    assert_eq!(meta.sha256.as_deref(), Some(server.sha256("model.safetensors").as_str()));
    assert_eq!(src.file_meta("config.json").unwrap().size, server.file("config.json").len() as u64);
    let want = server.file("model.safetensors");
    assert_eq!(src.read_range("model.safetensors", 7, 70).unwrap(), want[7..77]);
}

#[test]
fn a_url_is_one_more_backend_reading_the_bytes_a_file_backend_reads() {
    use larder_store::io::{open_backend, IoBackend, IoKind, IoOptions};
    use larder_store::remote::RangeBackend;
    use larder_store::Extent;
    let dir = common::fixture();
    let server = HubServer::start(&dir);
    let remote: std::sync::Arc<dyn FileSource> = open_hub(&server, REPO, None).into();
    let path = dir.join("model.safetensors");
    let size = std::fs::metadata(&path).unwrap().len();
    // Jobs of one to three scattered extents, unaligned, over the whole file.
    let jobs: Vec<Vec<Extent>> = (0..12u64)
        .map(|j| {
            (0..=(j % 3))
                .map(|k| {
                    let len = 1 + (j * 7919 + k * 104_729) % 20_000;
                    let offset = (j * 31_337 + k * 9_973) % (size - len);
                    Extent { file: 0, offset, len }
                })
                .collect()
        })
        .collect();
    let refs: Vec<&[Extent]> = jobs.iter().map(|j| j.as_slice()).collect();
    let read = |b: &dyn IoBackend| {
        let mut got = vec![Vec::new(); refs.len()];
        b.read(&refs, &mut |j, r| {
            got[j] = r.unwrap().iter().map(|v| v.as_slice().to_vec()).collect::<Vec<_>>()
        });
        got
    };
    let opts = IoOptions {
        kind: IoKind::Pread,
        direct: false,
        depth: 2,
    };
    let file = open_backend(&[path], opts).unwrap();
    let url = RangeBackend::new(remote, vec!["model.safetensors".into()], 4);
    assert_eq!(read(&url), read(file.as_ref()));
    assert_eq!(
        url.read_blocking(&jobs[5]).unwrap()[0].as_slice(),
        file.read_blocking(&jobs[5]).unwrap()[0].as_slice()
    );
    // A failing range fails its job, naming the URL.
    server.fault(Op::Get, "model.safetensors", common::Fault::Status(404));
    let err = url.read_blocking(&jobs[0][..1]).err().unwrap().to_string();
    assert!(err.contains("model.safetensors") && err.contains("404"), "{err}");
}
