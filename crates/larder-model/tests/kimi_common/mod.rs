//! Helpers shared by the Kimi Linear and K3 fixture tests (`kimi_linear.rs`,
//! `kimi_k3.rs`) and `gpt_oss.rs`: fixture folders and their transformers
//! references, the reference check (logits, routing, greedy ids), the
//! chunking and batch bit-identity checks (each with every [`MlaCache`] where
//! the fixture has MLA layers), and edited copies of a fixture.

#![allow(dead_code)] // each test crate uses its own subset

use std::path::{Path, PathBuf};

use larder_model::config::MixerSpec;
use larder_model::{load_model, BatchSeq, DecoderModel, MlaCache, ModelLoad, RouteTrace, SequenceState, Wanted};
use larder_tensor::Mat;
use serde_json::Value;

pub fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

pub struct Reference {
    pub json: Value,
    pub logits: Vec<f32>,
    /// Empty where the fixture has no `logits_token_by_token` (no recurrent layers).
    pub token_by_token: Vec<f32>,
    pub vocab: usize,
}

pub fn reference(dir: &Path) -> Reference {
    let json: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let read = |name: &str| -> (Vec<f32>, usize) {
        let Ok(t) = st.tensor(name) else {
            return (Vec::new(), 0);
        };
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

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

pub fn bits(m: &Mat) -> Vec<u32> {
    m.as_slice().iter().map(|v| v.to_bits()).collect()
}

pub fn load(name: &str) -> DecoderModel {
    load_model(&fixture_dir(name), None).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Fixture `name` loaded with each cache layout it can use (both where it
/// has MLA layers), with a label naming the layout.
pub fn loads(name: &str) -> Vec<(String, DecoderModel)> {
    let dir = fixture_dir(name);
    let spec = larder_model::arch::read_spec(&dir).unwrap();
    let caches = match spec.layers.iter().any(|l| matches!(l.mixer, MixerSpec::Mla(_))) {
        true => vec![MlaCache::Compact, MlaCache::Expanded],
        false => vec![MlaCache::default()],
    };
    caches
        .into_iter()
        .map(|c| {
            let model = ModelLoad::new().mla_cache(c).load(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
            (format!("{name} ({c:?})"), model)
        })
        .collect()
}

pub fn prompt_of(name: &str) -> Vec<u32> {
    ids(&reference(&fixture_dir(name)).json["prompt_ids"])
}

/// Greedy ids: through the state (`use_state`), or recomputing the whole
/// sequence from a fresh state every step.
pub fn greedy(model: &DecoderModel, prompt: &[u32], n: usize, use_state: bool) -> Vec<u32> {
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

pub fn max_diff(got: &Mat, want: &[f32], vocab: usize) -> f32 {
    let mut worst = 0.0f32;
    for p in 0..got.rows() {
        for (a, b) in got.row(p).iter().zip(&want[p * vocab..(p + 1) * vocab]) {
            worst = worst.max((a - b).abs());
        }
    }
    worst
}

pub fn check_reference(name: &str) {
    for (label, model) in loads(name) {
        check_reference_of(name, &label, &model);
    }
}

fn check_reference_of(fixture: &str, name: &str, model: &DecoderModel) {
    let dir = fixture_dir(fixture);
    let r = reference(&dir);
    let prompt = ids(&r.json["prompt_ids"]);
    let mut state = model.new_state();
    let mut trace = RouteTrace::default();
    let logits = model.forward(&prompt, &mut state, Some(&mut trace)).unwrap();
    let chunked = max_diff(&logits, &r.logits, r.vocab);
    let recurrent = match r.token_by_token.is_empty() {
        true => 0.0,
        false => max_diff(&logits, &r.token_by_token, r.vocab),
    };
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
        greedy(model, &prompt, n, true),
        ids(&r.json["greedy_ids"]),
        "{name}: greedy through the state"
    );
    // Recomputed from scratch every step (the references without a cache
    // give one list for both).
    let no_cache = r.json.get("greedy_ids_no_cache").unwrap_or(&r.json["greedy_ids"]);
    assert_eq!(greedy(model, &prompt, n, false), ids(no_cache), "{name}: greedy recomputed");
}

/// A prompt prefilled token by token and in uneven chunks gives the one-pass
/// logits bit for bit.
pub fn check_prefill_chunking(name: &str) {
    for (label, model) in loads(name) {
        check_prefill_chunking_of(&prompt_of(name), &label, &model);
    }
}

fn check_prefill_chunking_of(prompt: &[u32], name: &str, model: &DecoderModel) {
    let whole = model.forward(prompt, &mut model.new_state(), None).unwrap();
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

/// Three sequences in one batch (a fresh prompt, one mid-prefill, one
/// decoding) give each one's logits and state bit for bit as alone.
pub fn check_batch_against_alone(name: &str) {
    for (label, model) in loads(name) {
        check_batch_against_alone_of(&prompt_of(name), &label, &model);
    }
}

fn check_batch_against_alone_of(prompt: &[u32], name: &str, model: &DecoderModel) {
    let vocab = model.spec().vocab_size as u32;
    let other: Vec<u32> = prompt.iter().rev().map(|&t| (t * 7 + 3) % vocab).collect();
    let prefixes: [&[u32]; 3] = [&[], &other[..5], prompt];
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

pub fn copy_fixture(name: &str, tag: &str) -> PathBuf {
    let src = fixture_dir(name);
    let dst = std::env::temp_dir().join(format!("larder-{name}-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    dst
}

pub fn edit(dir: &Path, f: impl FnOnce(&mut Value)) {
    let p = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, v.to_string()).unwrap();
}

pub fn load_error(dir: &Path) -> String {
    let e = match load_model(dir, None) {
        Ok(_) => panic!("{} should not load", dir.display()),
        Err(e) => e.to_string(),
    };
    std::fs::remove_dir_all(dir).unwrap();
    e
}

/// The safetensors file of `dir` holding tensor `name` (model.safetensors,
/// or the shard model.safetensors.index.json names).
pub fn shard_of(dir: &Path, name: &str) -> PathBuf {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return single;
    }
    let index: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("model.safetensors.index.json")).unwrap()).unwrap();
    dir.join(
        index["weight_map"][name]
            .as_str()
            .unwrap_or_else(|| panic!("no shard holds {name}")),
    )
}

/// Rewrites `dir`'s checkpoint without the tensor `dropped`.
pub fn drop_tensor(dir: &Path, dropped: &str) {
    let path = shard_of(dir, dropped);
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<_> = st.tensors().into_iter().filter(|(n, _)| n != dropped).collect();
    std::fs::write(&path, safetensors::serialize(kept, None).unwrap()).unwrap();
}

/// Rewrites tensor `name`'s bytes with `f` (same dtype and shape).
pub fn rewrite_tensor(dir: &Path, name: &str, f: impl FnOnce(&mut Vec<u8>)) {
    let path = shard_of(dir, name);
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap();
    let mut data = t.data().to_vec();
    f(&mut data);
    let changed = safetensors::tensor::TensorView::new(t.dtype(), t.shape().to_vec(), &data).unwrap();
    let mut tensors = st.tensors();
    for (n, v) in tensors.iter_mut() {
        if n == name {
            *v = changed.clone();
        }
    }
    std::fs::write(&path, safetensors::serialize(tensors, None).unwrap()).unwrap();
}

/// Each of `tensors` dropped from a copy of fixture `name` makes loading
/// fail with an error naming it.
pub fn check_missing_tensors_are_named(name: &str, tensors: &[&str]) {
    for (i, dropped) in tensors.iter().enumerate() {
        let dir = copy_fixture(name, &format!("missing{i}"));
        drop_tensor(&dir, dropped);
        let msg = load_error(&dir);
        assert!(msg.contains(dropped), "{name} without {dropped}: {msg}");
    }
}
