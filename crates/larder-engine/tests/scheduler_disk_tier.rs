//! The scheduler's disk tier across a restart: a conversation's first turn
//! runs, the engine and scheduler are dropped, a new engine and scheduler
//! open the same folder, and the second turn reuses the saved state (the
//! reused count in its stats and the disk tier's hit counter say so) with
//! output identical to a fresh prefill, on GQA, MLA and Kimi Linear (KDA)
//! fixtures. A corrupt file is not used (the turn prefills, output unchanged).

use larder_engine::{DiskTierConfig, Engine, Outcome, Scheduler, SchedulerConfig};

mod scheduler_support;
use scheduler_support::*;

fn next_turn(turn: &Spec, reply: &Outcome, user: &[u32]) -> Spec {
    let mut next = turn.clone();
    next.prompt = turn.prompt.iter().chain(&reply.ids).chain(user).copied().collect();
    next
}

fn scheduler<'e>(engine: &'e Engine, dir: &std::path::Path) -> Scheduler<'e> {
    let config = SchedulerConfig {
        max_batch: 4,
        prefill_chunk: 5,
        kv_budget: Some(64 << 20),
        prefix_cache: 8,
    };
    let mut sched = Scheduler::new(engine, config).unwrap();
    sched
        .attach_disk_tier(DiskTierConfig {
            dir: dir.to_path_buf(),
            quota: 1 << 30,
        })
        .unwrap();
    sched
}

#[test]
fn a_second_turn_after_a_restart_reuses_the_saved_state() {
    for name in ["qwen3_moe_tiny", "deepseek_v3_tiny", "kimi_linear_tiny"] {
        let dir = std::env::temp_dir().join(format!("larder-disk-restart-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let t1 = spec(prompt(9, 1), 6, 0.8, 5, 0);
        let t1_out = {
            let engine = Engine::load(&fixture(name)).unwrap();
            let mut sched = scheduler(&engine, &dir);
            let out = run_one(&mut sched, &t1, None);
            let d = sched.disk_stats().unwrap();
            assert_eq!((d.files, d.hits, d.misses), (1, 0, 1), "{name}: saved, nothing to load yet");
            assert!(d.bytes_written > 0 && d.bytes_on_disk == d.bytes_written, "{name}: {d:?}");
            out
        };
        let t2 = next_turn(&t1, &t1_out, &prompt(4, 2));
        let engine = Engine::load(&fixture(name)).unwrap();
        let mut sched = scheduler(&engine, &dir);
        let t2_out = run_one(&mut sched, &t2, None);
        let fed = t1.prompt.len() + t1_out.ids.len() - 1;
        assert_eq!(t2_out.cached_tokens, fed, "{name}: the first turn's state came from disk");
        let d = sched.disk_stats().unwrap();
        assert_eq!((d.hits, d.misses, d.bad_files), (1, 0, 0), "{name}: {d:?}");
        assert!(d.bytes_read > 0 && d.load_s > 0.0, "{name}: {d:?}");
        let fresh = solo(&engine, &t2);
        assert_eq!((t2_out.ids, t2_out.text), (fresh.ids, fresh.text), "{name}: reloaded vs fresh");
        drop(sched);

        // Corrupt every file: a restart uses none of them and the output is unchanged.
        for f in std::fs::read_dir(&dir).unwrap() {
            let path = f.unwrap().path();
            let mut b = std::fs::read(&path).unwrap();
            let at = b.len() / 2;
            b[at] ^= 0x10;
            std::fs::write(&path, b).unwrap();
        }
        let mut sched = scheduler(&engine, &dir);
        let again = run_one(&mut sched, &t2, None);
        let warnings = sched.take_disk_warnings();
        assert!(
            !warnings.is_empty() && warnings.iter().all(|w| w.contains("state file")),
            "{name}: {warnings:?}"
        );
        assert_eq!((again.cached_tokens, &again.ids), (0, &solo(&engine, &t2).ids), "{name}: prefilled");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A copy of fixture `name` in `dir`, with one weight byte of
/// model.safetensors changed when `tweak` (same config, same header).
fn copy_fixture(name: &str, dir: &std::path::Path, tweak: bool) {
    std::fs::create_dir_all(dir).unwrap();
    for f in std::fs::read_dir(fixture(name)).unwrap() {
        let f = f.unwrap().path();
        if f.is_file() {
            std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
        }
    }
    if tweak {
        let path = dir.join("model.safetensors");
        let mut b = std::fs::read(&path).unwrap();
        let last = b.len() - 1;
        b[last] ^= 0x01;
        std::fs::write(&path, b).unwrap();
    }
}

#[test]
fn another_checkpoint_with_the_same_config_and_headers_never_reuses_the_state() {
    let root = std::env::temp_dir().join(format!("larder-disk-two-finetunes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let (a, b, states) = (root.join("a"), root.join("b"), root.join("states"));
    copy_fixture("qwen3_moe_tiny", &a, false);
    copy_fixture("qwen3_moe_tiny", &b, true);
    let t1 = spec(prompt(9, 1), 6, 0.0, 5, 0);
    let t1_out = {
        let engine = Engine::load(&a).unwrap();
        let mut sched = scheduler(&engine, &states);
        run_one(&mut sched, &t1, None)
    };
    let t2 = next_turn(&t1, &t1_out, &prompt(4, 2));
    // The same weights reuse it (the content digests come from the cache now).
    {
        let engine = Engine::load(&a).unwrap();
        let mut sched = scheduler(&engine, &states);
        assert!(
            run_one(&mut sched, &t2, None).cached_tokens > 0,
            "the same checkpoint reuses its state"
        );
    }
    let engine = Engine::load(&b).unwrap();
    let mut sched = scheduler(&engine, &states);
    let got = run_one(&mut sched, &t2, None);
    let d = sched.disk_stats().unwrap();
    assert_eq!(
        (got.cached_tokens, d.hits),
        (0, 0),
        "another checkpoint's state must not be used: {d:?}"
    );
    assert_eq!(got.ids, solo(&engine, &t2).ids);
    drop(sched);
    let _ = std::fs::remove_dir_all(&root);
}
