//! Kimi Linear (`model_type: kimi_linear`, KDA + MLA hybrid) against the
//! transformers 5.24.0 references in `fixtures/kimi_linear_*`: logits within
//! 1e-4 of the one-pass (chunked KDA) and the token-by-token (recurrent KDA)
//! references, identical routing, greedy ids with and without the state;
//! bit-identical logits whatever the prefill chunking and batch company;
//! snapshot/restore exactness, rollback refused; a failed pass leaves the
//! recurrent state as it was; bad configs and checkpoints name the field or
//! tensor.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use larder_model::checkpoint::Checkpoint;
use larder_model::mlp::Mlp;
use larder_model::{
    expert_layers, expert_tensors, load_model, BatchSeq, DecoderModel, ExpertProvider, InMemoryExperts, ModelError, RouteTrace,
    SequenceState, Wanted,
};
use larder_tensor::Mat;
use serde_json::Value;

const FIXTURES: [&str; 3] = ["kimi_linear_tiny", "kimi_linear_mla_first", "kimi_linear_k3_gates"];

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

struct Reference {
    json: Value,
    logits: Vec<f32>,
    token_by_token: Vec<f32>,
    vocab: usize,
}

fn reference(dir: &Path) -> Reference {
    let json: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let read = |name: &str| -> (Vec<f32>, usize) {
        let t = st.tensor(name).unwrap();
        let v = t
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        (v, t.shape()[1])
    };
    let (logits, vocab) = read("logits");
    let (token_by_token, _) = read("logits_token_by_token");
    Reference {
        json,
        logits,
        token_by_token,
        vocab,
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn bits(m: &Mat) -> Vec<u32> {
    m.as_slice().iter().map(|v| v.to_bits()).collect()
}

fn load(name: &str) -> DecoderModel {
    load_model(&fixture_dir(name), None).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn prompt_of(name: &str) -> Vec<u32> {
    ids(&reference(&fixture_dir(name)).json["prompt_ids"])
}

/// Greedy ids: through the state (`use_state`), or recomputing the whole
/// sequence from a fresh state every step.
fn greedy(model: &DecoderModel, prompt: &[u32], n: usize, use_state: bool) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    let mut state = model.new_state();
    let mut logits = model.forward_last(prompt, &mut state, None).unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let next = argmax(&logits);
        out.push(next);
        seq.push(next);
        logits = if use_state {
            model.forward_last(&[next], &mut state, None).unwrap()
        } else {
            model.forward_last(&seq, &mut model.new_state(), None).unwrap()
        };
    }
    out
}

fn max_diff(got: &Mat, want: &[f32], vocab: usize) -> f32 {
    let mut worst = 0.0f32;
    for p in 0..got.rows() {
        for (a, b) in got.row(p).iter().zip(&want[p * vocab..(p + 1) * vocab]) {
            worst = worst.max((a - b).abs());
        }
    }
    worst
}

fn check_reference(name: &str) {
    let dir = fixture_dir(name);
    let model = load(name);
    let r = reference(&dir);
    let prompt = ids(&r.json["prompt_ids"]);
    let mut state = model.new_state();
    let mut trace = RouteTrace::default();
    let logits = model.forward(&prompt, &mut state, Some(&mut trace)).unwrap();
    let chunked = max_diff(&logits, &r.logits, r.vocab);
    let recurrent = max_diff(&logits, &r.token_by_token, r.vocab);
    eprintln!("{name}: max |logit diff| vs one-pass {chunked:.2e}, vs token-by-token {recurrent:.2e}");
    assert!(chunked <= 1e-4, "{name}: max |logit diff| vs logits {chunked} > 1e-4");
    assert!(
        recurrent <= 1e-4,
        "{name}: max |logit diff| vs logits_token_by_token {recurrent} > 1e-4"
    );

    let routing = r.json["routing"].as_object().unwrap();
    assert_eq!(routing.len(), trace.layers.len(), "{name}: number of MoE layers");
    for (layer, rows) in routing {
        let l: usize = layer.parse().unwrap();
        let weights = &r.json["routing_weights"][layer];
        for (p, row) in rows.as_array().unwrap().iter().enumerate() {
            let got = &trace.layers[&l][p];
            assert_eq!(
                got.experts,
                ids(row).iter().map(|&e| e as usize).collect::<Vec<_>>(),
                "{name}: layer {l} position {p}"
            );
            for (g, w) in got.weights.iter().zip(weights[p].as_array().unwrap()) {
                assert!(
                    (g - w.as_f64().unwrap() as f32).abs() < 1e-5,
                    "{name}: layer {l} position {p} weight"
                );
            }
        }
    }

    let n = ids(&r.json["greedy_ids"]).len();
    assert_eq!(
        greedy(&model, &prompt, n, true),
        ids(&r.json["greedy_ids"]),
        "{name}: greedy through the state"
    );
    assert_eq!(
        greedy(&model, &prompt, n, false),
        ids(&r.json["greedy_ids_no_cache"]),
        "{name}: greedy recomputed"
    );
}

#[test]
fn tiny_matches_transformers() {
    check_reference("kimi_linear_tiny");
}

#[test]
fn mla_first_matches_transformers() {
    check_reference("kimi_linear_mla_first");
}

/// The K3 gate extensions (lower-bounded forget gate, full-rank KDA output
/// gate, MLA head-wise output gate) against their reference modules
/// installed on transformers' kimi_linear (scripts/fixtures_k3_gates.py).
#[test]
fn k3_gates_match_their_references() {
    check_reference("kimi_linear_k3_gates");
}

#[test]
fn prefill_chunking_is_bit_identical() {
    for name in FIXTURES {
        let model = load(name);
        let prompt = prompt_of(name);
        let whole = model.forward(&prompt, &mut model.new_state(), None).unwrap();
        let mut one = model.new_state();
        for (p, &id) in prompt.iter().enumerate() {
            let row = model.forward(&[id], &mut one, None).unwrap();
            assert_eq!(bits(&row), bits(&whole.gather_rows(&[p])), "{name}: position {p} token by token");
        }
        for splits in [vec![1, 4], vec![prompt.len() / 3 + 1, 2, 5]] {
            let mut s = model.new_state();
            let mut at = 0usize;
            for len in splits.iter().copied().chain([usize::MAX]) {
                let end = at.saturating_add(len).min(prompt.len());
                let part = model.forward(&prompt[at..end], &mut s, None).unwrap();
                assert_eq!(
                    bits(&part),
                    bits(&whole.gather_rows(&(at..end).collect::<Vec<_>>())),
                    "{name}: chunks {splits:?}"
                );
                at = end;
                if at == prompt.len() {
                    break;
                }
            }
        }
    }
}

#[test]
fn a_batch_is_bit_identical_to_each_sequence_alone() {
    for name in FIXTURES {
        let model = load(name);
        let prompt = prompt_of(name);
        let vocab = model.spec().vocab_size as u32;
        let other: Vec<u32> = prompt.iter().rev().map(|&t| (t * 7 + 3) % vocab).collect();
        // A fresh prompt, one mid-prefill (5 tokens in, 6 more), one decoding.
        let prefixes: [&[u32]; 3] = [&[], &other[..5], &prompt];
        let nexts: [&[u32]; 3] = [&prompt[..9], &other[5..11], &[42]];
        let wanted = [Wanted::All, Wanted::All, Wanted::Last];
        let prepared = |k: usize| {
            let mut s = model.new_state();
            if !prefixes[k].is_empty() {
                model.forward(prefixes[k], &mut s, None).unwrap();
            }
            s
        };
        let alone: Vec<(Mat, SequenceState)> = (0..3)
            .map(|k| {
                let mut s = prepared(k);
                let all = model.forward(nexts[k], &mut s, None).unwrap();
                let m = if wanted[k] == Wanted::Last {
                    all.gather_rows(&[all.rows() - 1])
                } else {
                    all
                };
                (m, s)
            })
            .collect();
        let mut states: Vec<SequenceState> = (0..3).map(prepared).collect();
        let mut seqs: Vec<BatchSeq> = states
            .iter_mut()
            .enumerate()
            .map(|(k, s)| BatchSeq::new(nexts[k], s, wanted[k]))
            .collect();
        let out = model.forward_batch(&mut seqs, None).unwrap();
        for k in 0..3 {
            assert_eq!(bits(&out[k]), bits(&alone[k].0), "{name}: sequence {k} in the batch");
            assert_eq!(
                states[k].snapshot(),
                alone[k].1.snapshot(),
                "{name}: sequence {k} state after the batch"
            );
        }
    }
}

#[test]
fn snapshot_restore_is_exact_and_rollback_is_refused() {
    for name in FIXTURES {
        let model = load(name);
        let prompt = prompt_of(name);
        let mut s = model.new_state();
        let fixed = s.bytes();
        assert!(fixed > 0, "{name}: KDA layers hold a state from the start");
        model.forward(&prompt[..6], &mut s, None).unwrap();
        let snap = s.snapshot();
        assert!(snap.bytes() > 0, "{name}: the snapshot copies the recurrent state");
        let first = model.forward(&prompt[6..], &mut s, None).unwrap();
        let e = s.rollback(6).unwrap_err();
        assert!(
            matches!(e, ModelError::State(_)) && e.to_string().contains("recurrent"),
            "{name}: {e}"
        );
        assert_eq!(s.len(), prompt.len(), "{name}: a refused rollback changes nothing");
        s.restore(&snap).unwrap();
        assert_eq!(s.len(), 6);
        let second = model.forward(&prompt[6..], &mut s, None).unwrap();
        assert_eq!(bits(&first), bits(&second), "{name}: after restore");

        // Restoring the same snapshot twice gives the same result again.
        s.restore(&snap).unwrap();
        let third = model.forward(&prompt[6..], &mut s, None).unwrap();
        assert_eq!(bits(&first), bits(&third), "{name}: restore again");
        s.clear();
        assert_eq!((s.len(), s.bytes()), (0, fixed), "{name}: cleared");

        // A kimi_linear state on another model (and the reverse) is refused by name.
        let other = load(if name == FIXTURES[0] { FIXTURES[1] } else { FIXTURES[0] });
        let e = other.forward(&[1], &mut s, None).unwrap_err().to_string();
        assert!(e.contains("another model"), "{name}: {e}");
        let e = model.forward(&[1], &mut other.new_state(), None).unwrap_err().to_string();
        assert!(e.contains("another model"), "{name}: {e}");
    }
}

/// Every expert in RAM, failing the request of `fail_layer` while `armed`.
struct FailOnce {
    inner: InMemoryExperts,
    fail_layer: usize,
    armed: AtomicBool,
}

impl ExpertProvider for FailOnce {
    fn with_experts(
        &self,
        layer: usize,
        ids: &[usize],
        run: &mut dyn FnMut(usize, &Mlp) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        if layer == self.fail_layer && self.armed.swap(false, Ordering::SeqCst) {
            return Err(ModelError::Experts("injected failure".into()));
        }
        self.inner.with_experts(layer, ids, run)
    }
}

fn in_memory(dir: &Path) -> InMemoryExperts {
    let spec = larder_model::arch::read_spec(dir).unwrap();
    let ckpt = Checkpoint::open(dir).unwrap();
    let mut layers = vec![Vec::new(); spec.layers.len()];
    for (l, num_experts) in expert_layers(&spec) {
        layers[l] = (0..num_experts)
            .map(|e| {
                let [g, u, d] = expert_tensors(&spec, l, e).unwrap();
                let w = |t: &larder_model::ExpertTensor| ckpt.matrix(&t.name, t.shape[0], t.shape[1]).unwrap();
                Arc::new(Mlp::new(&g.name, w(&g), w(&u), w(&d)).unwrap())
            })
            .collect();
    }
    InMemoryExperts::new(layers)
}

#[test]
fn a_failed_pass_leaves_the_recurrent_state_as_it_was() {
    let name = "kimi_linear_tiny";
    let dir = fixture_dir(name);
    let reference = load(name);
    // Layer 5 is KDA + MoE: layers 1-5's KDA states are updated before it fails.
    let provider = Arc::new(FailOnce {
        inner: in_memory(&dir),
        fail_layer: 5,
        armed: AtomicBool::new(false),
    });
    let model = load_model(&dir, Some(provider.clone())).unwrap();
    let prompt = prompt_of(name);
    let mut s = model.new_state();
    model.forward(&prompt[..5], &mut s, None).unwrap();
    let before = s.snapshot();
    provider.armed.store(true, Ordering::SeqCst);
    assert!(model.forward(&prompt[5..], &mut s, None).is_err());
    assert_eq!(s.snapshot(), before, "{name}: state after a failed pass");
    let got = model.forward(&prompt[5..], &mut s, None).unwrap();
    let mut r = reference.new_state();
    let want = reference.forward(&prompt, &mut r, None).unwrap();
    assert_eq!(
        bits(&got),
        bits(&want.gather_rows(&(5..prompt.len()).collect::<Vec<_>>())),
        "{name}: after the failure"
    );
}

fn copy_fixture(name: &str, tag: &str) -> PathBuf {
    let src = fixture_dir(name);
    let dst = std::env::temp_dir().join(format!("larder-kimi-linear-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    dst
}

fn edit(dir: &Path, f: impl FnOnce(&mut Value)) {
    let p = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, v.to_string()).unwrap();
}

fn load_error(dir: &Path) -> String {
    let e = match load_model(dir, None) {
        Ok(_) => panic!("{} should not load", dir.display()),
        Err(e) => e.to_string(),
    };
    std::fs::remove_dir_all(dir).unwrap();
    e
}

#[test]
fn bad_configs_name_the_field_and_the_config() {
    let lin = |key: &str, value: Value| -> (String, Value) { (format!("linear_attn_config.{key}"), value) };
    let cases: Vec<((String, Value), &[&str])> = vec![
        (
            lin("kda_layers", serde_json::json!([1, 2, 3, 4, 5, 6])),
            &["linear_attn_config.kda_layers", "layer 4", "also"],
        ),
        (
            lin("kda_layers", serde_json::json!([1, 2, 3, 5])),
            &["linear_attn_config.kda_layers", "layer 6", "neither"],
        ),
        (
            lin("full_attn_layers", serde_json::json!([4, 7])),
            &["linear_attn_config.full_attn_layers", "7", "1-based"],
        ),
        (
            lin("full_attn_layers", serde_json::json!([0, 4])),
            &["linear_attn_config.full_attn_layers", "1-based"],
        ),
        (
            lin("short_conv_kernel_size", Value::from(0)),
            &["linear_attn_config.short_conv_kernel_size", "positive"],
        ),
        (lin("num_heads", Value::from(-1)), &["linear_attn_config.num_heads"]),
        (("linear_attn_config".into(), Value::from("kda")), &["linear_attn_config", "object"]),
        (("mla_use_nope".into(), Value::from(false)), &["mla_use_nope", "false"]),
        (("moe_layer_freq".into(), Value::from(2)), &["moe_layer_freq", "2"]),
        (
            ("moe_router_activation_func".into(), Value::from("softmax")),
            &["moe_router_activation_func", "softmax"],
        ),
        (("tie_word_embeddings".into(), Value::from(true)), &["tie_word_embeddings"]),
        (("attention_bias".into(), Value::from(true)), &["attention_bias"]),
        (("num_key_value_heads".into(), Value::from(2)), &["num_key_value_heads"]),
        (("num_expert_group".into(), Value::from(5)), &["num_expert_group"]),
        (("topk_group".into(), Value::from(9)), &["topk_group"]),
        (("num_experts_per_token".into(), Value::from(13)), &["num_experts_per_token"]),
        (("hidden_act".into(), Value::from("gelu")), &["hidden_act"]),
        (("layer_types".into(), serde_json::json!(["linear_attention"])), &["layer_types"]),
    ];
    for (i, ((field, value), want)) in cases.into_iter().enumerate() {
        let dir = copy_fixture("kimi_linear_tiny", &format!("cfg{i}"));
        edit(&dir, |v| match field.strip_prefix("linear_attn_config.") {
            Some(key) => v["linear_attn_config"][key] = value.clone(),
            None => v[field.as_str()] = value.clone(),
        });
        let msg = load_error(&dir);
        assert!(msg.contains("config.json"), "{field}={value}: {msg}");
        for w in want {
            assert!(msg.contains(w), "{field}={value}: {msg} should name {w}");
        }
    }
}

#[test]
fn k3_output_gate_switches_must_agree_with_the_tensors() {
    // Switched on without the tensor: the missing tensor is named.
    for (i, (field, tensor)) in [
        ("mla_use_output_gate", "model.layers.3.self_attn.g_proj.weight"),
        ("linear_attn_config.use_full_rank_gate", "model.layers.0.self_attn.g_proj.weight"),
    ]
    .into_iter()
    .enumerate()
    {
        let dir = copy_fixture("kimi_linear_tiny", &format!("gate-on{i}"));
        edit(&dir, |v| match field.strip_prefix("linear_attn_config.") {
            Some(key) => v["linear_attn_config"][key] = Value::Bool(true),
            None => v[field] = Value::Bool(true),
        });
        let msg = load_error(&dir);
        assert!(msg.contains(tensor), "{field}: {msg}");
    }
    // The tensor without the switch: never silently ignored.
    for (i, (field, tensor)) in [
        ("mla_use_output_gate", "model.layers.2.self_attn.g_proj.weight"),
        ("linear_attn_config.use_full_rank_gate", "model.layers.0.self_attn.g_proj.weight"),
    ]
    .into_iter()
    .enumerate()
    {
        let dir = copy_fixture("kimi_linear_k3_gates", &format!("gate-off{i}"));
        edit(&dir, |v| match field.strip_prefix("linear_attn_config.") {
            Some(key) => v["linear_attn_config"][key] = Value::Bool(false),
            None => v[field] = Value::Bool(false),
        });
        let msg = load_error(&dir);
        for w in ["config.json", field, tensor, "set it to true"] {
            assert!(msg.contains(w), "{field}: {msg} should name {w}");
        }
    }
}

#[test]
fn kda_dims_that_disagree_with_the_tensors_are_named() {
    for (i, (key, value)) in [("head_dim", 8), ("num_heads", 4), ("short_conv_kernel_size", 3)]
        .into_iter()
        .enumerate()
    {
        let dir = copy_fixture("kimi_linear_tiny", &format!("dims{i}"));
        edit(&dir, |v| v["linear_attn_config"][key] = Value::from(value));
        let msg = load_error(&dir);
        for w in ["config.json", "linear_attn_config", "model.layers.0.self_attn."] {
            assert!(msg.contains(w), "{key}={value}: {msg} should name {w}");
        }
    }
}

#[test]
fn a_missing_kda_tensor_is_named() {
    for (i, dropped) in [
        "model.layers.1.self_attn.dt_bias",
        "model.layers.2.self_attn.g_b_proj.weight",
        "model.layers.4.self_attn.v_conv1d.weight",
    ]
    .into_iter()
    .enumerate()
    {
        let dir = copy_fixture("kimi_linear_tiny", &format!("missing{i}"));
        let path = dir.join("model.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let kept: Vec<_> = st.tensors().into_iter().filter(|(n, _)| n != dropped).collect();
        std::fs::write(&path, safetensors::serialize(kept, None).unwrap()).unwrap();
        let msg = load_error(&dir);
        assert!(msg.contains(dropped), "{msg}");
    }
}
