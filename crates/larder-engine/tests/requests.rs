//! A request through the one generation path (`Engine::run`, and a
//! scheduler's prefix cache for follow-up turns): ids equal
//! `Engine::generate`'s (greedy also with drafters), a request sharing a
//! prefix with a finished one reuses its state and gives bit-identical
//! output to a fresh run, stop strings spanning several tokens cut the text
//! and the ids where they complete, cancellation stops at once, and the
//! context check refuses what cannot fit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use larder_engine::{
    DrafterChoice, Drafting, Engine, EngineError, FinishReason, GenerateOptions, Job, Outcome, RequestEvent, RequestSink, SamplingParams,
    Scheduler, SchedulerConfig, StreamDecoder,
};

mod common;
use common::fixture;

const PROMPT: &[u32] = &[262, 406, 39, 423, 313, 87, 465];

fn opts(max_new: usize, temperature: f32) -> GenerateOptions {
    GenerateOptions {
        max_new,
        sampling: SamplingParams {
            temperature,
            seed: 11,
            ..SamplingParams::default()
        },
        ..GenerateOptions::default()
    }
}

fn job(prompt: &[u32], o: &GenerateOptions, stop: &[String], drafting: &Drafting) -> Job {
    Job {
        prompt: prompt.to_vec(),
        options: o.clone(),
        stop: stop.to_vec(),
        drafter: drafting.drafter().unwrap(),
        ..Job::default()
    }
}

/// Runs one request alone, collecting every streamed piece of text.
fn run(engine: &Engine, prompt: &[u32], o: &GenerateOptions, stop: &[String], drafting: &Drafting) -> (Outcome, String) {
    let mut streamed = String::new();
    let mut finished = 0;
    let mut sink = |e: RequestEvent<'_>| {
        match e {
            RequestEvent::Token { text, .. } | RequestEvent::Text(text) => streamed.push_str(text),
            RequestEvent::Finished(_) => finished += 1,
        }
        true
    };
    let out = engine.run(job(prompt, o, stop, drafting), &mut sink).unwrap();
    assert_eq!(finished, 1, "one Finished event, last");
    (out, streamed)
}

/// Runs one request through `sched` (whose prefix cache keeps finished ones).
fn turn(sched: &mut Scheduler<'_>, prompt: &[u32], o: &GenerateOptions) -> Outcome {
    let out = Arc::new(std::sync::Mutex::new(None));
    let got = out.clone();
    let sink = move |e: RequestEvent<'_>| {
        if let RequestEvent::Finished(o) = e {
            *got.lock().unwrap() = Some(o.clone());
        }
        true
    };
    sched.submit(job(prompt, o, &[], &Drafting::off()), Box::new(sink)).unwrap();
    while !sched.is_idle() {
        assert!(sched.step().failed.is_empty());
    }
    let done = out.lock().unwrap().take().expect("finished");
    done
}

#[test]
fn requests_equal_generate_with_and_without_drafters() {
    for name in ["qwen3_moe_tiny", "deepseek_v3_tiny"] {
        let engine = Engine::load(&fixture(name)).unwrap();
        for temperature in [0.0, 0.8] {
            let o = opts(24, temperature);
            let plain = engine.generate(PROMPT, &o, &mut |_| true).unwrap();
            // Sampled output through a drafter has the same distribution, not the same ids: greedy only.
            let choices = if temperature == 0.0 {
                vec![DrafterChoice::Off, DrafterChoice::Ngram, DrafterChoice::SelfDraft]
            } else {
                vec![DrafterChoice::Off]
            };
            for choice in choices {
                let drafting = engine.drafting(&choice).unwrap();
                let (out, _) = run(&engine, PROMPT, &o, &[], &drafting);
                assert_eq!(out.ids, plain.ids, "{name} t={temperature} {choice:?}");
                assert_eq!(out.finish_reason, plain.finish_reason);
                assert_eq!((out.prompt_tokens, out.cached_tokens), (PROMPT.len(), 0));
                assert_eq!(out.stats.speculative.is_some(), choice != DrafterChoice::Off);
            }
        }
    }
}

#[test]
fn a_draft_model_is_resolved_once_and_keeps_greedy_output() {
    let engine = Engine::load(&fixture("qwen3_moe_tiny")).unwrap();
    let o = opts(20, 0.0);
    let plain = engine.generate(PROMPT, &o, &mut |_| true).unwrap();
    let choice = DrafterChoice::parse("off", Some(&fixture("mixtral_tiny"))).unwrap();
    let drafting = engine.drafting(&choice).unwrap();
    for _ in 0..2 {
        let (out, _) = run(&engine, PROMPT, &o, &[], &drafting);
        assert_eq!(out.ids, plain.ids);
    }
    let e = DrafterChoice::parse("model", None).unwrap_err().to_string();
    assert!(e.contains("--draft-model"), "{e}");
    let missing = DrafterChoice::DraftModel {
        dir: fixture("no_such_model"),
    };
    let e = engine.drafting(&missing).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("no_such_model"), "{e}");
}

#[test]
fn a_shared_prefix_is_reused_and_output_is_bit_identical() {
    for name in ["qwen3_moe_tiny", "deepseek_v3_tiny"] {
        let engine = Engine::load(&fixture(name)).unwrap();
        for temperature in [0.0, 0.9] {
            let o = opts(10, temperature);
            let mut sched = Scheduler::new(&engine, SchedulerConfig::default()).unwrap();
            let first = turn(&mut sched, PROMPT, &o);
            assert_eq!(first.ids.len(), 10, "{name}");
            // The next turn: the prompt, 4 of the answer's tokens, then new ones.
            let mut next: Vec<u32> = PROMPT.to_vec();
            next.extend(&first.ids[..4]);
            next.extend([17, 42, 99]);
            let again = turn(&mut sched, &next, &o);
            assert_eq!(again.cached_tokens, PROMPT.len() + 4, "{name}");
            assert_eq!(again.stats.cached_tokens, again.cached_tokens);
            let fresh = engine.generate(&next, &o, &mut |_| true).unwrap();
            assert_eq!(again.ids, fresh.ids, "{name} t={temperature}");
            // The same prompt again: everything but the last prompt token is reused.
            let same = turn(&mut sched, &next, &o);
            assert_eq!(same.cached_tokens, next.len() - 1);
            assert_eq!(same.ids, fresh.ids);
            // An unrelated prompt reuses nothing.
            let other = turn(&mut sched, &[5, 6, 7], &o);
            assert_eq!(other.cached_tokens, 0);
            assert_eq!(other.ids, engine.generate(&[5, 6, 7], &o, &mut |_| true).unwrap().ids);
        }
    }
}

/// Text pieces of `ids` as a stream decoder gives them.
fn pieces(engine: &Engine, ids: &[u32]) -> Vec<String> {
    let tok = engine.tokenizer().unwrap();
    let mut dec = StreamDecoder::new();
    ids.iter().map(|&id| dec.push(tok, id).unwrap().unwrap_or_default()).collect()
}

#[test]
fn stop_strings_spanning_tokens_cut_text_and_ids() {
    let engine = Engine::load(&fixture("qwen3_moe_tok")).unwrap();
    let prompt = engine.encode_prompt("The capital of France is").unwrap();
    let o = GenerateOptions {
        stop_at_eos: false,
        ..opts(40, 0.0)
    };
    let plain = engine.generate(&prompt, &o, &mut |_| true).unwrap();
    let parts = pieces(&engine, &plain.ids);
    let full: String = parts.concat();
    // A stop string from the last character of one piece to the first of a later one.
    let j = (5..parts.len() - 2)
        .find(|&j| !parts[j].is_empty() && !parts[j + 1].is_empty() && !parts[j + 2].is_empty())
        .expect("three non-empty pieces in a row");
    let last = parts[j].chars().last().unwrap();
    let first = parts[j + 2].chars().next().unwrap();
    let stop = format!("{last}{}{first}", parts[j + 1]);
    let at = full.find(&stop).unwrap();
    // The token that completes the stop string's first occurrence.
    let mut len = 0;
    let upto = parts
        .iter()
        .position(|p| {
            len += p.len();
            len >= at + stop.len()
        })
        .unwrap();
    let stops = vec!["never appears \u{1}".to_string(), stop.clone()];
    let (out, streamed) = run(&engine, &prompt, &o, &stops, &Drafting::off());
    assert_eq!(out.text, full[..at], "stop {stop:?}");
    assert_eq!(streamed, out.text);
    assert_eq!(out.ids, plain.ids[..=upto]);
    assert_eq!(out.finish_reason, FinishReason::Stop);
    assert_eq!(out.stop_string.as_deref(), Some(stop.as_str()));
    // A stop string that never appears: all the text, held-back text released at the end.
    let tail = format!("{}\u{1}", &full[full.len() - full.chars().last().unwrap().len_utf8()..]);
    let (out, streamed) = run(&engine, &prompt, &o, &[tail], &Drafting::off());
    assert_eq!((out.text.as_str(), streamed.as_str()), (full.as_str(), full.as_str()));
    assert_eq!(
        (out.ids, out.finish_reason, out.stop_string),
        (plain.ids, FinishReason::Length, None)
    );
    let bad = job(&prompt, &o, &[String::new()], &Drafting::off());
    let e = engine.run(bad, &mut |_: RequestEvent<'_>| true);
    assert!(matches!(e, Err(EngineError::Invalid { field: "stop", .. })), "{e:?}");
}

/// A sink that cancels its request from elsewhere: the flag it reads is set
/// after its third token.
struct CancelAfterThree {
    seen: usize,
    flag: AtomicBool,
}

impl RequestSink for CancelAfterThree {
    fn event(&mut self, e: RequestEvent<'_>) -> bool {
        if let RequestEvent::Token { .. } = e {
            self.seen += 1;
            if self.seen == 3 {
                self.flag.store(true, Ordering::Relaxed);
            }
        }
        true
    }

    fn cancelled(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }
}

#[test]
fn cancellation_stops_at_once() {
    let engine = Engine::load(&fixture("qwen3_moe_tiny")).unwrap();
    let o = opts(30, 0.0);
    let plain = engine.generate(PROMPT, &o, &mut |_| true).unwrap();
    let mut sink = CancelAfterThree {
        seen: 0,
        flag: AtomicBool::new(false),
    };
    let out = engine.run(job(PROMPT, &o, &[], &Drafting::off()), &mut sink).unwrap();
    assert_eq!((out.ids.as_slice(), out.finish_reason), (&plain.ids[..3], FinishReason::Cancelled));
    // The sink saying false cancels too, drafting or not.
    for choice in [DrafterChoice::Off, DrafterChoice::Ngram] {
        let drafting = engine.drafting(&choice).unwrap();
        let mut n = 0;
        let mut quiet = |e: RequestEvent<'_>| {
            n += usize::from(matches!(e, RequestEvent::Token { .. }));
            n < 5
        };
        let out = engine.run(job(PROMPT, &o, &[], &drafting), &mut quiet).unwrap();
        assert_eq!(out.ids, plain.ids[..5], "{choice:?}");
        assert_eq!(out.finish_reason, FinishReason::Cancelled);
    }
}

#[test]
fn the_context_check_names_the_field() {
    let engine = Engine::load(&fixture("qwen3_moe_tiny")).unwrap();
    let context = engine.model().spec().max_position_embeddings;
    assert_eq!(engine.check_prompt(PROMPT, None).unwrap(), context - PROMPT.len());
    assert_eq!(engine.check_prompt(PROMPT, Some(3)).unwrap(), 3);
    match engine.check_prompt(PROMPT, Some(context)) {
        Err(EngineError::Invalid { field, message }) => {
            assert_eq!(field, "max_tokens");
            assert!(message.contains(&format!("context of {context} tokens")), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let vocab = engine.model().spec().vocab_size as u32;
    assert!(matches!(
        engine.check_prompt(&[1, vocab], None),
        Err(EngineError::Invalid { field: "prompt", .. })
    ));
    // A job asking past the context is refused before it runs.
    let too_long = job(PROMPT, &opts(context, 0.0), &[], &Drafting::off());
    let e = engine.run(too_long, &mut |_: RequestEvent<'_>| true);
    assert!(matches!(e, Err(EngineError::Invalid { field: "max_tokens", .. })), "{e:?}");
}
