//! `--ram-budget auto` resizes the expert cache while the engine runs
//! (larder_engine::MemoryWatch). Which experts are cached changes when bytes
//! arrive, never what is computed: generation while the budget swings
//! between one expert and the whole bank, and while a watcher fed a falling
//! then recovering memory figure shrinks and regrows it, gives the in-RAM ids.

mod common;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{expert_bytes, fixture};
use larder_engine::{Engine, ExpertMode, GenerateOptions, LoadOptions, MemoryWatch, WatchConfig};

/// Streamed through pread with prefetch on (its reads race the resizes too).
fn streamed(budget: u64) -> LoadOptions {
    let mut opts = common::pread_streaming(4, budget, true);
    if let ExpertMode::Stream(o) = &mut opts.experts {
        o.prefetch_threads = 2;
    }
    opts
}

fn ids(engine: &Engine, prompt: &[u32]) -> Vec<u32> {
    let opts = GenerateOptions {
        max_new: 24,
        stop_at_eos: false,
        ..GenerateOptions::default()
    };
    engine.generate(prompt, &opts, &mut |_| true).unwrap().ids
}

#[test]
fn output_is_the_same_while_the_budget_changes() {
    let prompt = [1u32, 200, 31, 7, 9, 4, 77, 12];
    for name in ["qwen3_moe_tiny", "deepseek_v3_tiny", "kimi_linear_tiny", "gpt_oss_tiny"] {
        let model = fixture(name);
        let reference = ids(&Engine::load(&model).unwrap(), &prompt);
        let engine = Engine::load_with(&model, &streamed(1 << 30)).unwrap();
        let store = engine.store().unwrap().clone();
        let bank = store.index().total_bytes();
        assert!(bank >= expert_bytes(&model));
        let one = store.index().layers.iter().flatten().map(|l| l.payload_len()).max().unwrap();
        store.cache().set_budget(bank);
        // Swing the budget between one expert and the whole bank as fast as it goes.
        let stop = Arc::new(AtomicBool::new(false));
        let swinger = {
            let (stop, store) = (stop.clone(), store.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    store.cache().set_budget(if i.is_multiple_of(2) { one } else { bank });
                    i += 1;
                    std::thread::yield_now();
                }
            })
        };
        let swung = ids(&engine, &prompt);
        stop.store(true, Ordering::Relaxed);
        swinger.join().unwrap();
        assert_eq!(swung, reference, "{name}: budget swings changed the output");

        // A watcher: memory falls far under the headroom, then recovers.
        let memory = Arc::new(AtomicU64::new(0));
        let source = memory.clone();
        let config = WatchConfig {
            ceiling: bank,
            floor: one,
            headroom: bank,
            period: Duration::from_millis(1),
        };
        let watch = MemoryWatch::start_with(&store, config, Box::new(move || Some(source.load(Ordering::Relaxed))));
        let settle = |want: u64| {
            for _ in 0..2000 {
                if store.cache().budget() == want {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            store.cache().budget()
        };
        let low = settle(one);
        let squeezed = ids(&engine, &prompt);
        memory.store(10 * bank, Ordering::Relaxed);
        let high = settle(bank);
        drop(watch);
        assert_eq!(squeezed, reference, "{name}: a squeezed cache changed the output");
        assert_eq!(low, one, "{name}: the watcher shrinks to the floor");
        assert_eq!(high, bank, "{name}: and grows back to the ceiling");
        assert!(store.cache().counts().used_bytes <= bank);
    }
}
