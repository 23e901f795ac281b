//! Kimi Linear (KDA + MLA hybrid, a recurrent state that cannot roll back)
//! through the engine, on both kimi_linear fixtures and both Kimi K3 ones
//! (the published wrapper layout: sharded, vision tensors to skip, MXFP4
//! latent experts, SiTU, attention residuals):
//! - streaming experts (direct from the checkpoint, packed on 1 and 2
//!   drives; every backend; a cache holding none, a few or all experts)
//!   gives logits and greedy ids bit-identical to experts in RAM;
//! - speculative decoding (n-gram, self-draft, a draft model) gives greedy
//!   ids identical to plain decoding, and seeded sampling is reproducible;
//! - prefix reuse (the scheduler's prefix cache) restores a snapshot (a follow-up turn,
//!   and one that diverges inside the previous answer) and reports the
//!   reused tokens, with ids identical to a fresh prefill;
//! - the scheduler: concurrent requests (greedy and seeded, one cancelled)
//!   each equal their solo run, also under a KV budget that forces
//!   preemption (the budget, snapshots included, holds after every step),
//!   the prefix cache hits through a snapshot, and a snapshot is kept only
//!   when it fits the budget.

use larder_engine::{
    DrafterChoice, Drafting, Engine, GenerateOptions, Job, Outcome, RequestEvent, SamplingParams, Scheduler, SchedulerConfig,
};

mod common;
mod scheduler_support;
use common::check_direct_and_packed;
use scheduler_support::{batched, check_against_alone, check_model, run_one, solo, spec, specs};

const FIXTURES: [&str; 4] = ["kimi_linear_tiny", "kimi_linear_mla_first", "kimi_k3_tiny", "kimi_k3_plain"];
const PROMPT: &[u32] = &[360, 386, 74, 15, 315, 217, 285, 254, 415, 327, 283];
/// The K3 fixtures' vocabulary is 256 ids, its specials from 250.
const K3_PROMPT: &[u32] = &[160, 186, 74, 15, 115, 217, 85, 54, 215, 127, 83];

/// The prompt fixture `name`'s vocabulary holds.
fn prompt_of(name: &str) -> &'static [u32] {
    match name.starts_with("kimi_k3") {
        true => K3_PROMPT,
        false => PROMPT,
    }
}

/// The scheduler's request mix, its prompt ids inside fixture `name`'s vocabulary.
fn specs_of(name: &str) -> Vec<scheduler_support::Spec> {
    let mut v = specs();
    if name.starts_with("kimi_k3") {
        for s in &mut v {
            s.prompt.iter_mut().for_each(|id| *id %= 250);
        }
    }
    v
}

fn fixture(name: &str) -> std::path::PathBuf {
    common::fixture(name)
}

fn greedy(max_new: usize) -> GenerateOptions {
    GenerateOptions {
        max_new,
        stop_at_eos: false,
        ..GenerateOptions::default()
    }
}

fn seeded(max_new: usize, seed: u64) -> GenerateOptions {
    GenerateOptions {
        sampling: SamplingParams {
            temperature: 0.9,
            seed,
            ..SamplingParams::default()
        },
        ..greedy(max_new)
    }
}

#[test]
fn streamed_experts_are_bit_identical_to_in_ram() {
    for name in FIXTURES {
        check_direct_and_packed(name, prompt_of(name), 2);
    }
}

/// Runs one request alone (through `Engine::run`), drafting as `drafting` says.
fn run(engine: &Engine, prompt: &[u32], o: &GenerateOptions, drafting: &Drafting) -> Outcome {
    let job = Job {
        prompt: prompt.to_vec(),
        options: o.clone(),
        drafter: drafting.drafter().unwrap(),
        ..Job::default()
    };
    engine.run(job, &mut |_: RequestEvent<'_>| true).unwrap()
}

#[test]
fn speculative_greedy_equals_plain_greedy() {
    for name in FIXTURES {
        let model = fixture(name);
        let engine = Engine::load(&model).unwrap();
        let o = greedy(24);
        let plain = engine.generate(prompt_of(name), &o, &mut |_| true).unwrap();
        for choice in [
            DrafterChoice::Ngram,
            DrafterChoice::SelfDraft,
            DrafterChoice::DraftModel { dir: model.clone() },
        ] {
            let drafting = engine.drafting(&choice).unwrap();
            let got = run(&engine, prompt_of(name), &o, &drafting);
            assert_eq!(got.ids, plain.ids, "{name} {choice:?}");
            let s = got.stats.speculative.as_ref().expect("speculative stats");
            assert!(s.target_steps > 0, "{name} {choice:?}: {s:?}");
            if !matches!(choice, DrafterChoice::Ngram) {
                assert!(s.accepted > 0, "{name} {choice:?}: the same model's drafts are kept: {s:?}");
            }
            // Seeded sampling through a drafter keeps working (the same
            // distribution; the ids depend on whether the adaptive length,
            // which is timed, switches drafting off, so they are not compared).
            let sampled = run(&engine, prompt_of(name), &seeded(16, 5), &drafting);
            assert_eq!(sampled.ids.len(), 16, "{name} {choice:?}: seeded sampling");
            assert!(sampled.ids.iter().all(|&t| t < 512), "{name} {choice:?}: ids in the vocabulary");
            assert!(sampled.stats.speculative.is_some(), "{name} {choice:?}");
        }
    }
}

#[test]
fn a_follow_up_turn_restores_a_snapshot_and_equals_a_fresh_prefill() {
    for name in FIXTURES {
        let engine = Engine::load(&fixture(name)).unwrap();
        for (temperature, seed) in [(0.0, 0), (0.9, 3)] {
            let mut sched = Scheduler::new(&engine, SchedulerConfig::default()).unwrap();
            let first = spec(prompt_of(name).to_vec(), 10, temperature, seed, 0);
            let out = run_one(&mut sched, &first, None);
            assert_eq!(out.ids.len(), 10, "{name}");
            let (p, end) = (prompt_of(name).len(), prompt_of(name).len() + 9);
            let s = &out.stats;
            assert!(s.state_fixed_bytes > 0 && s.state_bytes_per_position > 0, "{name}: {s:?}");
            assert_eq!(s.state_bytes, s.state_fixed_bytes + end * s.state_bytes_per_position, "{name}");
            assert!(s.snapshot_bytes > 0, "{name}: the snapshot at prompt - 1 is kept");

            // The next turn extends the whole conversation.
            let mut next = first.clone();
            next.prompt = prompt_of(name).iter().chain(&out.ids).chain(&[7, 99, 123]).copied().collect();
            let second = run_one(&mut sched, &next, None);
            assert_eq!(second.cached_tokens, end, "{name}: the whole conversation is reused");
            assert_eq!(second.ids, solo(&engine, &next).ids, "{name}: follow-up turn");

            // A turn diverging inside the first answer returns to the snapshot at prompt - 1.
            let mut edit = first.clone();
            edit.prompt = prompt_of(name).iter().chain(&out.ids[..4]).chain(&[42, 43]).copied().collect();
            let third = run_one(&mut sched, &edit, None);
            assert_eq!(
                third.cached_tokens,
                p - 1,
                "{name}: restored the snapshot before the last prompt token"
            );
            assert_eq!(third.ids, solo(&engine, &edit).ids, "{name}: diverging turn");
        }
    }
}

/// A budget for `positions` positions and `sequences` sequences (fixed state and one snapshot each).
fn budget(engine: &Engine, sequences: usize, positions: usize) -> usize {
    let sched = Scheduler::new(engine, SchedulerConfig::default()).unwrap();
    let fixed = sched.bytes_per_sequence();
    assert!(fixed > 0, "a recurrent model holds a fixed state");
    sequences * (fixed + fixed / 2) + positions * sched.bytes_per_token()
}

/// A budget for `sequences` fixed states and `positions` positions, with no
/// room for snapshots: MLA's compact cache makes a position so small that
/// snapshot room would hold every sequence's positions too.
fn tight_budget(engine: &Engine, sequences: usize, positions: usize) -> usize {
    let sched = Scheduler::new(engine, SchedulerConfig::default()).unwrap();
    sequences * sched.bytes_per_sequence() + positions * sched.bytes_per_token()
}

#[test]
fn concurrent_requests_each_equal_their_solo_run() {
    for name in FIXTURES {
        let engine = Engine::load(&fixture(name)).unwrap();
        check_model(&engine, name, &specs_of(name));
    }
}

#[test]
fn preemption_under_a_kv_budget_keeps_every_request_bit_identical() {
    for name in FIXTURES {
        let engine = Engine::load(&fixture(name)).unwrap();
        let mut specs = specs_of(name);
        specs[0].max_new = 20;
        specs[5].max_new = 18;
        let alone: Vec<Outcome> = specs.iter().map(|s| solo(&engine, s)).collect();
        let largest = specs.iter().map(|s| s.prompt.len() + s.max_new).max().unwrap();
        for (max_batch, chunk, sequences) in [(8, 4, 2), (4, 7, 3)] {
            let config = SchedulerConfig {
                max_batch,
                prefill_chunk: chunk,
                kv_budget: Some(tight_budget(&engine, sequences, largest + 4)),
                ..SchedulerConfig::default()
            };
            let arm = format!("{name} max_batch={max_batch} chunk={chunk} room for {sequences} sequences");
            let run = batched(&engine, &specs, config);
            assert!(run.preemptions > 0, "{arm}: no preemption");
            check_against_alone(&arm, &specs, &run.results, &alone);
        }
    }
}

#[test]
fn the_prefix_cache_hits_through_snapshots() {
    for name in FIXTURES {
        let engine = Engine::load(&fixture(name)).unwrap();
        let limit = Some(budget(&engine, 4, 200));
        let mut sched = Scheduler::new(
            &engine,
            SchedulerConfig {
                max_batch: 4,
                prefill_chunk: 5,
                kv_budget: limit,
                prefix_cache: 8,
            },
        )
        .unwrap();
        let first = spec(prompt_of(name).to_vec(), 8, 0.0, 0, 0);
        let out = run_one(&mut sched, &first, limit);
        assert_eq!(out.ids, solo(&engine, &first).ids, "{name}: first turn");
        assert_eq!(out.cached_tokens, 0);
        assert!(
            out.stats.state_fixed_bytes > 0 && out.stats.snapshot_bytes > 0,
            "{name}: {:?}",
            out.stats
        );

        // A follow-up turn takes the whole entry over.
        let mut next = first.clone();
        next.prompt = prompt_of(name).iter().chain(&out.ids).chain(&[5, 6]).copied().collect();
        let got = run_one(&mut sched, &next, limit);
        assert_eq!(
            got.cached_tokens,
            prompt_of(name).len() + out.ids.len() - 1,
            "{name}: follow-up reuses the entry"
        );
        assert_eq!(got.ids, solo(&engine, &next).ids, "{name}: follow-up turn");

        // The same prompt again, sampled: a copy restored to the snapshot at prompt - 1.
        let copies = sched.prefix_copies();
        let again = spec(prompt_of(name).to_vec(), 8, 0.8, 9, 0);
        let got = run_one(&mut sched, &again, limit);
        assert_eq!(
            got.cached_tokens,
            prompt_of(name).len() - 1,
            "{name}: the snapshot at prompt - 1 was restored"
        );
        assert_eq!(got.ids, solo(&engine, &again).ids, "{name}: same prompt, sampled");
        assert_eq!(sched.prefix_copies(), copies + 1, "{name}: a copy of the entry");
    }
}

#[test]
fn a_snapshot_is_kept_only_when_it_fits_the_budget() {
    for name in FIXTURES {
        let engine = Engine::load(&fixture(name)).unwrap();
        let s = spec(prompt_of(name).to_vec(), 6, 0.0, 0, 0);
        let alone = solo(&engine, &s).ids;
        let sched = Scheduler::new(&engine, SchedulerConfig::default()).unwrap();
        let (fixed, per) = (sched.bytes_per_sequence(), sched.bytes_per_token());
        drop(sched);
        let exact = fixed + (prompt_of(name).len() + 6) * per;
        for (budget, snapshot) in [(exact, false), (exact + fixed / 2, true)] {
            let config = SchedulerConfig {
                prefix_cache: 0,
                kv_budget: Some(budget),
                ..SchedulerConfig::default()
            };
            let mut sched = Scheduler::new(&engine, config).unwrap();
            let out = run_one(&mut sched, &s, Some(budget));
            assert_eq!(out.ids, alone, "{name} budget {budget}");
            assert_eq!(out.stats.snapshot_bytes > 0, snapshot, "{name} budget {budget}: {:?}", out.stats);
        }
    }
}
