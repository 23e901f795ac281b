//! Per-request sampling controls keep per-request identity: a request with
//! a constraint, `logit_bias`, penalties and logprobs gives the same ids
//! alone, in a batch of 8 through the [`Scheduler`] (also under a KV budget
//! that preempts and feeds sequences again), and (greedy) with an n-gram
//! drafter, whose drafts the constraint forbids are rejected; every
//! reported logprob is bit-equal to the log-softmax of `forward`'s logits
//! at its position; the constraint's mask is obeyed and its end stops the
//! request; bias and penalties change what is sampled as OpenAI defines.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use larder_engine::{
    log_softmax, ConstraintError, DrafterChoice, Engine, FinishReason, GenerateOptions, Job, LogitAdjustments, Outcome, RequestEvent,
    SamplingParams, Scheduler, SchedulerConfig, TokenConstraint,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

/// Only even ids.
struct EvenOnly;

impl TokenConstraint for EvenOnly {
    fn allowed(&mut self, allowed: &mut [bool]) -> Result<(), ConstraintError> {
        allowed.iter_mut().step_by(2).for_each(|a| *a = true);
        Ok(())
    }

    fn commit(&mut self, token: u32) -> Result<(), ConstraintError> {
        match token % 2 {
            0 => Ok(()),
            _ => Err(ConstraintError(format!("odd token {token} was committed"))),
        }
    }
}

/// Exactly these ids, then done.
struct Fixed {
    ids: Vec<u32>,
    at: usize,
}

impl TokenConstraint for Fixed {
    fn allowed(&mut self, allowed: &mut [bool]) -> Result<(), ConstraintError> {
        let t = self.ids.get(self.at).ok_or_else(|| ConstraintError("asked past its end".into()))?;
        allowed[*t as usize] = true;
        Ok(())
    }

    fn commit(&mut self, token: u32) -> Result<(), ConstraintError> {
        let expected = self.ids.get(self.at).copied();
        self.at += 1;
        match expected == Some(token) {
            true => Ok(()),
            false => Err(ConstraintError(format!("{token} is not the expected {expected:?}"))),
        }
    }

    fn is_done(&self) -> bool {
        self.at == self.ids.len()
    }
}

/// Fails after two tokens.
struct Broken(usize);

impl TokenConstraint for Broken {
    fn allowed(&mut self, allowed: &mut [bool]) -> Result<(), ConstraintError> {
        allowed.fill(true);
        Ok(())
    }

    fn commit(&mut self, _: u32) -> Result<(), ConstraintError> {
        self.0 += 1;
        match self.0 {
            3.. => Err(ConstraintError("the grammar has no rule here".into())),
            _ => Ok(()),
        }
    }
}

fn prompt(k: u32) -> Vec<u32> {
    (0..5 + 3 * k).map(|i| (i * 37 + k * 101 + 5) % 500 + 3).collect()
}

/// Request `k` of the identity scenario: greedy or sampled, each with a mix
/// of constraint, bias, penalties and logprobs.
fn job(k: u32, drafted: Option<&Engine>) -> Job {
    let sampled = k % 2 == 1;
    let mut job = Job::new(prompt(k))
        .options(GenerateOptions {
            max_new: 12,
            sampling: SamplingParams {
                temperature: if sampled { 0.9 } else { 0.0 },
                top_p: 0.95,
                top_k: 50,
                seed: 17 + k as u64,
            },
            stop_at_eos: false,
            ..GenerateOptions::default()
        })
        .logprobs(k as usize % 4)
        .adjust(LogitAdjustments {
            logit_bias: BTreeMap::from([(k * 13 % 400, 3.0), (2, -100.0)]),
            frequency_penalty: [0.0, 0.5, -0.3, 1.1][k as usize % 4],
            presence_penalty: [0.0, 0.7, 1.9, -0.2][(k as usize / 2) % 4],
        });
    if k % 3 != 2 {
        job = job.constraint(Box::new(EvenOnly));
    }
    if let Some(engine) = drafted {
        job = job.drafter(engine.drafting(&DrafterChoice::Ngram).unwrap().drafter().unwrap());
    }
    job
}

fn alone(engine: &Engine, job: Job) -> Outcome {
    engine.run(job, &mut |_: RequestEvent<'_>| true).unwrap()
}

/// Every job in one scheduler (all admitted together), each outcome with
/// the logprobs its events carried.
fn batched(engine: &Engine, jobs: Vec<Job>) -> Vec<Outcome> {
    batched_within(engine, jobs, None)
}

/// [`batched`] with the KV budget room for `room` positions (`None`: no
/// budget); asserts that a budget preempted some sequence.
fn batched_within(engine: &Engine, jobs: Vec<Job>, room: Option<usize>) -> Vec<Outcome> {
    let probe = Scheduler::new(engine, SchedulerConfig::default()).unwrap();
    let kv_budget = room.map(|n| n * probe.bytes_per_token() + 8 * probe.bytes_per_sequence());
    let config = SchedulerConfig {
        max_batch: jobs.len(),
        kv_budget,
        ..SchedulerConfig::default()
    };
    let mut sched = Scheduler::new(engine, config).unwrap();
    let results: Arc<Mutex<Vec<Option<Outcome>>>> = Arc::new(Mutex::new(vec![None; jobs.len()]));
    for (slot, job) in jobs.into_iter().enumerate() {
        let results = results.clone();
        let mut streamed = Vec::new();
        let sink = move |e: RequestEvent<'_>| {
            match e {
                RequestEvent::Token { logprob: Some(lp), .. } => streamed.push(lp.clone()),
                RequestEvent::Finished(o) => {
                    assert_eq!(
                        o.logprobs.as_ref().map_or(&[][..], Vec::as_slice),
                        &streamed[..],
                        "events carry the outcome's logprobs"
                    );
                    results.lock().unwrap()[slot] = Some(o.clone());
                }
                _ => {}
            }
            true
        };
        sched.submit(job, Box::new(sink)).unwrap();
    }
    while !sched.is_idle() {
        let report = sched.step();
        assert!(
            report.failed.is_empty(),
            "{:?}",
            report.failed.iter().map(|f| f.error.to_string()).collect::<Vec<_>>()
        );
    }
    if room.is_some() {
        assert!(sched.preemptions() > 0, "the budget preempts");
    }
    let out = results.lock().unwrap().iter().map(|o| o.clone().unwrap()).collect();
    out
}

/// Each logprob is the log-softmax of `forward`'s logits at its position, bit for bit.
fn assert_logprobs_exact(engine: &Engine, prompt: &[u32], o: &Outcome, top: usize) {
    let Some(lps) = &o.logprobs else { panic!("no logprobs") };
    assert_eq!(lps.len(), o.ids.len());
    let all: Vec<u32> = prompt.iter().chain(&o.ids).copied().collect();
    let logits = engine.forward(&all[..all.len() - 1]).unwrap();
    for (i, lp) in lps.iter().enumerate() {
        let row = log_softmax(logits.row(prompt.len() - 1 + i));
        assert_eq!(lp.token, o.ids[i]);
        assert_eq!(lp.logprob.to_bits(), row[o.ids[i] as usize].to_bits(), "token {i}");
        assert_eq!(lp.top.len(), top);
        let mut best: Vec<u32> = (0..row.len() as u32).collect();
        best.sort_by(|a, b| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b)));
        let expected: Vec<(u32, f32)> = best[..top].iter().map(|&t| (t, row[t as usize])).collect();
        assert_eq!(lp.top, expected, "top logprobs of token {i}");
    }
}

#[test]
fn alone_batched_and_drafted_give_the_same_ids_and_exact_logprobs() {
    let engine = Engine::load(&fixture("qwen3_moe_tiny")).unwrap();
    let solo: Vec<Outcome> = (0..8).map(|k| alone(&engine, job(k, None))).collect();
    let batch = batched(&engine, (0..8).map(|k| job(k, None)).collect());
    let drafted = batched(&engine, (0..8).map(|k| job(k, Some(&engine))).collect());
    // Room for about three of the eight at their longest (26 prompt + 12 new).
    let preempted = batched_within(&engine, (0..8).map(|k| job(k, None)).collect(), Some(3 * 38));
    for k in 0..8u32 {
        let (s, b, d) = (&solo[k as usize], &batch[k as usize], &drafted[k as usize]);
        assert_eq!(s.ids.len(), 12, "request {k}");
        assert_eq!(s.ids, b.ids, "request {k}: alone vs batch of 8");
        assert_eq!(s.logprobs, b.logprobs, "request {k}");
        assert_eq!(s.ids, preempted[k as usize].ids, "request {k}: alone vs preempted");
        assert_eq!(s.logprobs, preempted[k as usize].logprobs, "request {k}");
        assert!(!s.ids.contains(&2), "request {k}: a bias of -100 keeps token 2 out");
        if k % 3 != 2 {
            assert!(
                s.ids.iter().chain(&d.ids).all(|t| t % 2 == 0),
                "request {k}: {:?} {:?}",
                s.ids,
                d.ids
            );
        }
        // A sampled request's draws depend on how many drafts it verifies;
        // greedy ids never depend on drafting.
        if k % 2 == 0 {
            assert_eq!(s.ids, d.ids, "request {k}: alone vs drafted");
            assert_eq!(s.logprobs, d.logprobs, "request {k}");
        }
        assert_logprobs_exact(&engine, &prompt(k), s, k as usize % 4);
        assert_logprobs_exact(&engine, &prompt(k), d, k as usize % 4);
    }
}

#[test]
fn drafts_the_constraint_forbids_are_rejected() {
    let engine = Engine::load(&fixture("qwen3_moe_tiny")).unwrap();
    // A repeating prompt: the n-gram drafter proposes its odd continuations.
    let prompt: Vec<u32> = [5u32, 6, 7, 8].repeat(5);
    let make = |drafted: bool| {
        let mut j = Job::new(prompt.clone())
            .options(GenerateOptions {
                max_new: 16,
                stop_at_eos: false,
                ..GenerateOptions::default()
            })
            .adjust(LogitAdjustments {
                logit_bias: BTreeMap::from([(5, 30.0), (6, 30.0), (7, 30.0), (8, 30.0)]),
                ..LogitAdjustments::default()
            })
            .constraint(Box::new(EvenOnly));
        if drafted {
            j = j.drafter(engine.drafting(&DrafterChoice::Ngram).unwrap().drafter().unwrap());
        }
        j
    };
    let plain = alone(&engine, make(false));
    let drafted = alone(&engine, make(true));
    assert_eq!(plain.ids, drafted.ids);
    assert!(plain.ids.iter().all(|t| t % 2 == 0), "{:?}", plain.ids);
    let spec = drafted.stats.speculative.as_ref().unwrap();
    assert!(spec.drafted > 0, "{spec:?}");
}

#[test]
fn a_constraint_ends_or_fails_its_request() {
    let engine = Engine::load(&fixture("qwen3_moe_tiny")).unwrap();
    let opts = GenerateOptions {
        max_new: 20,
        stop_at_eos: false,
        ..GenerateOptions::default()
    };
    let fixed = Job::new(prompt(1)).options(opts.clone()).constraint(Box::new(Fixed {
        ids: vec![41, 7, 300],
        at: 0,
    }));
    let o = alone(&engine, fixed);
    assert_eq!(o.ids, vec![41, 7, 300]);
    assert_eq!(o.finish_reason, FinishReason::Stop);
    let empty = Job::new(prompt(1))
        .options(opts.clone())
        .constraint(Box::new(Fixed { ids: vec![], at: 0 }));
    let o = alone(&engine, empty);
    assert_eq!((o.ids.len(), o.finish_reason), (0, FinishReason::Stop));
    let broken = Job::new(prompt(1)).options(opts).constraint(Box::new(Broken(0)));
    let e = engine
        .run(broken, &mut |_: RequestEvent<'_>| true)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("constraint: the grammar has no rule here"), "{e}");
}

#[test]
fn bias_and_penalties_change_greedy_output() {
    let engine = Engine::load(&fixture("qwen3_moe_tiny")).unwrap();
    let run = |adjust: LogitAdjustments| {
        let j = Job::new(prompt(2))
            .options(GenerateOptions {
                max_new: 24,
                stop_at_eos: false,
                ..GenerateOptions::default()
            })
            .adjust(adjust);
        alone(&engine, j).ids
    };
    let plain = run(LogitAdjustments::default());
    let forced = run(LogitAdjustments {
        logit_bias: BTreeMap::from([(77, 100.0)]),
        ..LogitAdjustments::default()
    });
    assert_eq!(forced, vec![77; 24]);
    let distinct = |ids: &[u32]| ids.iter().collect::<std::collections::BTreeSet<_>>().len();
    // A presence penalty of 2 pushes towards tokens not yet generated.
    let fresh = run(LogitAdjustments {
        presence_penalty: 2.0,
        ..LogitAdjustments::default()
    });
    assert_ne!(fresh, plain);
    assert!(distinct(&fresh) >= distinct(&plain), "{fresh:?} vs {plain:?}");
    let repeated = run(LogitAdjustments {
        frequency_penalty: -2.0,
        ..LogitAdjustments::default()
    });
    assert!(distinct(&repeated) <= distinct(&plain), "{repeated:?} vs {plain:?}");
    let bad = Job::new(prompt(2)).adjust(LogitAdjustments {
        frequency_penalty: 2.5,
        ..LogitAdjustments::default()
    });
    let e = engine
        .run(bad, &mut |_: RequestEvent<'_>| true)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("frequency_penalty"), "{e}");
}
