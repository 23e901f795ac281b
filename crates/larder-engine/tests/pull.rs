//! `pull` over real HTTP (larder-store's test hub on loopback): the store it
//! streams is the store `pack` writes, record for record and spine byte for
//! byte, and runs bit-identical to the checkpoint in RAM (a single-file
//! qwen3-moe, DeepSeek-V3 fp8, gpt-oss MXFP4, a sharded checkpoint with an
//! index, placement over two drives); an interrupted pull resumes fetching
//! only the bytes that had not arrived; every fault is a clear error and
//! never a store that looks valid.

mod common;
use larder_testkit::hub;

use std::path::Path;
use std::time::Duration;

use common::{drive_dirs, fixture, pack_store, scratch_dir, stream_outcome};
use hub::{HubServer, Op, REPO};
use larder_engine::pull::{describe_remote, RemoteCheckpoint};
use larder_engine::Engine;
use larder_store::pack::DriveSpec;
use larder_store::pull::{pull, PullOptions, PullReport, PULL_STATE};
use larder_store::remote::{open_source, CheckpointSource, FileSource, HubEnv, RemoteOptions, RetryPolicy};
use larder_store::{Manifest, StoreError};

/// Client options: 4 attempts with millisecond backoff, a read timeout of `read_timeout_ms`.
fn client_options(read_timeout_ms: u64) -> RemoteOptions {
    RemoteOptions {
        retry: RetryPolicy {
            attempts: 4,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
        },
        connect_timeout: Duration::from_secs(2),
        read_timeout: Duration::from_millis(read_timeout_ms),
        parallel: 4,
        deadline: None,
    }
}

/// The hub repo `REPO` at `server`, read with `attempts` tries per request.
fn open_hub(server: &HubServer, attempts: u32, token: Option<&str>) -> Box<dyn FileSource> {
    let env = HubEnv {
        endpoint: Some(server.url.clone()),
        token: token.map(str::to_string),
    };
    let src = CheckpointSource::parse(REPO, &env).unwrap();
    let options = RemoteOptions {
        retry: RetryPolicy {
            attempts,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
        },
        connect_timeout: Duration::from_secs(2),
        read_timeout: Duration::from_millis(2000),
        parallel: 4,
        deadline: None,
    };
    open_source(&src, &env, &options).unwrap()
}

/// Describes and pulls; an error of either step as its message.
fn pull_into(remote: &dyn FileSource, out: &Path, drives: &[DriveSpec], opts: PullOptions) -> Result<PullReport, String> {
    let RemoteCheckpoint { source, files, .. } = describe_remote(remote, &out.join(".pull")).map_err(|e| e.to_string())?;
    pull(remote, &files, &source, out, drives, opts, &|_| {}).map_err(|e: StoreError| e.to_string())
}

/// Every record's payload and the spine file of two stores of one checkpoint.
fn assert_same_store(a: &Path, b: &Path, label: &str) {
    let (ma, mb) = (Manifest::read(a).unwrap(), Manifest::read(b).unwrap());
    assert_eq!(ma.source, mb.source, "{label}: source identity");
    assert_eq!(ma.files, mb.files, "{label}: carried files");
    assert_eq!(ma.spine[0].tensors, mb.spine[0].tensors, "{label}: spine entries");
    assert_eq!(
        std::fs::read(a.join(&ma.spine[0].file)).unwrap(),
        std::fs::read(b.join(&mb.spine[0].file)).unwrap(),
        "{label}: spine bytes"
    );
    let record = |root: &Path, m: &Manifest, l: usize, e: usize| {
        let entry = &m.layers[l].experts[e];
        let drive = root.join(&m.drives[entry.drive].path);
        let bytes = std::fs::read(drive.join(&entry.file)).unwrap();
        let payload: u64 = m.layers[l].parts.iter().map(|p| p.len).sum();
        bytes[entry.offset as usize..(entry.offset + payload) as usize].to_vec()
    };
    for l in 0..ma.layers.len() {
        assert_eq!(ma.layers[l].parts, mb.layers[l].parts, "{label}: layer {l} parts");
        for e in 0..ma.layers[l].experts.len() {
            assert!(record(a, &ma, l, e) == record(b, &mb, l, e), "{label}: layer {l} expert {e} record");
        }
    }
}

#[test]
fn pulled_store_is_the_packed_store_and_runs_bit_identical() {
    for (name, drives) in [
        ("qwen3_moe_tiny", 1),
        ("deepseek_v3_fp8", 2),
        ("gpt_oss_tiny", 1),
        ("qwen3_moe_tok", 2),
    ] {
        let model = fixture(name);
        let dir = scratch_dir(&format!("pull-{name}"));
        let server = HubServer::start(&model);
        let remote = open_hub(&server, 4, None);
        let specs = if drives == 1 {
            Vec::new()
        } else {
            drive_dirs(&dir, drives, |d| 1.0 + d as f64)
        };
        let pulled = dir.join("pulled");
        let opts = PullOptions {
            jobs: 2,
            ..PullOptions::default()
        };
        let report = pull_into(remote.as_ref(), &pulled, &specs, opts).unwrap();
        assert_eq!(report.fetched_bytes, report.total_bytes, "{name}: every byte once");
        assert!(report.unverified_files.is_empty(), "{name}: every shard sha256-checked");
        assert!(Manifest::is_store(&pulled) && !pulled.join(PULL_STATE).exists());
        // Each shard streamed exactly once (beyond the header reads).
        for f in std::fs::read_dir(&model).unwrap() {
            let f = f.unwrap().file_name().to_string_lossy().into_owned();
            if f.starts_with("model") && f.ends_with(".safetensors") {
                let bytes = server.file(&f);
                // The header read by range (length prefix, then JSON), then the file.
                let header = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
                assert_eq!(server.sent(&f), header + bytes.len(), "{name}: {f} bytes sent");
            }
        }
        let packed = dir.join("packed");
        pack_store(&model, &packed, &specs_again(&dir, drives));
        assert_same_store(&pulled, &packed, name);
        let v = larder_store::verify_store(&pulled, &mut |_| {}).unwrap();
        assert!(v.bad.is_empty(), "{name}: {:?}", v.bad);
        let prompt = [3, 1, 4, 1, 5, 9, 2, 6];
        let want = stream_outcome(&Engine::load(&model).unwrap(), &prompt);
        let got = stream_outcome(&Engine::load(&pulled).unwrap(), &prompt);
        assert!(
            got.logits.iter().zip(&want.logits).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: logits of the pulled store differ from the checkpoint's"
        );
        assert_eq!(got.greedy, want.greedy);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Kimi K3 as published: the shard holding only the vision tower is never
/// fetched (its header alone is read, by range), the vision tensors are
/// reported as skipped, and the pulled store is the packed one and runs
/// bit-identical to the checkpoint in RAM.
#[test]
fn a_k3_pull_never_fetches_the_vision_shard() {
    let model = fixture("kimi_k3_tiny");
    let dir = scratch_dir("pull-k3");
    let server = HubServer::start(&model);
    let remote = open_hub(&server, 4, None);
    let pulled = dir.join("pulled");
    let described = describe_remote(remote.as_ref(), &pulled.join(".pull")).unwrap();
    let vision_shard = "model-00003-of-00003.safetensors";
    assert_eq!(described.files.len(), 2);
    assert!(described.skipped.iter().any(|(n, _)| n == vision_shard), "{:?}", described.skipped);
    assert!(described.skipped.iter().any(|(n, _)| n.starts_with("vision_tower.")));
    let local = larder_model::checkpoint::Checkpoint::open(&model).unwrap();
    assert_eq!(described.skipped_bytes(), local.skipped().iter().map(|t| t.bytes).sum::<u64>());
    let report = pull(
        remote.as_ref(),
        &described.files,
        &described.source,
        &pulled,
        &[],
        PullOptions::default(),
        &|_| {},
    )
    .unwrap();
    assert_eq!(report.files, 2);
    let bytes = server.file(vision_shard);
    let header = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!(server.sent(vision_shard), header, "only the vision shard's header is read");
    let packed = dir.join("packed");
    pack_store(&model, &packed, &[]);
    assert_same_store(&pulled, &packed, "kimi_k3_tiny");
    let prompt = [3, 1, 4, 1, 5, 9, 2, 6];
    let want = stream_outcome(&Engine::load(&model).unwrap(), &prompt);
    let got = stream_outcome(&Engine::load(&pulled).unwrap(), &prompt);
    assert!(got.logits.iter().zip(&want.logits).all(|(a, b)| a.to_bits() == b.to_bits()));
    assert_eq!(got.greedy, want.greedy);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One file at a time, read in sequential 64 KiB ranges, progress saved
/// every millisecond.
fn small_ranges() -> PullOptions {
    PullOptions {
        jobs: 1,
        ranges: 1,
        range_bytes: 64 << 10,
        save_every: Duration::from_millis(1),
    }
}

/// A pull of the hub into `out` ([`small_ranges`], one try per request)
/// whose data request after the first `ok` fails; its error.
fn pull_failing_after(server: &HubServer, out: &Path, ok: usize) -> String {
    let remote = open_hub(server, 1, None);
    let RemoteCheckpoint { source, files, .. } = describe_remote(remote.as_ref(), &out.join(".pull")).unwrap();
    fail_range(server, ok);
    let err = pull(remote.as_ref(), &files, &source, out, &[], small_ranges(), &|_| {}).unwrap_err();
    err.to_string()
}

/// The offset `pull-state.json` in `out` saved for `model.safetensors`.
fn saved_offset(out: &Path) -> u64 {
    let state: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join(PULL_STATE)).unwrap()).unwrap();
    state["files"]["model.safetensors"]["offset"].as_u64().unwrap()
}

/// The data request after the next `ok` ones for `model.safetensors` fails (HTTP 500).
fn fail_range(server: &HubServer, ok: usize) {
    for _ in 0..ok {
        let pass = hub::Fault::Slow {
            after: 0,
            pause: Duration::ZERO,
        };
        server.fault(Op::Get, "model.safetensors", pass);
    }
    server.fault(Op::Get, "model.safetensors", hub::Fault::Status(500));
}

/// Drive folders for the packed copy (beside the pulled one's).
fn specs_again(dir: &Path, drives: usize) -> Vec<DriveSpec> {
    if drives == 1 {
        return Vec::new();
    }
    drive_dirs(&dir.join("pack-drives"), drives, |d| 1.0 + d as f64)
}

#[test]
fn an_interrupted_pull_resumes_with_only_the_missing_bytes() {
    let model = fixture("qwen3_moe_tiny");
    let dir = scratch_dir("pull-resume");
    let out = dir.join("store");
    let server = HubServer::start(&model);
    let size = server.file("model.safetensors").len() as u64;
    let opts = small_ranges();
    let err = pull_failing_after(&server, &out, 4);
    assert!(err.contains("resume"), "{err}");
    assert!(!Manifest::is_store(&out), "no manifest after a failed pull");
    let kept = saved_offset(&out);
    assert_eq!(kept, 4 * opts.range_bytes, "the four ranges that arrived are kept");
    // Loading it says what it is and how to finish it (not "re-run pack").
    let err = Engine::load(&out).err().unwrap().to_string();
    assert!(err.contains("unfinished `larder pull`") && err.contains("resume"), "{err}");

    server.clear_log();
    let remote = open_hub(&server, 4, None);
    let report = pull_into(remote.as_ref(), &out, &[], opts).unwrap();
    assert_eq!(report.fetched_bytes, size - kept);
    let header = 8 + u64::from_le_bytes(server.file("model.safetensors")[..8].try_into().unwrap());
    // The rerun reads the header again (8 + header bytes) and the rest of the file once.
    assert_eq!(
        server.sent("model.safetensors") as u64,
        header + (size - kept),
        "bytes fetched again"
    );
    let packed = dir.join("packed");
    pack_store(&model, &packed, &[]);
    assert_same_store(&out, &packed, "resumed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn faults_are_clear_errors_and_never_a_store_that_looks_valid() {
    let model = fixture("qwen3_moe_tiny");
    let dir = scratch_dir("pull-faults");
    let server = HubServer::start(&model);

    // The source's sha256 for the shard disagrees with its listing: refused
    // before any weights move.
    let out = dir.join("bad-sha");
    server.state.wrong_sha.lock().unwrap().push("model.safetensors".into());
    let err = pull_into(open_hub(&server, 2, None).as_ref(), &out, &[], PullOptions::default()).unwrap_err();
    assert!(err.contains("sha256"), "{err}");
    assert!(!Manifest::is_store(&out));
    server.state.wrong_sha.lock().unwrap().clear();
    // Fixed at the source: the rerun fetches the file anew and succeeds.
    server.clear_log();
    let report = pull_into(open_hub(&server, 2, None).as_ref(), &out, &[], PullOptions::default()).unwrap();
    assert_eq!(report.fetched_bytes, report.total_bytes);
    assert!(larder_store::verify_store(&out, &mut |_| {}).unwrap().bad.is_empty());

    // The file changes between the header read and the stream.
    let out = dir.join("changed");
    let remote = open_hub(&server, 2, None);
    let RemoteCheckpoint { source, files, .. } = describe_remote(remote.as_ref(), &out.join(".pull")).unwrap();
    server.fault(Op::Get, "model.safetensors", hub::Fault::Change);
    let err = pull(remote.as_ref(), &files, &source, &out, &[], PullOptions::default(), &|_| {}).unwrap_err();
    assert!(err.to_string().contains("changed"), "{err}");
    assert!(!Manifest::is_store(&out));

    // More range requests in flight than buffers allow: refused before anything is written.
    let out = dir.join("too-many");
    let greedy = PullOptions {
        jobs: 16,
        ranges: 16,
        ..PullOptions::default()
    };
    let err = pull_into(open_hub(&server, 2, None).as_ref(), &out, &[], greedy).unwrap_err();
    assert!(err.contains("--jobs 16 x --ranges 16"), "{err}");
    assert!(!out.join("pack-plan.json").exists());

    // Missing repo; token missing.
    let env = HubEnv {
        endpoint: Some(server.url.clone()),
        token: None,
    };
    let nope = CheckpointSource::parse("larder-test/no-such-repo", &env).unwrap();
    let remote = open_source(&nope, &env, &client_options(500)).unwrap();
    let err = describe_remote(remote.as_ref(), &dir.join("nope")).err().unwrap();
    assert!(err.to_string().contains("404") || err.to_string().contains("not found"), "{err}");
    let rev = CheckpointSource::parse(&format!("{REPO}@no-such-revision"), &env).unwrap();
    let remote = open_source(&rev, &env, &client_options(500)).unwrap();
    let err = describe_remote(remote.as_ref(), &dir.join("rev")).err().unwrap();
    assert!(err.to_string().contains("404") && err.to_string().contains("revision"), "{err}");
    *server.state.token.lock().unwrap() = Some("secret".into());
    let err = describe_remote(open_hub(&server, 2, None).as_ref(), &dir.join("anon"))
        .err()
        .unwrap();
    assert!(err.to_string().contains("HF_TOKEN"), "{err}");
    let err = describe_remote(open_hub(&server, 2, Some("wrong")).as_ref(), &dir.join("wrong"))
        .err()
        .unwrap();
    assert!(err.to_string().contains("refused"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A pull killed after a progress save but before the next one leaves bytes
/// on the drive past the saved offset: the rerun fetches from the saved
/// offset (exactly the rest), overwriting them, and the store is exact.
#[test]
fn a_pull_killed_between_saves_resumes_from_the_last_save() {
    let model = fixture("qwen3_moe_tiny");
    let dir = scratch_dir("pull-killed");
    let out = dir.join("store");
    let server = HubServer::start(&model);
    let size = server.file("model.safetensors").len() as u64;
    let opts = small_ranges();
    pull_failing_after(&server, &out, 6);
    // As if killed: the journal still says an earlier checkpoint.
    let path = out.join(PULL_STATE);
    let mut state: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let written = saved_offset(&out);
    let saved = (size / 4) & !0xffff;
    assert!(saved > 0 && saved < written);
    state["files"]["model.safetensors"]["offset"] = saved.into();
    std::fs::write(&path, serde_json::to_vec(&state).unwrap()).unwrap();

    server.clear_log();
    let report = pull_into(open_hub(&server, 4, None).as_ref(), &out, &[], opts).unwrap();
    assert_eq!(report.fetched_bytes, size - saved);
    let packed = dir.join("packed");
    pack_store(&model, &packed, &[]);
    assert_same_store(&out, &packed, "killed and resumed");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A full drive: the error names the file and says the pull resumes; after
/// space is freed the same pull finishes, fetching only what was missing.
/// Needs root (a 14 MiB tmpfs: the staged tokenizer fits, the spine does
/// not); skipped otherwise.
#[test]
fn a_full_drive_is_named_and_the_pull_resumes_after_space_is_freed() {
    let model = fixture("qwen3_moe_tok");
    let dir = scratch_dir("pull-enospc");
    let mnt = dir.join("small");
    std::fs::create_dir_all(&mnt).unwrap();
    let mount = |opts: &str| {
        std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", opts, "tmpfs"])
            .arg(&mnt)
            .status()
            .is_ok_and(|s| s.success())
    };
    if !mount("size=14m") {
        eprintln!("cannot mount a tmpfs here (not root?): full-drive test skipped");
        return;
    }
    let _unmount = Unmount(mnt.clone());
    let out = mnt.join("store");
    let server = HubServer::start(&model);
    let result = pull_into(open_hub(&server, 2, None).as_ref(), &out, &[], PullOptions::default());
    let remounted = std::process::Command::new("mount")
        .args(["-o", "remount,size=64m"])
        .arg(&mnt)
        .status()
        .is_ok_and(|s| s.success());
    let err = result.unwrap_err();
    assert!(err.contains("No space left on device") && err.contains(".partial"), "{err}");
    assert!(err.contains("resume"), "{err}");
    assert!(!Manifest::is_store(&out));
    assert!(remounted);
    let total: u64 =
        server.file("model-00001-of-00002.safetensors").len() as u64 + server.file("model-00002-of-00002.safetensors").len() as u64;
    let report = pull_into(open_hub(&server, 2, None).as_ref(), &out, &[], PullOptions::default()).unwrap();
    assert!(
        report.fetched_bytes < total,
        "resumed: {} of {total} bytes fetched again",
        report.fetched_bytes
    );
    let packed = dir.join("packed");
    pack_store(&model, &packed, &[]);
    assert_same_store(&out, &packed, "after a full drive");
}

/// Unmounts a test mount and removes its scratch folder, even on panic.
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
