//! Speculative decoding produces exactly what plain decoding produces:
//! greedy ids identical for every drafter on the architecture fixtures,
//! through every acceptance edge case (all kept, none kept, EOS inside a
//! draft, max-new inside a draft); sampled output has the target's
//! distribution. Drafting requests run through the scheduler like any
//! other (`Engine::run` with a `Job`'s drafter); batched together they give
//! what they give alone (`scheduler_drafting.rs`).

use std::sync::Arc;

use larder_engine::{Engine, GenerateOptions, Job, Outcome, RequestEvent, SamplingParams};
use larder_model::load_model;
use larder_spec::{Drafter, ModelDrafter, NgramDrafter, SpecError};

mod common;
use common::{fixture, pread_streaming};

fn opts(max_new: usize) -> GenerateOptions {
    GenerateOptions {
        max_new,
        stop_at_eos: true,
        ..GenerateOptions::default()
    }
}

/// Which script positions a [`Scripted`] drafter gets wrong.
type WrongAt = fn(usize) -> bool;

/// A drafter that proposes a fixed script: the continuation it was given
/// (from `from` on), with `wrong` tokens replaced by something else.
struct Scripted {
    script: Vec<u32>,
    prompt_len: usize,
    wrong: WrongAt,
}

impl Drafter for Scripted {
    fn name(&self) -> &'static str {
        "scripted"
    }

    fn propose(&mut self, context: &[u32], k: usize) -> Result<Vec<u32>, SpecError> {
        let at = context.len() - self.prompt_len;
        Ok((at..at + k)
            .filter_map(|i| self.script.get(i).map(|&t| if (self.wrong)(i) { (t + 1) % 500 } else { t }))
            .collect())
    }
}

const PROMPT: &[u32] = &[262, 406, 39, 423, 313, 87, 465];

/// `PROMPT` generated with `drafter` (through `Engine::run`); `on_token`
/// sees each new id and returns `false` to cancel.
fn drafted(engine: &Engine, o: &GenerateOptions, drafter: Box<dyn Drafter>, on_token: &mut dyn FnMut(u32) -> bool) -> Outcome {
    let job = Job {
        prompt: PROMPT.to_vec(),
        options: o.clone(),
        drafter: Some(drafter),
        ..Job::default()
    };
    let mut sink = |e: RequestEvent<'_>| match e {
        RequestEvent::Token { id, .. } => on_token(id),
        _ => true,
    };
    engine.run(job, &mut sink).unwrap()
}

#[test]
fn greedy_output_is_identical_for_every_drafter() {
    let draft = Arc::new(load_model(&fixture("mixtral_tiny"), None).unwrap());
    for name in [
        "qwen3_moe_tiny",
        "qwen2_moe_tiny",
        "deepseek_v3_tiny",
        "llama_tiny",
        "kimi_k2_tiny",
        // compressed-tensors 4-bit experts.
        "deepseek_v3_int4",
        "deepseek_v3_mxfp4",
        // gpt-oss, MXFP4 experts (sinks, sliding window).
        "gpt_oss_tiny",
    ] {
        let engine = Engine::load(&fixture(name)).unwrap();
        let o = opts(40);
        let plain = engine.generate(PROMPT, &o, &mut |_| true).unwrap();
        let drafters: Vec<Box<dyn Drafter>> = vec![
            Box::new(NgramDrafter::default()),
            Box::new(ModelDrafter::new(draft.clone(), 512).unwrap()),
            Box::new(ModelDrafter::self_draft(engine.shared_model())),
        ];
        for d in drafters {
            let drafter = d.name();
            let got = drafted(&engine, &o, d, &mut |_| true);
            assert_eq!(got.ids, plain.ids, "{name} with {drafter}");
            assert_eq!(got.finish_reason, plain.finish_reason, "{name} with {drafter}");
            let s = got.stats.speculative.unwrap();
            assert_eq!(s.drafter, drafter);
            if drafter == "self" {
                // Every expert is in RAM: the self-draft is the model itself.
                assert!(s.acceptance_rate > 0.9, "{name}: {s:?}");
            }
        }
    }
}

#[test]
fn self_draft_over_a_small_expert_cache_keeps_the_output_exact() {
    for name in ["qwen3_moe_tiny", "deepseek_v3_tiny"] {
        let in_ram = Engine::load(&fixture(name)).unwrap();
        let plain = in_ram.generate(PROMPT, &opts(24), &mut |_| true).unwrap();
        for budget in [0u64, 40_000, 200_000] {
            let streamed = Engine::load_with(&fixture(name), &pread_streaming(2, budget, true)).unwrap();
            let d = Box::new(ModelDrafter::self_draft(streamed.shared_model()));
            let got = drafted(&streamed, &opts(24), d, &mut |_| true);
            assert_eq!(got.ids, plain.ids, "{name} budget {budget}");
        }
    }
}

#[test]
fn acceptance_edge_cases_keep_the_output_exact() {
    // qwen2_moe_tiny's greedy continuation ends with EOS inside generation.
    for name in ["qwen3_moe_tiny", "qwen2_moe_tiny"] {
        let engine = Engine::load(&fixture(name)).unwrap();
        for max_new in [1, 2, 5, 8, 40] {
            let o = opts(max_new);
            let plain = engine.generate(PROMPT, &o, &mut |_| true).unwrap();
            // A long script: drafts run past EOS and past max_new.
            let mut script = plain.ids.clone();
            script.extend([7, 8, 9, 10, 11, 12, 13, 14]);
            let cases: [(&str, WrongAt); 3] = [
                ("all kept", |_| false),
                ("none kept", |_| true),
                ("every third wrong", |i| i % 3 == 2),
            ];
            for (label, wrong) in cases {
                let d = Box::new(Scripted {
                    script: script.clone(),
                    prompt_len: PROMPT.len(),
                    wrong,
                });
                let got = drafted(&engine, &o, d, &mut |_| true);
                assert_eq!(got.ids, plain.ids, "{name} max_new {max_new}: {label}");
                assert_eq!(got.finish_reason, plain.finish_reason, "{name} max_new {max_new}: {label}");
                let s = got.stats.speculative.unwrap();
                if label == "none kept" {
                    assert_eq!(s.accepted, 0);
                }
                if label == "all kept" && max_new > 2 {
                    assert!(s.accepted > 0 && s.acceptance_rate > 0.5, "{name}: {s:?}");
                    assert!(s.target_steps < max_new as u64, "fewer target passes than tokens: {s:?}");
                }
            }
        }
    }
}

#[test]
fn cancellation_inside_a_draft_stops_at_once() {
    let engine = Engine::load(&fixture("qwen3_moe_tiny")).unwrap();
    let plain = engine.generate(PROMPT, &opts(20), &mut |_| true).unwrap();
    let d = Box::new(Scripted {
        script: plain.ids.clone(),
        prompt_len: PROMPT.len(),
        wrong: |_| false,
    });
    let mut n = 0;
    let got = drafted(&engine, &opts(20), d, &mut |_| {
        n += 1;
        n < 4
    });
    assert_eq!(got.ids, plain.ids[..4].to_vec());
    assert_eq!(got.finish_reason, larder_engine::FinishReason::Cancelled);
}

#[test]
fn speculative_sampling_preserves_the_distribution() {
    // The first two tokens of many seeded samples: plain sampling vs. speculative
    // sampling with a drafter that always guesses the plain greedy path (so
    // both acceptance and rejection happen). Total variation must be small.
    let engine = Engine::load(&fixture("qwen3_moe_tiny")).unwrap();
    let greedy = engine.generate(PROMPT, &opts(3), &mut |_| true).unwrap().ids;
    let n = 3000;
    let sample = |spec: bool, seed: u64| {
        let o = GenerateOptions {
            max_new: 2,
            stop_at_eos: false,
            sampling: SamplingParams {
                temperature: 0.8,
                top_p: 1.0,
                top_k: 4,
                seed,
            },
            ..GenerateOptions::default()
        };
        if spec {
            let d = Box::new(Scripted {
                script: greedy.clone(),
                prompt_len: PROMPT.len(),
                wrong: |_| false,
            });
            drafted(&engine, &o, d, &mut |_| true).ids
        } else {
            engine.generate(PROMPT, &o, &mut |_| true).unwrap().ids
        }
    };
    let mut plain = std::collections::HashMap::new();
    let mut spec = std::collections::HashMap::new();
    for seed in 0..n {
        *plain.entry(sample(false, seed)).or_insert(0usize) += 1;
        *spec.entry(sample(true, 10_000 + seed)).or_insert(0usize) += 1;
    }
    let keys: std::collections::HashSet<_> = plain.keys().chain(spec.keys()).cloned().collect();
    let tv: f64 = keys
        .iter()
        .map(|k| (*plain.get(k).unwrap_or(&0) as f64 - *spec.get(k).unwrap_or(&0) as f64).abs() / n as f64)
        .sum::<f64>()
        / 2.0;
    eprintln!("total variation {tv} over {} outcomes", keys.len());
    assert!(
        tv < 0.08,
        "total variation {tv} between plain and speculative sampling ({} outcomes)",
        keys.len()
    );
    // Reproducible per seed.
    assert_eq!(sample(true, 5), sample(true, 5));
}
