//! What the lazy-mode tests share: load options for the loopback hub, the
//! prompt, what the server sent, which experts a run used, and the
//! bit-identity check against the checkpoint in RAM.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use crate::common::StreamOutcome;
use larder_engine::lazy::LazyLoad;
use larder_engine::Engine;
use larder_store::lazy::{LazyOptions, SourceCheck};
use larder_store::remote::{HubEnv, RemoteOptions, RetryPolicy};
use larder_store::{IoKind, IoOptions, StoreOptions};
use larder_testkit::hub::{HubServer, Op, REPO};

pub const PROMPT: [u32; 8] = [3, 1, 4, 1, 5, 9, 2, 6];

/// Lazy load options for the hub at `server` into `dir` (no prefetch, so
/// what is fetched is exactly what is used; a RAM cache for everything;
/// one try per request; the source asked again at once after a failure).
pub fn lazy_load(server_url: &str, dir: &Path, quota: Option<u64>, prefetch: usize, check: SourceCheck) -> LazyLoad {
    LazyLoad {
        source: REPO.to_string(),
        cache_dir: dir.to_path_buf(),
        lazy: LazyOptions {
            disk_quota: quota,
            io: io(),
            check: Some(check),
            retry_source_after: Duration::ZERO,
            ..LazyOptions::default()
        },
        store: StoreOptions {
            io: io(),
            ram_budget: u64::MAX,
            verify: true,
            prefetch_threads: prefetch,
        },
        remote: RemoteOptions {
            retry: RetryPolicy {
                attempts: 1,
                base_delay: Duration::from_millis(1),
                max_delay: Duration::from_millis(2),
            },
            connect_timeout: Duration::from_secs(2),
            read_timeout: Duration::from_secs(5),
            parallel: 4,
            deadline: None,
        },
        env: HubEnv {
            endpoint: Some(server_url.to_string()),
            token: None,
        },
        mla_cache: larder_model::MlaCache::default(),
    }
}

pub fn io() -> IoOptions {
    IoOptions {
        kind: IoKind::Pread,
        direct: false,
        depth: 4,
    }
}

pub fn load(l: &LazyLoad) -> Result<Engine, String> {
    Engine::load_lazy(l, None, &|_| {}).map_err(|e| e.to_string())
}

/// Body bytes the server sent for data GETs since the log was cleared.
pub fn sent(server: &HubServer) -> usize {
    server.log().iter().filter(|s| s.op == Op::Get).map(|s| s.body_bytes).sum()
}

/// The experts an engine's store read, and their payload bytes.
pub fn used(engine: &Engine) -> (BTreeSet<(usize, usize)>, u64) {
    let store = engine.store().unwrap();
    let keys: BTreeSet<_> = store.cache().keys().into_iter().collect();
    let bytes = keys.iter().map(|&(l, e)| store.index().get(l, e).unwrap().payload_len()).sum();
    (keys, bytes)
}

pub fn assert_same(got: &StreamOutcome, want: &StreamOutcome, label: &str) {
    assert!(
        got.logits.len() == want.logits.len() && got.logits.iter().zip(&want.logits).all(|(a, b)| a.to_bits() == b.to_bits()),
        "{label}: logits differ from the checkpoint's in RAM"
    );
    assert_eq!(got.greedy, want.greedy, "{label}: greedy ids");
}

/// A layer file of the cache in `dir` (the first its drive folder lists).
pub fn first_layer_file(dir: &Path) -> std::path::PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir() && p.file_name().unwrap().to_string_lossy().starts_with("larder-"))
        .and_then(|d| std::fs::read_dir(d).unwrap().map(|e| e.unwrap().path()).next())
        .unwrap()
}
