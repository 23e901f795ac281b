//! Read-once prefill: a prompt runs in one pass (layer-major, one MoE step
//! per layer over the union of its rows' experts), so a streamed expert is
//! read exactly once per prompt even when the RAM cache holds only a few,
//! and no prefetch guesses are read during prefill. Fixed small chunks read
//! experts again; the tokens are identical either way.

mod common;
use std::collections::BTreeSet;

use common::{expert_bytes, fixture};
use larder_engine::{Engine, ExpertMode, GenerateOptions, LoadOptions, PrefillChunk};
use larder_model::RouteTrace;
use larder_store::{IoKind, IoOptions, StoreOptions, StoreStats};

/// Streamed through pread with a cache of three experts and prefetch threads on.
fn streamed(budget: u64) -> LoadOptions {
    LoadOptions {
        experts: ExpertMode::Stream(StoreOptions {
            io: IoOptions {
                kind: IoKind::Pread,
                direct: false,
                depth: 4,
            },
            ram_budget: budget,
            verify: true,
            prefetch_threads: 2,
        }),
        ..Default::default()
    }
}

/// Greedy ids, the store's counters at the first token (the end of
/// prefill), and the bytes of the distinct experts the prompt routed to.
fn prefill(engine: &Engine, prompt: &[u32]) -> (Vec<u32>, StoreStats, u64) {
    let store = engine.store().expect("streamed").clone();
    let mut at_first: Option<StoreStats> = None;
    let mut trace = RouteTrace::default();
    let opts = GenerateOptions {
        max_new: 4,
        stop_at_eos: false,
        ..GenerateOptions::default()
    };
    let g = engine
        .generate_traced(
            prompt,
            &opts,
            &mut |_| {
                at_first.get_or_insert_with(|| store.stats());
                true
            },
            Some(&mut trace),
        )
        .unwrap();
    let mut distinct = BTreeSet::new();
    for (&l, routes) in &trace.layers {
        for r in &routes[..prompt.len()] {
            distinct.extend(r.experts.iter().map(|&e| (l, e)));
        }
    }
    let index = store.index();
    let bytes = distinct.iter().map(|&(l, e)| index.get(l, e).unwrap().payload_len()).sum();
    (g.ids, at_first.unwrap(), bytes)
}

#[test]
fn a_prompt_reads_each_routed_expert_once() {
    for name in [
        "deepseek_v3_tiny",
        "qwen3_moe_tiny",
        "kimi_linear_tiny",
        "gpt_oss_tiny",
        "deepseek_v3_mxfp4",
    ] {
        let model = fixture(name);
        let vocab = larder_model::arch::read_spec(&model).unwrap().vocab_size as u32;
        let prompt: Vec<u32> = (0..48u32).map(|i| (i * 7919 + 13) % vocab).collect();
        let budget = 3 * expert_bytes(&model);

        let engine = Engine::load_with(&model, &streamed(budget)).unwrap();
        assert!(
            engine.prefill_rows() >= prompt.len(),
            "{name}: the default runs this prompt in one pass"
        );
        let (ids, stats, distinct) = prefill(&engine, &prompt);
        assert_eq!(stats.bytes_read, distinct, "{name}: read amplification must be exactly 1");
        assert_eq!(stats.prefetch_reads, 0, "{name}: no prefetch guesses during prefill");

        let mut chunked = Engine::load_with(&model, &streamed(budget)).unwrap();
        chunked.set_prefill(PrefillChunk::Rows(5));
        let (chunked_ids, chunked_stats, chunked_distinct) = prefill(&chunked, &prompt);
        assert_eq!(chunked_ids, ids, "{name}: chunking must not change the tokens");
        assert_eq!(chunked_distinct, distinct, "{name}: same routes");
        assert!(chunked_stats.bytes_read > distinct, "{name}: small chunks read experts again");

        let in_ram = Engine::load(&model).unwrap();
        let g = in_ram
            .generate(
                &prompt,
                &GenerateOptions {
                    max_new: 4,
                    stop_at_eos: false,
                    ..GenerateOptions::default()
                },
                &mut |_| true,
            )
            .unwrap();
        assert_eq!(g.ids, ids, "{name}: streamed and in RAM agree");
    }
}

/// Kimi Linear keeps a return point before the prompt's last token (its
/// KDA state cannot roll back, and a later request sharing the prompt
/// returns there); it is taken inside the prefill pass, so the last token
/// needs no pass of its own and the prompt's experts are still read once.
#[test]
fn a_return_point_is_kept_without_a_second_read() {
    use larder_engine::{Job, RequestEvent};
    let model = fixture("kimi_linear_tiny");
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 31 + 5) % 100).collect();
    let budget = 3 * expert_bytes(&model);
    let (ids, _, distinct) = prefill(&Engine::load_with(&model, &streamed(budget)).unwrap(), &prompt);

    let engine = Engine::load_with(&model, &streamed(budget)).unwrap();
    let store = engine.store().unwrap().clone();
    let job = Job {
        prompt: prompt.clone(),
        options: GenerateOptions {
            max_new: 4,
            stop_at_eos: false,
            ..GenerateOptions::default()
        },
        ..Job::default()
    };
    let mut at_first = None;
    let mut sink = |e: RequestEvent<'_>| {
        if let RequestEvent::Token { .. } = e {
            at_first.get_or_insert_with(|| store.stats());
        }
        true
    };
    let out = engine.run(job, &mut sink).unwrap();
    assert_eq!(out.ids, ids);
    assert!(out.stats.snapshot_bytes > 0, "the return point was kept: {:?}", out.stats);
    assert_eq!(at_first.unwrap().bytes_read, distinct, "read amplification must be exactly 1");
}
