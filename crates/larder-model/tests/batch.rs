//! Batch invariance across sequences: `forward_batch` over several sequences
//! (different lengths, some mid-decode, any composition and order, in RAM or
//! through a provider that hands experts back in reverse order) gives each
//! sequence logits bit-identical to running it alone; one expert request per
//! MoE layer step for the whole batch; `SequenceState` rollback, snapshot and
//! restore; bad input names its sequence and leaves every state unchanged.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use larder_model::checkpoint::Checkpoint;
use larder_model::Mlp;
use larder_model::{
    expert_layers, expert_tensors, load_model, BatchSeq, DecoderModel, ExpertProvider, InMemoryExperts, ModelError, RouteTrace,
    SequenceState, Wanted,
};
use larder_tensor::{Mat, WeightDType, WeightMatrix};

const FIXTURES: &[&str] = &["qwen3_moe_tiny", "mixtral_tiny", "qwen2_moe_tiny", "deepseek_v3_tiny", "llama_tiny"];

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

/// One test sequence: ids already in its state (`prefix`, maybe none), then
/// the ids of the batched pass (`next`).
struct Case {
    prefix: Vec<u32>,
    next: Vec<u32>,
    wanted: Wanted,
}

fn ids(seed: u32, n: usize, vocab: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (seed * 7919 + i * 104_729 + 13) % vocab).collect()
}

/// Four sequences: prompts of 5, 1 and 7 tokens, one mid-decode with 1 new
/// token after 4, one mid-decode with 3 after 2.
fn cases(vocab: u32) -> Vec<Case> {
    vec![
        Case {
            prefix: vec![],
            next: ids(1, 5, vocab),
            wanted: Wanted::All,
        },
        Case {
            prefix: ids(2, 4, vocab),
            next: ids(3, 1, vocab),
            wanted: Wanted::Last,
        },
        Case {
            prefix: vec![],
            next: ids(4, 7, vocab),
            wanted: Wanted::Last,
        },
        Case {
            prefix: ids(5, 2, vocab),
            next: ids(6, 3, vocab),
            wanted: Wanted::All,
        },
    ]
}

fn bits(m: &Mat) -> Vec<u32> {
    m.as_slice().iter().map(|v| v.to_bits()).collect()
}

/// One `forward_batch`: sequence `i` runs `inputs[i]`'s ids on `states[i]`,
/// wanting `inputs[i]`'s rows.
fn run_batch<'a>(
    model: &DecoderModel,
    inputs: impl IntoIterator<Item = (&'a [u32], Wanted)>,
    states: &mut [SequenceState],
    trace: Option<&mut RouteTrace>,
) -> Result<Vec<Mat>, ModelError> {
    let mut seqs: Vec<BatchSeq> = inputs
        .into_iter()
        .zip(states.iter_mut())
        .map(|((ids, wanted), state)| BatchSeq::new(ids, state, wanted))
        .collect();
    model.forward_batch(&mut seqs, trace)
}

/// Each case's batched ids and wanted rows.
fn inputs<'a>(cases: impl IntoIterator<Item = &'a Case>) -> impl Iterator<Item = (&'a [u32], Wanted)> {
    cases.into_iter().map(|c| (c.next.as_slice(), c.wanted))
}

/// The state after `case.prefix`.
fn prepared(model: &DecoderModel, case: &Case) -> SequenceState {
    let mut s = model.new_state();
    if !case.prefix.is_empty() {
        model.forward(&case.prefix, &mut s, None).unwrap();
    }
    s
}

/// Each case alone: its wanted logits, its routes, its state after.
fn alone(model: &DecoderModel, cases: &[Case]) -> Vec<(Mat, RouteTrace, SequenceState)> {
    cases
        .iter()
        .map(|c| {
            let mut s = prepared(model, c);
            let mut t = RouteTrace::default();
            let all = model.forward(&c.next, &mut s, Some(&mut t)).unwrap();
            let m = match c.wanted {
                Wanted::All => all,
                Wanted::Last => all.gather_rows(&[all.rows() - 1]),
            };
            (m, t, s)
        })
        .collect()
}

/// Runs `order`'s cases in one batch from prepared states; returns the logits
/// in `order` order, the states and the trace.
fn batched(model: &DecoderModel, cases: &[Case], order: &[usize]) -> (Vec<Mat>, Vec<SequenceState>, RouteTrace) {
    let mut states: Vec<SequenceState> = order.iter().map(|&i| prepared(model, &cases[i])).collect();
    let mut trace = RouteTrace::default();
    let out = run_batch(model, inputs(order.iter().map(|&i| &cases[i])), &mut states, Some(&mut trace)).unwrap();
    (out, states, trace)
}

fn check_batches(name: &str, model: &DecoderModel, reference: &DecoderModel) {
    let vocab = model.spec().vocab_size as u32;
    let cases = cases(vocab);
    let want = alone(reference, &cases);
    let orders: &[&[usize]] = &[&[0, 1, 2, 3], &[3, 1, 0, 2], &[2, 0], &[1], &[3, 2, 1, 0], &[1, 3]];
    for order in orders {
        let (out, mut states, trace) = batched(model, &cases, order);
        assert_eq!(out.len(), order.len());
        for (k, &i) in order.iter().enumerate() {
            assert_eq!(bits(&out[k]), bits(&want[i].0), "{name}: order {order:?}: sequence {i} logits");
            assert_eq!(states[k].len(), cases[i].prefix.len() + cases[i].next.len(), "{name}: state length");
        }
        // The trace holds every MoE layer's routes in batch row order.
        for (l, routes) in &trace.layers {
            let expect: Vec<_> = order.iter().flat_map(|&i| want[i].1.layers[l].clone()).collect();
            assert_eq!(routes, &expect, "{name}: order {order:?}: layer {l} routes");
        }
        // One more decode step for all, each one token: still as alone.
        let step: Vec<Vec<u32>> = order.iter().map(|&i| ids(10 + i as u32, 1, vocab)).collect();
        let last = step.iter().map(|t| (t.as_slice(), Wanted::Last));
        let out = run_batch(model, last, &mut states, None).unwrap();
        for (k, &i) in order.iter().enumerate() {
            let mut s = want[i].2.clone();
            let one = reference.forward_last(&step[k], &mut s, None).unwrap();
            let got: Vec<u32> = out[k].as_slice().iter().map(|v| v.to_bits()).collect();
            let exp: Vec<u32> = one.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, exp, "{name}: order {order:?}: sequence {i} second step");
        }
    }
}

#[test]
fn batched_sequences_are_bit_identical_to_each_alone() {
    for name in FIXTURES {
        let model = load_model(&fixture_dir(name), None).unwrap();
        check_batches(name, &model, &model);
    }
}

/// In-RAM experts handed back in reverse order (as a streaming provider may,
/// by arrival), recording every request; with a `fault`, its layer fails.
struct TestExperts {
    inner: InMemoryExperts,
    requests: Mutex<Vec<(usize, Vec<usize>)>>,
    fault: Option<Fault>,
}

/// A layer that fails: an error from the provider, or NaN weights
/// (non-finite values in every row of that layer) when `nan` is given.
struct Fault {
    layer: usize,
    nan: Option<Mlp>,
}

impl ExpertProvider for TestExperts {
    fn with_experts(
        &self,
        layer: usize,
        ids: &[usize],
        run: &mut dyn FnMut(usize, &Mlp) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        self.requests.lock().unwrap().push((layer, ids.to_vec()));
        match &self.fault {
            Some(Fault { layer: l, nan: None }) if *l == layer => Err(ModelError::Experts("injected read failure".into())),
            Some(Fault { layer: l, nan: Some(nan) }) if *l == layer => (0..ids.len()).try_for_each(|i| run(i, nan)),
            _ => {
                let rev: Vec<usize> = ids.iter().rev().copied().collect();
                let n = ids.len();
                self.inner.with_experts(layer, &rev, &mut |j, mlp| run(n - 1 - j, mlp))
            }
        }
    }

    fn wants_prefetch(&self) -> bool {
        true
    }
}

/// Every routed expert of the checkpoint in `dir`, in RAM, per layer.
fn expert_layers_of(dir: &Path, reference: &DecoderModel) -> Vec<Vec<Arc<Mlp>>> {
    let spec = reference.spec();
    let ckpt = Checkpoint::open(dir).unwrap();
    ckpt.set_fp8_block(spec.fp8_block);
    let mut layers = vec![Vec::new(); spec.layers.len()];
    for (l, n) in expert_layers(spec) {
        for e in 0..n {
            let [g, u, d] = expert_tensors(spec, l, e).unwrap();
            let w = |t: &larder_model::ExpertTensor| ckpt.matrix(&t.name, t.shape[0], t.shape[1]).unwrap();
            layers[l].push(Arc::new(Mlp::new(&format!("layer {l} expert {e}"), w(&g), w(&u), w(&d)).unwrap()));
        }
    }
    layers
}

fn test_experts(dir: &Path, reference: &DecoderModel, fault: Option<Fault>) -> Arc<TestExperts> {
    Arc::new(TestExperts {
        inner: InMemoryExperts::new(expert_layers_of(dir, reference)),
        requests: Mutex::new(Vec::new()),
        fault,
    })
}

#[test]
fn a_provider_returning_experts_out_of_order_gives_the_same_bits_with_one_request_per_layer_step() {
    for name in FIXTURES {
        let dir = fixture_dir(name);
        let reference = load_model(&dir, None).unwrap();
        let experts = test_experts(&dir, &reference, None);
        let model = load_model(&dir, Some(experts.clone())).unwrap();
        check_batches(name, &model, &reference);

        // One batch: each MoE layer asks once, for the union of its rows' experts.
        let cases = cases(reference.spec().vocab_size as u32);
        let mut states: Vec<SequenceState> = cases.iter().map(|c| prepared(&model, c)).collect();
        experts.requests.lock().unwrap().clear();
        let mut trace = RouteTrace::default();
        run_batch(&model, inputs(&cases), &mut states, Some(&mut trace)).unwrap();
        let requests = experts.requests.lock().unwrap().clone();
        assert_eq!(requests.len(), trace.layers.len(), "{name}: one request per MoE layer");
        for (layer, ids) in requests {
            let mut union: Vec<usize> = trace.layers[&layer].iter().flat_map(|r| r.experts.clone()).collect();
            union.sort_unstable();
            union.dedup();
            assert_eq!(ids, union, "{name}: layer {layer} request");
        }
    }
}

#[test]
fn rollback_snapshot_restore_and_clear() {
    for name in FIXTURES {
        let model = load_model(&fixture_dir(name), None).unwrap();
        let vocab = model.spec().vocab_size as u32;
        let prompt = ids(7, 9, vocab);
        let empty = model.new_state();
        assert_eq!((empty.len(), empty.bytes()), (0, 0), "{name}: empty state");
        let mut s = model.new_state();
        let full = model.forward(&prompt, &mut s, None).unwrap();
        let held = s.bytes();
        assert!(held > 0, "{name}: a state with positions holds bytes");

        // Forward N, rollback to M, forward the rest: the same bits.
        s.rollback(4).unwrap();
        assert_eq!(s.len(), 4);
        let rest = model.forward(&prompt[4..], &mut s, None).unwrap();
        assert_eq!(
            bits(&rest),
            bits(&full.gather_rows(&(4..9).collect::<Vec<_>>())),
            "{name}: after rollback"
        );
        assert_eq!(s.bytes(), held, "{name}: bytes after rollback and refill");

        // Snapshot at 6, run on, restore, run again: the same bits.
        s.rollback(6).unwrap();
        let snap = s.snapshot();
        assert_eq!(snap.len(), 6);
        let first = model.forward(&prompt[6..], &mut s, None).unwrap();
        s.restore(&snap).unwrap();
        assert_eq!(s.len(), 6);
        let second = model.forward(&prompt[6..], &mut s, None).unwrap();
        assert_eq!(bits(&first), bits(&second), "{name}: after restore");

        // Going forward is an error and changes nothing.
        let later = s.snapshot();
        s.rollback(2).unwrap();
        let e = s.rollback(5).unwrap_err();
        assert!(matches!(e, ModelError::State(_)), "{name}: {e}");
        assert!(s.restore(&later).is_err(), "{name}: restoring dropped positions");
        assert_eq!(s.len(), 2);

        s.clear();
        assert_eq!((s.len(), s.bytes()), (0, empty.bytes()), "{name}: cleared");
        let again = model.forward(&prompt, &mut s, None).unwrap();
        assert_eq!(bits(&again), bits(&full), "{name}: after clear");
    }
}

/// Runs a batch expected to fail and checks it names `index`, leaving every
/// state as it was.
fn expect_failure(model: &DecoderModel, inputs: &[Vec<u32>], states: &mut [SequenceState], index: usize) -> ModelError {
    let before: Vec<(usize, usize)> = states.iter().map(|s| (s.len(), s.bytes())).collect();
    let last = inputs.iter().map(|t| (t.as_slice(), Wanted::Last));
    let e = run_batch(model, last, states, None).unwrap_err();
    match &e {
        ModelError::Sequence { index: i, .. } => assert_eq!(*i, index, "{e}"),
        other => panic!("expected an error naming sequence {index}, got {other}"),
    }
    assert!(e.to_string().contains(&format!("sequence {index}")), "{e}");
    let after: Vec<(usize, usize)> = states.iter().map(|s| (s.len(), s.bytes())).collect();
    assert_eq!(before, after, "states changed by a failed batch");
    e
}

#[test]
fn bad_input_names_the_sequence_and_leaves_every_state_unchanged() {
    let model = load_model(&fixture_dir("qwen3_moe_tiny"), None).unwrap();
    let other = load_model(&fixture_dir("deepseek_v3_tiny"), None).unwrap();
    let (vocab, max) = (model.spec().vocab_size as u32, model.spec().max_position_embeddings);
    let cases = cases(vocab);
    let mut states: Vec<SequenceState> = cases.iter().map(|c| prepared(&model, c)).collect();
    let good: Vec<Vec<u32>> = cases.iter().map(|c| c.next.clone()).collect();

    let mut bad = good.clone();
    bad[2][1] = vocab;
    let e = expect_failure(&model, &bad, &mut states, 2);
    assert!(e.to_string().contains("out of the vocabulary"), "{e}");

    let mut long = good.clone();
    long[1] = vec![1; max];
    let e = expect_failure(&model, &long, &mut states, 1);
    assert!(e.to_string().contains("max_position_embeddings"), "{e}");

    let mut empty = good.clone();
    empty[3].clear();
    expect_failure(&model, &empty, &mut states, 3);

    let mut foreign = vec![other.new_state()];
    foreign[0].clear();
    let mut mixed: Vec<SequenceState> = states.drain(..2).collect();
    mixed.append(&mut foreign);
    let e = expect_failure(&model, &good[..3], &mut mixed, 2);
    assert!(e.to_string().contains("another model"), "{e}");

    // The states still give the logits they would have.
    let want = alone(&model, &cases[..2]);
    let out = run_batch(&model, inputs(&cases[..2]), &mut mixed, None).unwrap();
    for i in 0..2 {
        assert_eq!(bits(&out[i]), bits(&want[i].0), "sequence {i} after failed batches");
    }
    assert!(model.forward_batch(&mut [], None).unwrap().is_empty());
}

#[test]
fn a_failure_mid_pass_leaves_every_state_unchanged() {
    let dir = fixture_dir("deepseek_v3_tiny");
    let reference = load_model(&dir, None).unwrap();
    let spec = reference.spec();
    let moe_layers = expert_layers(spec);
    let (layer, _) = *moe_layers.last().unwrap();
    let [g, _, d] = expert_tensors(spec, layer, 0).unwrap();
    let nan = |s: [usize; 2]| WeightMatrix::from_f32(WeightDType::F32, s[0], s[1], &vec![f32::NAN; s[0] * s[1]]);
    let cases = cases(spec.vocab_size as u32);
    let want = alone(&reference, &cases);
    for poisoned in [false, true] {
        let fault = Fault {
            layer,
            nan: poisoned.then(|| Mlp::new("nan", nan(g.shape), nan(g.shape), nan(d.shape)).unwrap()),
        };
        let model = load_model(&dir, Some(test_experts(&dir, &reference, Some(fault)))).unwrap();
        let mut states: Vec<SequenceState> = cases.iter().map(|c| prepared(&reference, c)).collect();
        let before: Vec<(usize, usize)> = states.iter().map(|s| (s.len(), s.bytes())).collect();
        let e = run_batch(&model, inputs(&cases), &mut states, None).unwrap_err();
        match (&e, poisoned) {
            (ModelError::Experts(m), false) => assert!(m.contains("injected"), "{e}"),
            (ModelError::Sequence { index: 0, source }, true) => {
                let msg = source.to_string();
                assert!(msg.contains(&format!("layer {layer}")) && msg.contains("position 0"), "{msg}");
            }
            _ => panic!("unexpected error (poisoned: {poisoned}): {e}"),
        }
        let after: Vec<(usize, usize)> = states.iter().map(|s| (s.len(), s.bytes())).collect();
        assert_eq!(before, after, "states changed by a failed pass (poisoned: {poisoned})");
        // The states still give the logits they would have.
        for (i, (c, s)) in cases.iter().zip(states.iter_mut()).enumerate() {
            let all = reference.forward(&c.next, s, None).unwrap();
            let got = match c.wanted {
                Wanted::All => all,
                Wanted::Last => all.gather_rows(&[all.rows() - 1]),
            };
            assert_eq!(bits(&got), bits(&want[i].0), "sequence {i} after a failed pass");
        }
    }
}
