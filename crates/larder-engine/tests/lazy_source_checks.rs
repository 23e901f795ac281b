//! Lazy mode trusts nothing it fetched (issue 37): by default every source
//! file streams once with its sha256 checked before the model loads, and a
//! byte flipped on the way is refused with nothing kept; experts fetched by
//! range later must match the digests taken then (or, with `first-fetch`,
//! at their first fetch); an interrupted spine fetch resumes inside a
//! tensor and the result is exact; `verify` names what is missing or wrong
//! without the network; while the source is down, fetches fail fast with a
//! retry time and cached requests are served, even batched with a failing one.

mod common;
use larder_testkit::hub;
mod lazy_support;

use std::path::Path;
use std::sync::{Arc, Mutex};

use common::{fixture, scratch_dir, stream_outcome};
use hub::{Fault, HubServer, Op};
use larder_engine::lazy::verify_lazy;
use larder_engine::{Engine, GenerateOptions, Job, RequestEvent, RequestSink, SamplingParams, Scheduler, SchedulerConfig};
use larder_store::lazy::{SourceCheck, LAZY_STATE, RECORDS_LOG};
use lazy_support::{assert_same, first_layer_file, lazy_load, load, used, PROMPT};

/// A request that passes, untouched, whatever it is asked for first.
fn pass() -> Fault {
    Fault::Slow {
        after: 0,
        pause: std::time::Duration::ZERO,
    }
}

/// Bytes of a safetensors file's length prefix and header (what describing
/// the source reads of it by range).
fn head_len(path: &Path) -> usize {
    let bytes = std::fs::read(path).unwrap();
    8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize
}

fn shards(model: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(model)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("model") && n.ends_with(".safetensors"))
        .collect();
    names.sort();
    names
}

fn lazy_json(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join(LAZY_STATE)).unwrap()).unwrap()
}

#[test]
fn the_first_open_streams_every_file_checked_whole_and_nothing_is_fetched_by_range_after() {
    for name in ["qwen3_moe_tiny", "qwen3_moe_tok", "deepseek_v3_fp8", "gpt_oss_tiny", "kimi_k3_tiny"] {
        let model = fixture(name);
        let want = stream_outcome(&Engine::load(&model).unwrap(), &PROMPT);
        let dir = scratch_dir(&format!("lazy-stream-{name}"));
        let server = HubServer::start(&model);
        let l = lazy_load(&server.url, &dir, None, 0, SourceCheck::Stream);
        {
            let engine = load(&l).unwrap();
            for f in shards(&model) {
                let size = std::fs::metadata(model.join(&f)).unwrap().len() as usize;
                // Kimi K3's vision-only shard: its header is read, nothing more.
                let vision_only = name == "kimi_k3_tiny" && f == "model-00003-of-00003.safetensors";
                let want = head_len(&model.join(&f)) + if vision_only { 0 } else { size };
                assert_eq!(server.sent(&f), want, "{name}: {f} streamed once, whole (vision: never)");
            }
            let files = lazy_json(&dir)["files"].as_array().unwrap().clone();
            assert!(files.iter().all(|f| f["verified"] == true), "{name}: {files:?}");
            assert_eq!(lazy_json(&dir)["check"], "stream");
            server.clear_log();
            assert_same(&stream_outcome(&engine, &PROMPT), &want, name);
            let c = engine.lazy_counts().unwrap();
            assert_eq!(c.fetched_records, 0, "{name}: every record was kept by the stream: {c:?}");
            assert!(server.log().is_empty(), "{name}: requests after the open: {:?}", server.log());
        }
        let engine = load(&l).unwrap();
        assert_same(&stream_outcome(&engine, &PROMPT), &want, &format!("{name}, second run"));
        assert!(server.log().is_empty(), "{name}: the second run sent requests");
        drop(engine);
        let report = verify_lazy(&dir).unwrap();
        assert!(report.bad.is_empty() && report.unverified_files.is_empty(), "{report:?}");
        assert_eq!((report.present, report.missing), (report.records, 0));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_byte_flipped_while_a_file_streams_is_refused_and_nothing_of_it_is_kept() {
    let model = fixture("qwen3_moe_tiny");
    let want = stream_outcome(&Engine::load(&model).unwrap(), &PROMPT);
    let dir = scratch_dir("lazy-stream-flip");
    let server = HubServer::start(&model);
    let l = lazy_load(&server.url, &dir, None, 0, SourceCheck::Stream);
    // Describing reads the length prefix and the header; the stream comes third.
    server.fault(Op::Get, "model.safetensors", pass());
    server.fault(Op::Get, "model.safetensors", pass());
    let size = std::fs::metadata(model.join("model.safetensors")).unwrap().len() as usize;
    server.fault(Op::Get, "model.safetensors", Fault::Flip { at: size / 2 });
    let err = load(&l).err().expect("a flipped byte must fail the open");
    assert!(err.contains("sha256") && err.contains("model.safetensors"), "{err}");
    assert!(!dir.join(LAZY_STATE).exists(), "the cache must not look complete");
    let log = std::fs::read_to_string(dir.join(RECORDS_LOG)).unwrap_or_default();
    assert!(log.trim().is_empty(), "no record may be kept: {log}");
    // From an honest source the rerun streams the file anew and is exact.
    server.clear_log();
    let engine = load(&l).unwrap();
    let head = head_len(&model.join("model.safetensors"));
    assert_eq!(
        server.sent("model.safetensors"),
        head + size,
        "described, then streamed again from its first byte"
    );
    assert_same(&stream_outcome(&engine, &PROMPT), &want, "after a refused stream");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn under_a_quota_experts_fetched_later_must_match_the_streamed_digests() {
    let model = fixture("qwen3_moe_tiny");
    let want = stream_outcome(&Engine::load(&model).unwrap(), &PROMPT);
    let dir = scratch_dir("lazy-stream-quota");
    let server = HubServer::start(&model);
    let (fixed, record) = {
        let engine = load(&lazy_load(&server.url, &dir, None, 0, SourceCheck::Stream)).unwrap();
        let c = engine.lazy_counts().unwrap();
        let fixed: u64 = ["spine.safetensors", "config.json", "generation_config.json"]
            .iter()
            .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
            .map(|m| m.len())
            .sum();
        (fixed, c.present_bytes / c.present_records)
    };
    let _ = std::fs::remove_dir_all(&dir);
    let l = lazy_load(&server.url, &dir, Some(fixed + 2 * record), 0, SourceCheck::Stream);
    let engine = load(&l).unwrap();
    assert_eq!(
        engine.lazy_counts().unwrap().present_records,
        2,
        "the stream kept what the quota admits"
    );
    assert_same(&stream_outcome(&engine, &PROMPT), &want, "under a quota");
    let fetched = engine.lazy_counts().unwrap().fetched_records;
    assert!(fetched > 0);
    drop(engine);
    // A record fetched by range with a byte flipped on the way is refused, not kept.
    let engine = load(&l).unwrap();
    let before = engine.lazy_counts().unwrap();
    for _ in 0..64 {
        server.fault(Op::Get, "model.safetensors", Fault::Flip { at: 7 });
    }
    let err = engine.forward(&PROMPT).expect_err("flipped bytes must fail").to_string();
    assert!(err.contains("differ") && err.contains("nothing kept"), "{err}");
    let after = engine.lazy_counts().unwrap();
    assert!(after.present_records <= before.present_records, "{before:?} -> {after:?}");
    drop(engine);
    server.state.log.lock().unwrap().clear();
    // Faults left over are used up by requests that fail; an honest source then serves it exactly.
    let engine = load(&l).unwrap();
    loop {
        let left = server.log().len();
        if engine.forward(&PROMPT).is_ok() {
            break;
        }
        assert!(server.log().len() > left, "a failing forward must have asked the source");
    }
    assert_same(&stream_outcome(&engine, &PROMPT), &want, "after refused fetches");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn with_first_fetch_a_later_fetch_that_differs_from_the_first_is_refused() {
    let model = fixture("qwen3_moe_tiny");
    let want = stream_outcome(&Engine::load(&model).unwrap(), &PROMPT);
    let dir = scratch_dir("lazy-first-fetch-flip");
    let server = HubServer::start(&model);
    let l = lazy_load(&server.url, &dir, None, 0, SourceCheck::FirstFetch);
    assert_same(&stream_outcome(&load(&l).unwrap(), &PROMPT), &want, "first fetches");
    // A record damaged on the drive is fetched again; the source now flips a byte.
    let layer_file = first_layer_file(&dir);
    let mut bytes = std::fs::read(&layer_file).unwrap();
    bytes[4096 + 10] ^= 0xff;
    std::fs::write(&layer_file, &bytes).unwrap();
    let engine = load(&l).unwrap();
    for _ in 0..8 {
        server.fault(Op::Get, "model.safetensors", Fault::Flip { at: 3 });
    }
    let err = engine.forward(&PROMPT).expect_err("a refetch that differs must fail").to_string();
    assert!(err.contains("first fetched") && err.contains("nothing kept"), "{err}");
    drop(engine);
    let report = verify_lazy(&dir).unwrap();
    assert!(report.bad.is_empty(), "the damaged record was dropped, not kept: {:?}", report.bad);
    assert!(report.missing > 0 && !report.unverified_files.is_empty(), "{report:?}");
    let engine = load(&l).unwrap();
    loop {
        if engine.forward(&PROMPT).is_ok() {
            break;
        }
    }
    assert_same(&stream_outcome(&engine, &PROMPT), &want, "after a refused refetch");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_interrupted_spine_fetch_resumes_inside_a_tensor_and_the_output_is_exact() {
    let model = fixture("qwen3_moe_tiny");
    let want = stream_outcome(&Engine::load(&model).unwrap(), &PROMPT);
    let server = HubServer::start(&model);
    for stop_after in [1, 3, 8] {
        let dir = scratch_dir(&format!("lazy-spine-resume-{stop_after}"));
        let mut l = lazy_load(&server.url, &dir, None, 0, SourceCheck::FirstFetch);
        // Ranges of an odd size, one at a time: each resume point lies inside a tensor.
        l.lazy.range_bytes = 3001;
        l.lazy.ranges = 1;
        for _ in 0..2 + stop_after {
            server.fault(Op::Get, "model.safetensors", pass());
        }
        server.fault(Op::Get, "model.safetensors", Fault::Status(500));
        let err = load(&l).err().expect("the spine fetch was cut");
        assert!(err.contains("run again to resume"), "{err}");
        let journal: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("pull-state.json")).unwrap()).unwrap();
        let offset = journal["files"]["model.safetensors"]["offset"].as_u64().unwrap();
        assert!(offset > 0, "progress was saved: {journal}");
        let engine = load(&l).unwrap();
        assert_same(
            &stream_outcome(&engine, &PROMPT),
            &want,
            &format!("resumed after {stop_after} ranges"),
        );
        drop(engine);
        assert!(verify_lazy(&dir).unwrap().bad.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn an_interrupted_stream_resumes_and_every_file_is_still_checked_whole() {
    let model = fixture("qwen3_moe_tok");
    let want = stream_outcome(&Engine::load(&model).unwrap(), &PROMPT);
    let dir = scratch_dir("lazy-stream-resume");
    let server = HubServer::start(&model);
    let mut l = lazy_load(&server.url, &dir, None, 0, SourceCheck::Stream);
    l.lazy.range_bytes = 4096;
    let shard = shards(&model).swap_remove(0);
    for _ in 0..4 {
        server.fault(Op::Get, &shard, pass());
    }
    server.fault(Op::Get, &shard, Fault::Reset { after: 100 });
    assert!(load(&l).is_err(), "the stream was cut");
    let engine = load(&l).unwrap();
    assert_same(&stream_outcome(&engine, &PROMPT), &want, "resumed stream");
    let files = lazy_json(&dir)["files"].as_array().unwrap().clone();
    assert!(files.iter().all(|f| f["verified"] == true), "{files:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn verify_names_what_is_missing_and_what_is_wrong() {
    let model = fixture("qwen3_moe_tiny");
    let dir = scratch_dir("lazy-verify");
    let server = HubServer::start(&model);
    let l = lazy_load(&server.url, &dir, None, 0, SourceCheck::FirstFetch);
    let used_records = {
        let engine = load(&l).unwrap();
        stream_outcome(&engine, &PROMPT);
        used(&engine).0.len()
    };
    let report = verify_lazy(&dir).unwrap();
    assert!(report.bad.is_empty(), "{:?}", report.bad);
    assert_eq!(report.present, used_records);
    assert_eq!(report.missing, report.records - used_records);
    assert_eq!(report.missing_by_layer.values().sum::<usize>(), report.missing);
    assert_eq!(report.known, used_records);
    let layer_file = first_layer_file(&dir);
    let mut bytes = std::fs::read(&layer_file).unwrap();
    bytes[4096 + 10] ^= 0xff;
    std::fs::write(&layer_file, &bytes).unwrap();
    let report = verify_lazy(&dir).unwrap();
    assert_eq!(report.bad.len(), 1, "{:?}", report.bad);
    assert!(
        report.bad[0].contains("expert") && report.bad[0].contains("differs"),
        "{:?}",
        report.bad
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn while_the_source_is_down_fetches_fail_fast_and_cached_requests_are_served() {
    let model = fixture("qwen3_moe_tiny");
    let reference = Engine::load(&model).unwrap();
    let dir = scratch_dir("lazy-breaker");
    let server = HubServer::start(&model);
    let mut l = lazy_load(&server.url, &dir, None, 0, SourceCheck::FirstFetch);
    l.lazy.retry_source_after = std::time::Duration::from_secs(600);
    let engine = load(&l).unwrap();
    let short = [5u32];
    let greedy = |e: &Engine, prompt: &[u32]| e.forward(prompt).map(|l| argmax(&l.into_vec()));
    let alone = greedy(&reference, &short).unwrap();
    assert_eq!(greedy(&engine, &short).unwrap(), alone, "cached now");
    for _ in 0..64 {
        server.fault(Op::Get, "model.safetensors", Fault::Status(503));
    }
    let err = engine.forward(&PROMPT).expect_err("the source is down");
    assert!(
        err.retry_after_s().is_some() && err.to_string().contains("not in the lazy cache yet"),
        "{err}"
    );
    // Open breaker: the next request needing the source fails without asking it.
    let asked = server.log().len();
    let err = engine.forward(&PROMPT).expect_err("still down");
    assert!(err.to_string().contains("asked again in"), "{err}");
    assert_eq!(server.log().len(), asked, "no request while the breaker is open");
    // A cached request batched with a failing one is served, exactly.
    let mut sched = Scheduler::new(&engine, SchedulerConfig::default()).unwrap();
    let got: Arc<Mutex<Vec<u32>>> = Arc::default();
    let sink_got = got.clone();
    let (job_cached, sink_cached) = job(&short, move |id| sink_got.lock().unwrap().push(id));
    let cached = sched.submit(job_cached, sink_cached).unwrap();
    let (job_failing, sink_failing) = job(&PROMPT, |_| {});
    let failing = sched.submit(job_failing, sink_failing).unwrap();
    let report = sched.step();
    assert_eq!(report.finished, vec![cached], "{report:?}");
    assert_eq!(report.failed.len(), 1);
    assert_eq!(report.failed[0].id, failing);
    assert!(report.failed[0].error.retry_after_s().is_some());
    assert_eq!(*got.lock().unwrap(), vec![alone as u32]);
    let _ = std::fs::remove_dir_all(&dir);
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
        .0
}

/// A greedy one-token request, and a sink that hands each new id to `on_token`.
fn job(prompt: &[u32], mut on_token: impl FnMut(u32) + Send + 'static) -> (Job, Box<dyn RequestSink + Send>) {
    let job = Job {
        prompt: prompt.to_vec(),
        options: GenerateOptions {
            max_new: 1,
            sampling: SamplingParams::default(),
            stop_at_eos: false,
            draft_max: 0,
        },
        ..Job::default()
    };
    let sink = Box::new(move |e: RequestEvent<'_>| {
        if let RequestEvent::Token { id, .. } = e {
            on_token(id);
        }
        true
    });
    (job, sink)
}

/// Bytes the files under `dir` take on the drive.
fn allocated(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let m = e.metadata().unwrap();
        total += if m.is_dir() { allocated(&e.path()) } else { m.blocks() * 512 };
    }
    total
}

/// A tmpfs of `bytes` mounted at a new folder (root only); unmounted when dropped.
struct SmallDrive(std::path::PathBuf);

impl SmallDrive {
    fn mount(name: &str, bytes: u64) -> Option<SmallDrive> {
        let dir = scratch_dir(name);
        let size = format!("size={bytes}");
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &size, "tmpfs"])
            .arg(&dir)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(SmallDrive(dir))
    }
}

impl Drop for SmallDrive {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn on_a_full_drive_fetched_experts_are_used_not_kept_and_that_is_said() {
    let model = fixture("qwen3_moe_tiny");
    let want = stream_outcome(&Engine::load(&model).unwrap(), &PROMPT);
    let server = HubServer::start(&model);
    // What the cache takes before any expert, and one record's bytes.
    let probe = scratch_dir("lazy-full-probe");
    let (fixed, record) = {
        let engine = load(&lazy_load(&server.url, &probe, None, 0, SourceCheck::FirstFetch)).unwrap();
        let fixed = allocated(&probe);
        engine.forward(&[5]).unwrap();
        let c = engine.lazy_counts().unwrap();
        (fixed, c.present_bytes / c.present_records)
    };
    let _ = std::fs::remove_dir_all(&probe);
    let Some(drive) = SmallDrive::mount("lazy-full", fixed + 8192) else {
        eprintln!("skipped: mounting a small tmpfs needs root");
        return;
    };
    assert!(record > 8192, "a record ({record} bytes) must not fit the room left");
    let engine = load(&lazy_load(&server.url, &drive.0, None, 0, SourceCheck::FirstFetch)).unwrap();
    assert_same(&stream_outcome(&engine, &PROMPT), &want, "on a full drive");
    let c = engine.lazy_counts().unwrap();
    assert_eq!(c.present_records, 0, "{c:?}");
    let warnings = engine.take_warnings();
    assert!(
        warnings.iter().any(|w| w.contains("not kept") || w.contains("used from RAM")),
        "{warnings:?}"
    );
    assert!(engine.take_warnings().is_empty(), "each said once");
}
