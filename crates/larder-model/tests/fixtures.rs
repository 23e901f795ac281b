//! Reference tests: every fixture under `fixtures/` (tiny checkpoints written
//! by `scripts/gen_fixtures.py` with transformers) must give the same logits
//! (within 1e-4), the same routing and the same greedy ids, and prefill must
//! be bit-identical whether chunked or token by token. Fixtures with MLA
//! layers pass it with either [`MlaCache`].

use std::path::{Path, PathBuf};

use larder_model::config::MixerSpec;
use larder_model::{DecoderModel, MlaCache, ModelLoad, RouteTrace};
use serde_json::Value;

const FIXTURES: &[&str] = &[
    "qwen3_moe_tiny",
    "qwen3_moe_tok",
    "qwen3_moe_bf16_long",
    "qwen2_moe_tiny",
    "mixtral_tiny",
    "llama_tiny",
    "deepseek_v3_tiny",
    "deepseek_v3_noq_yarn",
    "kimi_k2_tiny",
    "deepseek_v3_fp8",
    "deepseek_v3_tok",
    // compressed-tensors 4-bit experts (INT4 pack-quantized, MXFP4).
    "deepseek_v3_int4",
    "deepseek_v3_mxfp4",
    // Recurrent (KDA) layers cannot truncate: tested in tests/kimi_linear.rs.
    "kimi_linear_tiny",
    "kimi_linear_mla_first",
    // Kimi K3 as published (wrapper, SiTU, latent experts, attention
    // residuals, gates, MXFP4 experts): also tests/kimi_k3.rs.
    "kimi_k3_tiny",
    "kimi_k3_plain",
    // gpt-oss (sinks, sliding/full layers, fused biased experts): also tests/gpt_oss.rs.
    "gpt_oss_bf16",
    // gpt-oss as shipped: MXFP4 experts (blocks + e8m0 scales); also tests/gpt_oss.rs.
    "gpt_oss_tiny",
];

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

struct Reference {
    json: Value,
    logits: Vec<f32>,
    vocab: usize,
}

fn reference(dir: &Path) -> Reference {
    let json: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("logits").unwrap();
    let vocab = t.shape()[1];
    let logits = t
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Reference { json, logits, vocab }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn eos_ids(dir: &Path) -> Vec<u32> {
    let g: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("generation_config.json")).unwrap()).unwrap();
    match &g["eos_token_id"] {
        Value::Array(a) => a.iter().map(|x| x.as_u64().unwrap() as u32).collect(),
        Value::Number(n) => vec![n.as_u64().unwrap() as u32],
        _ => vec![],
    }
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

fn greedy(model: &DecoderModel, prompt: &[u32], n: usize, eos: &[u32], use_cache: bool) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    let mut state = model.new_state();
    let mut out = Vec::new();
    let mut logits = model.forward_last(prompt, &mut state, None).unwrap();
    for _ in 0..n {
        let next = argmax(&logits);
        out.push(next);
        seq.push(next);
        if eos.contains(&next) {
            break;
        }
        logits = if use_cache {
            model.forward_last(&[next], &mut state, None).unwrap()
        } else {
            let mut fresh = model.new_state();
            model.forward_last(&seq, &mut fresh, None).unwrap()
        };
    }
    out
}

/// Both cache layouts where the fixture has MLA layers, else the default.
fn caches(dir: &Path) -> Vec<MlaCache> {
    let spec = larder_model::arch::read_spec(dir).unwrap();
    match spec.layers.iter().any(|l| matches!(l.mixer, MixerSpec::Mla(_))) {
        true => vec![MlaCache::Compact, MlaCache::Expanded],
        false => vec![MlaCache::default()],
    }
}

fn check_fixture(name: &str) {
    for cache in caches(&fixture_dir(name)) {
        check_fixture_with(name, cache);
    }
}

fn check_fixture_with(fixture: &str, cache: MlaCache) {
    let dir = fixture_dir(fixture);
    let name = &format!("{fixture} ({cache:?})");
    let model = ModelLoad::new()
        .mla_cache(cache)
        .load(&dir)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let r = reference(&dir);
    let prompt = ids(&r.json["prompt_ids"]);

    // Logits of one whole-prompt forward, with the routes it took.
    let mut state = model.new_state();
    let mut trace = RouteTrace::default();
    let logits = model.forward(&prompt, &mut state, Some(&mut trace)).unwrap();
    let positions: Vec<usize> = r.json["logit_positions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap() as usize)
        .collect();
    let mut worst = 0.0f32;
    for (i, &p) in positions.iter().enumerate() {
        let want = &r.logits[i * r.vocab..(i + 1) * r.vocab];
        for (a, b) in logits.row(p).iter().zip(want) {
            worst = worst.max((a - b).abs());
        }
    }
    eprintln!(
        "{name}: max |logit diff| {worst:.2e}, {} KV bytes per token",
        model.kv_bytes_per_token()
    );
    assert!(worst <= 1e-4, "{name}: max |logit diff| {worst} > 1e-4");
    assert_eq!(model.kv_bytes_per_token(), model.spec().kv_bytes_per_token(cache), "{name}");

    // Routing: identical experts in router order, weights within tolerance.
    let routing = r.json["routing"].as_object().unwrap();
    assert_eq!(routing.len(), trace.layers.len(), "{name}: number of MoE layers");
    for (layer, rows) in routing {
        let l: usize = layer.parse().unwrap();
        let got = &trace.layers[&l];
        let weights = &r.json["routing_weights"][layer];
        for (p, row) in rows.as_array().unwrap().iter().enumerate() {
            let want: Vec<usize> = row.as_array().unwrap().iter().map(|e| e.as_u64().unwrap() as usize).collect();
            assert_eq!(got[p].experts, want, "{name}: layer {l} position {p} experts");
            for (g, w) in got[p].weights.iter().zip(weights[p].as_array().unwrap()) {
                assert!(
                    (g - w.as_f64().unwrap() as f32).abs() < 1e-5,
                    "{name}: layer {l} position {p} weight"
                );
            }
        }
    }

    // Greedy ids, with and without the KV cache.
    let eos = eos_ids(&dir);
    let n = ids(&r.json["greedy_ids"]).len().max(8);
    let want = ids(&r.json["greedy_ids"]);
    assert_eq!(greedy(&model, &prompt, 8.min(n), &eos, true), want, "{name}: greedy ids with cache");
    let want_nc = ids(&r.json["greedy_ids_no_cache"]);
    assert_eq!(greedy(&model, &prompt, 8, &eos, false), want_nc, "{name}: greedy ids without cache");

    // Batch invariance: token-by-token and uneven chunks give bit-identical logits.
    let mut one = model.new_state();
    for (p, &id) in prompt.iter().enumerate() {
        let l = model.forward(&[id], &mut one, None).unwrap();
        assert_eq!(l.row(0), logits.row(p), "{name}: position {p} token-by-token vs whole prompt");
    }
    let mut chunked = model.new_state();
    let split = prompt.len() / 3 + 1;
    let a = model.forward(&prompt[..split], &mut chunked, None).unwrap();
    let b = model.forward(&prompt[split..], &mut chunked, None).unwrap();
    for p in 0..prompt.len() {
        let row = if p < split { a.row(p) } else { b.row(p - split) };
        assert_eq!(row, logits.row(p), "{name}: position {p} chunked vs whole prompt");
    }

    // Rolling back restores the state before the dropped positions.
    let mut state = model.new_state();
    model.forward(&prompt, &mut state, None).unwrap();
    state.rollback(split).unwrap();
    let again = model.forward(&prompt[split..], &mut state, None).unwrap();
    assert_eq!(again, b, "{name}: logits after rollback differ from a fresh run");
}

macro_rules! fixture_tests {
    ($($name:ident),*) => { $( #[test] fn $name() { check_fixture(stringify!($name)); } )* };
}

fixture_tests!(
    qwen3_moe_tiny,
    qwen3_moe_tok,
    qwen3_moe_bf16_long,
    qwen2_moe_tiny,
    mixtral_tiny,
    llama_tiny,
    deepseek_v3_tiny,
    deepseek_v3_noq_yarn,
    deepseek_v3_fp8,
    deepseek_v3_tok,
    deepseek_v3_int4,
    deepseek_v3_mxfp4,
    kimi_k2_tiny,
    gpt_oss_bf16,
    gpt_oss_tiny
);

#[test]
fn every_fixture_is_listed() {
    let mut found: Vec<String> = std::fs::read_dir(fixture_dir(""))
        .unwrap()
        .flatten()
        // Model fixtures (a tokenizer-only fixture has no config.json).
        .filter(|e| e.path().join("reference.json").exists() && e.path().join("config.json").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    let mut listed: Vec<String> = FIXTURES.iter().map(|s| s.to_string()).collect();
    listed.sort();
    assert_eq!(found, listed);
}
