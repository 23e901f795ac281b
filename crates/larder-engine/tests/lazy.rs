//! Lazy mode over real HTTP (larder-store's test hub on loopback): a model
//! whose experts are fetched on first use runs bit-identical to the
//! checkpoint in RAM; the first run fetches exactly the experts it uses and
//! a second run fetches nothing (not even the description); a disk quota
//! evicts the coldest records and punches their holes; a run interrupted
//! mid-fetch (a failed fetch, a log line torn by a kill), or a record
//! corrupted on the drive, costs only a refetch; an
//! offline source fails only requests that need a missing expert.

mod common;
use larder_testkit::hub;
mod lazy_support;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use common::{fixture, scratch_dir, stream_outcome};
use hub::{HubServer, Op};
use larder_engine::lazy::LazyLoad;
use larder_engine::Engine;
use larder_store::lazy::{SourceCheck, RECORDS_LOG};
use lazy_support::{assert_same, first_layer_file, load, sent, used, PROMPT};

/// Lazy load options trusting first fetches (these tests count what is
/// fetched by range); see `lazy_source_checks.rs` for the default.
fn lazy_load(server_url: &str, dir: &Path, quota: Option<u64>, prefetch: usize) -> LazyLoad {
    lazy_support::lazy_load(server_url, dir, quota, prefetch, SourceCheck::FirstFetch)
}

#[test]
fn lazy_runs_bit_identical_fetching_exactly_the_experts_used_and_nothing_the_second_time() {
    for name in ["qwen3_moe_tiny", "deepseek_v3_fp8", "gpt_oss_tiny", "qwen3_moe_tok", "kimi_k3_tiny"] {
        let model = fixture(name);
        let want = stream_outcome(&Engine::load(&model).unwrap(), &PROMPT);
        let dir = scratch_dir(&format!("lazy-{name}"));
        let server = HubServer::start(&model);
        let l = lazy_load(&server.url, &dir, None, 0);
        {
            let engine = load(&l).unwrap();
            server.clear_log();
            let got = stream_outcome(&engine, &PROMPT);
            assert_same(&got, &want, name);
            let (keys, bytes) = used(&engine);
            let c = engine.lazy_counts().unwrap();
            assert!(!keys.is_empty());
            assert_eq!(c.fetched_records, keys.len() as u64, "{name}: one fetch per expert used");
            assert_eq!(c.fetched_bytes, bytes, "{name}: payload bytes fetched");
            assert_eq!(sent(&server) as u64, bytes, "{name}: bytes the server sent are the experts used");
            assert_eq!(c.present_records, keys.len() as u64);
        }
        server.clear_log();
        let engine = load(&l).unwrap();
        let got = stream_outcome(&engine, &PROMPT);
        assert_same(&got, &want, &format!("{name}, second run"));
        // Kimi K3: the vision tower's shard is never fetched (its header alone was read).
        assert!(!server
            .log()
            .iter()
            .any(|s| s.path.ends_with("model-00003-of-00003.safetensors") && s.range.is_none()));
        assert!(server.log().is_empty(), "{name}: the second run sent requests: {:?}", server.log());
        let c = engine.lazy_counts().unwrap();
        assert_eq!(c.fetched_records, 0);
        assert_eq!(c.local_reads, used(&engine).0.len() as u64);
        // With prefetch the output is the same.
        drop(engine);
        let _ = std::fs::remove_dir_all(&dir);
        let engine = load(&lazy_load(&server.url, &dir, None, 2)).unwrap();
        assert_same(&stream_outcome(&engine, &PROMPT), &want, &format!("{name}, prefetch"));
        drop(engine);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Bytes the folder's layer files take on the drive.
fn allocated_layer_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() && p.file_name().unwrap().to_string_lossy().starts_with("larder-") {
            for f in std::fs::read_dir(&p).unwrap() {
                total += f.unwrap().metadata().unwrap().blocks() * 512;
            }
        }
    }
    total
}

#[test]
fn a_disk_quota_evicts_the_coldest_records_and_output_stays_identical() {
    let model = fixture("qwen3_moe_tiny");
    let want = stream_outcome(&Engine::load(&model).unwrap(), &PROMPT);
    let dir = scratch_dir("lazy-quota");
    let server = HubServer::start(&model);
    // Learn the spine and small files' size and a record's from an unlimited cache.
    let (fixed, record, used_records) = {
        let engine = load(&lazy_load(&server.url, &dir, None, 0)).unwrap();
        stream_outcome(&engine, &PROMPT);
        let c = engine.lazy_counts().unwrap();
        let fixed: u64 = ["spine.safetensors", "config.json", "generation_config.json"]
            .iter()
            .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
            .map(|m| m.len())
            .sum();
        (fixed, c.present_bytes / c.present_records, c.present_records)
    };
    assert!(
        used_records > 4,
        "the prompt uses {used_records} experts; the test needs more than 4"
    );
    let quota = fixed + 3 * record;
    let engine = load(&lazy_load(&server.url, &dir, Some(quota), 0)).unwrap();
    // Opening under the smaller quota evicted down to it.
    let c = engine.lazy_counts().unwrap();
    assert_eq!(c.present_records, 3);
    assert!(c.evicted >= used_records - 3);
    assert_same(&stream_outcome(&engine, &PROMPT), &want, "under a quota");
    let c = engine.lazy_counts().unwrap();
    assert!(c.present_bytes <= 3 * record, "{c:?}");
    assert!(c.fetched_records > 0);
    assert!(
        allocated_layer_bytes(&dir) <= 3 * record + 64 * 1024,
        "holes punched: {} bytes allocated",
        allocated_layer_bytes(&dir)
    );
    drop(engine);
    // The log agrees after a restart.
    let log = std::fs::read_to_string(dir.join(RECORDS_LOG)).unwrap();
    assert_eq!(log.lines().count(), 3);
    // A quota below the spine is refused, naming the flag.
    let err = load(&lazy_load(&server.url, &dir, Some(1024), 0)).err().unwrap();
    assert!(err.contains("--disk-quota") && err.contains("spine"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_run_interrupted_mid_fetch_and_a_corrupt_record_cost_only_a_refetch() {
    let model = fixture("qwen3_moe_tiny");
    let want = stream_outcome(&Engine::load(&model).unwrap(), &PROMPT);
    let dir = scratch_dir("lazy-restart");
    let server = HubServer::start(&model);
    let mut l = lazy_load(&server.url, &dir, None, 0);
    // One request at a time, so which ones succeed is fixed.
    l.lazy.ranges = 1;
    let engine = load(&l).unwrap();
    // The fifth expert request fails (one try): the forward pass fails, naming the expert.
    for _ in 0..4 {
        server.fault(
            Op::Get,
            "model.safetensors",
            hub::Fault::Slow {
                after: 0,
                pause: Duration::ZERO,
            },
        );
    }
    server.fault(Op::Get, "model.safetensors", hub::Fault::Status(500));
    let vocab = engine.model().spec().vocab_size as u32;
    let prompt: Vec<u32> = PROMPT.iter().map(|t| t % vocab).collect();
    let err = engine.forward(&prompt).err().unwrap().to_string();
    assert!(err.contains("not in the lazy cache yet") && err.contains("500"), "{err}");
    let mut kept = engine.lazy_counts().unwrap().present_records;
    assert!(kept >= 1, "the first record's three components arrived before the failure");
    drop(engine);
    // A kill after a record's bytes were written but before its log line
    // was synced: the line is torn, so the record counts as absent.
    let log_path = dir.join(RECORDS_LOG);
    let log = std::fs::read_to_string(&log_path).unwrap();
    if kept > 0 {
        let keep_lines: Vec<&str> = log.lines().collect();
        let last = keep_lines[keep_lines.len() - 1];
        let torn = format!("{}\n{}", keep_lines[..keep_lines.len() - 1].join("\n"), &last[..last.len() / 2]);
        std::fs::write(&log_path, torn.trim_start()).unwrap();
        kept -= 1;
    }
    // Restart: what was kept is read from the drive, the rest fetched.
    server.clear_log();
    let engine = load(&l).unwrap();
    assert_eq!(engine.lazy_counts().unwrap().present_records, kept);
    assert_same(&stream_outcome(&engine, &PROMPT), &want, "after a failed fetch");
    let (keys, bytes) = used(&engine);
    let c = engine.lazy_counts().unwrap();
    assert_eq!(c.fetched_records, keys.len() as u64 - kept);
    let per_record = bytes / keys.len() as u64;
    assert_eq!(sent(&server) as u64, per_record * (keys.len() as u64 - kept));
    drop(engine);
    // A record damaged on the drive fails its digest and is fetched again.
    let layer_file = first_layer_file(&dir);
    let mut bytes = std::fs::read(&layer_file).unwrap();
    let first_record = 4096;
    bytes[first_record + 10] ^= 0xff;
    std::fs::write(&layer_file, &bytes).unwrap();
    let engine = load(&l).unwrap();
    assert_same(&stream_outcome(&engine, &PROMPT), &want, "after a corrupt record");
    let c = engine.lazy_counts().unwrap();
    assert_eq!((c.repaired, c.fetched_records), (1, 1), "{c:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn offline_the_cache_serves_what_it_has_and_fails_only_requests_needing_a_missing_expert() {
    let model = fixture("qwen3_moe_tiny");
    let reference = Engine::load(&model).unwrap();
    let dir = scratch_dir("lazy-offline");
    let server = HubServer::start(&model);
    let url = server.url.clone();
    let short = [5u32];
    {
        let engine = load(&lazy_load(&url, &dir, None, 0)).unwrap();
        engine.forward(&short).unwrap();
    }
    drop(server);
    let engine = load(&lazy_load(&url, &dir, None, 0)).unwrap();
    let got = engine.forward(&short).unwrap().into_vec();
    let want = reference.forward(&short).unwrap().into_vec();
    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
    let err = engine.forward(&PROMPT).err().unwrap().to_string();
    assert!(err.contains("not in the lazy cache yet") && err.contains(&url), "{err}");
    // The engine keeps working for what it has.
    assert!(engine.forward(&short).is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn concurrent_batches_in_opposite_orders_all_complete_with_the_same_bytes() {
    use larder_store::IoBackend;
    let model = fixture("qwen3_moe_tiny");
    let dir = scratch_dir("lazy-concurrent");
    let server = HubServer::start(&model);
    let opened = larder_engine::lazy::open_lazy(&lazy_load(&server.url, &dir, None, 0), &|_| {}).unwrap();
    let layer = (0..opened.index.layers.len())
        .find(|&l| !opened.index.layers[l].is_empty())
        .unwrap();
    let jobs: Vec<Vec<larder_store::Extent>> = opened.index.layers[layer].iter().map(|loc| loc.extents.clone()).collect();
    let backend = opened.backend.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    for t in 0..4 {
        let (backend, tx) = (backend.clone(), tx.clone());
        let mut order: Vec<usize> = (0..jobs.len()).collect();
        if t % 2 == 1 {
            order.reverse();
        }
        let batch: Vec<Vec<larder_store::Extent>> = order.iter().map(|&i| jobs[i].clone()).collect();
        std::thread::spawn(move || {
            let refs: Vec<&[larder_store::Extent]> = batch.iter().map(|j| j.as_slice()).collect();
            let mut got = vec![Vec::new(); refs.len()];
            backend.read(&refs, &mut |i, r| got[order[i]] = r.unwrap()[0].as_slice().to_vec());
            tx.send(got).unwrap();
        });
    }
    let results: Vec<Vec<Vec<u8>>> = (0..4)
        .map(|_| {
            rx.recv_timeout(Duration::from_secs(60))
                .expect("a batch never finished (deadlock?)")
        })
        .collect();
    assert!(results.iter().all(|r| r == &results[0]));
    let c = backend.counts();
    assert_eq!(c.fetched_records, jobs.len() as u64, "each record fetched once: {c:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_source_unreachable_for_a_moment_fails_only_the_requests_of_that_moment() {
    let model = fixture("qwen3_moe_tiny");
    let want = Engine::load(&model).unwrap().forward(&PROMPT).unwrap().into_vec();
    let dir = scratch_dir("lazy-transient");
    let server = HubServer::start(&model);
    let engine = load(&lazy_load(&server.url, &dir, None, 0)).unwrap();
    // The check that the file is still the cached one fails once (503, one try).
    server.fault(Op::Head, "model.safetensors", hub::Fault::Status(503));
    let err = engine.forward(&PROMPT).err().unwrap().to_string();
    assert!(err.contains("503") && err.contains("not in the lazy cache yet"), "{err}");
    // Then the source answers again: the same engine serves the prompt.
    let got = engine.forward(&PROMPT).unwrap().into_vec();
    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
    let _ = std::fs::remove_dir_all(&dir);
}
