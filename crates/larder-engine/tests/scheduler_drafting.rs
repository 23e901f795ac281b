//! Drafting requests through the scheduler (speculative decoding's
//! verification passes are rows of the batched step) give exactly what the
//! solo drafting path gave before there was one generation path:
//! `scheduler_drafting_goldens.json` holds the ids `Conversation::run`
//! produced (commit 44925fa) for n-gram, self-draft and draft-model
//! drafters, greedy and seeded, on qwen3_moe_tiny, deepseek_v3_tiny (MLA)
//! and kimi_linear_tiny (KDA: rejected drafts rewound by restoring a
//! snapshot and running the kept tokens again). Each request alone, and
//! all of them batched 3 and 4 together (staggered arrivals, mixed
//! drafters and plain requests, and under a KV budget that preempts
//! drafting sequences), give those ids.
//!
//! Greedy ids never depend on drafting. A sampled request's ids depend on
//! how many drafts it verifies; the draft length adapts to acceptance
//! (deterministic), but drafting is switched off for a request when it
//! stops paying, which is timed: a sampled case is compared only when
//! drafting stayed on in both runs (`stats.speculative.disabled`).

use std::path::Path;

use larder_engine::{DrafterChoice, Drafting, Engine, FinishReason, Outcome, SchedulerConfig};
use serde_json::Value;

mod scheduler_support;
use scheduler_support::{batched, fixture, solo, spec, Spec};

const PROMPTS: [&[u32]; 3] = [
    &[262, 406, 39, 423, 313, 87, 465],
    &[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 9, 10, 5, 6],
    &[360, 386, 74, 15, 315, 217, 285, 254, 415, 327, 283],
];

/// One recorded solo run.
struct Golden {
    drafter: String,
    prompt: usize,
    temperature: f32,
    seed: u64,
    ids: Vec<u32>,
    finish_reason: String,
    disabled: bool,
}

fn goldens(model: &str) -> Vec<Golden> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scheduler_drafting_goldens.json");
    let all: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    all.iter()
        .filter(|g| g["model"] == model)
        .map(|g| Golden {
            drafter: g["drafter"].as_str().unwrap().to_string(),
            prompt: g["prompt"].as_u64().unwrap() as usize,
            temperature: g["temperature"].as_f64().unwrap() as f32,
            seed: g["seed"].as_u64().unwrap(),
            ids: g["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect(),
            finish_reason: g["finish_reason"].as_str().unwrap().to_string(),
            disabled: g["disabled"].as_bool().unwrap(),
        })
        .collect()
}

/// The drafters of the goldens, resolved for `engine` (kimi_linear drafts
/// with a copy of itself, the others with mixtral_tiny).
fn drafting(engine: &Engine, model: &str, drafter: &str) -> Drafting {
    let choice = match drafter {
        "ngram" => DrafterChoice::Ngram,
        "self" => DrafterChoice::SelfDraft,
        _ => DrafterChoice::DraftModel {
            dir: fixture(if model.starts_with("kimi") { model } else { "mixtral_tiny" }),
        },
    };
    engine.drafting(&choice).unwrap()
}

/// The scenario: every golden case as a request (arriving over the first
/// steps), and a plain request between every two.
fn scenario(engine: &Engine, model: &str, goldens: &[Golden]) -> Vec<Spec> {
    let mut specs = Vec::new();
    for (i, g) in goldens.iter().enumerate() {
        let mut s = spec(PROMPTS[g.prompt].to_vec(), 24, g.temperature, g.seed, i % 7);
        s.drafting = Some(drafting(engine, model, &g.drafter));
        specs.push(s);
        if i % 2 == 1 {
            specs.push(spec(PROMPTS[(i / 2) % 3].to_vec(), 9, 0.7, i as u64, i % 5));
        }
    }
    specs
}

/// Whether `got` is what `want` (a run of the same request) gave: the same
/// ids, unless sampled with drafting switched off in either run.
fn same_run(got: &Outcome, want_ids: &[u32], want_disabled: bool, greedy: bool) -> bool {
    let disabled = got.stats.speculative.as_ref().is_some_and(|s| s.disabled);
    !greedy && (disabled || want_disabled) || got.ids == want_ids
}

fn reason(r: FinishReason) -> String {
    serde_json::to_value(r).unwrap().as_str().unwrap().to_string()
}

#[test]
fn drafting_through_the_scheduler_gives_the_solo_drafting_paths_ids() {
    for model in ["qwen3_moe_tiny", "deepseek_v3_tiny", "kimi_linear_tiny"] {
        let engine = Engine::load(&fixture(model)).unwrap();
        let goldens = goldens(model);
        assert_eq!(goldens.len(), 27, "{model}: every drafter, prompt and sampling");
        let specs = scenario(&engine, model, &goldens);
        let drafting_specs: Vec<&Spec> = specs.iter().filter(|s| s.drafting.is_some()).collect();

        // Alone.
        let alone: Vec<Outcome> = specs.iter().map(|s| solo(&engine, s)).collect();
        let alone_drafting: Vec<&Outcome> = specs
            .iter()
            .zip(&alone)
            .filter(|(s, _)| s.drafting.is_some())
            .map(|(_, o)| o)
            .collect();
        let mut compared = 0;
        for (i, (g, got)) in goldens.iter().zip(&alone_drafting).enumerate() {
            let greedy = g.temperature == 0.0;
            assert!(
                same_run(got, &g.ids, g.disabled, greedy),
                "{model} case {i} ({}) alone: {:?} vs {:?}",
                g.drafter,
                got.ids,
                g.ids
            );
            if got.ids == g.ids {
                assert_eq!(reason(got.finish_reason), g.finish_reason, "{model} case {i}");
                compared += 1;
            }
            assert_eq!(got.stats.speculative.as_ref().map(|s| s.drafter.as_str()), Some(g.drafter.as_str()));
        }
        eprintln!("{model}: {compared} of {} cases compared with the goldens", goldens.len());
        assert!(compared >= 12, "{model}: only {compared} cases compared");
        assert_eq!(drafting_specs.len(), goldens.len());

        // Batched 4 and 3 together, and under a KV budget that preempts.
        let per = larder_engine::KvCosts::of(&engine);
        let largest = specs.iter().map(|s| s.prompt.len() + s.max_new).max().unwrap();
        let tight = 2 * per.bytes_per_sequence + 2 * (largest + 4) * per.bytes_per_token;
        for (max_batch, prefill_chunk, kv_budget) in [(4, 5, None), (3, 256, None), (4, 7, Some(tight))] {
            let config = SchedulerConfig {
                max_batch,
                prefill_chunk,
                kv_budget,
                ..SchedulerConfig::default()
            };
            let run = batched(&engine, &specs, config);
            let arm = format!("{model} max_batch={max_batch} chunk={prefill_chunk} budget={kv_budget:?}");
            if kv_budget.is_some() {
                assert!(run.preemptions > 0, "{arm}: no preemption");
            }
            for (i, ((s, (got, _)), a)) in specs.iter().zip(&run.results).zip(&alone).enumerate() {
                let greedy = s.temperature == 0.0;
                let alone_disabled = a.stats.speculative.as_ref().is_some_and(|d| d.disabled);
                assert!(
                    same_run(got, &a.ids, alone_disabled, greedy),
                    "{arm} request {i}: {:?} vs alone {:?}",
                    got.ids,
                    a.ids
                );
                if got.ids == a.ids {
                    assert_eq!(got.finish_reason, a.finish_reason, "{arm} request {i}");
                    assert_eq!(got.text, a.text, "{arm} request {i}");
                }
            }
        }
    }
}
