//! Upcycling a dense checkpoint (fixtures/llama_tiny, f32) into a Mixtral
//! MoE: the upcycled model's logits equal the dense model's within f32
//! rounding (max abs diff below 1e-4 x the largest |logit|) with the same
//! argmax at every position, while the random router does route different
//! tokens to different experts; bad sources and flags are refused with the
//! field named; an interrupted upcycle is not loadable.

use std::path::{Path, PathBuf};

use larder_model::{load_model, RouteTrace};
use larder_model::{upcycle, UpcycleLayout, UpcycleReport, UpcycleSpec};
use serde_json::Value;

fn llama_tiny() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/llama_tiny")
}

/// A fresh, empty scratch folder.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("larder-upcycle-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn spec(source: &Path, out: &Path, experts: usize, top_k: usize, layout: UpcycleLayout) -> UpcycleSpec {
    UpcycleSpec {
        source: source.to_path_buf(),
        out: out.to_path_buf(),
        experts,
        top_k,
        layout,
        seed: 3,
    }
}

fn run(spec: &UpcycleSpec) -> Result<UpcycleReport, larder_model::ModelError> {
    upcycle(spec, &mut |_, _| {})
}

#[test]
fn upcycled_llama_computes_the_dense_logits() {
    let dir = scratch("exact");
    let out = dir.join("moe");
    let mut last = (0, 0);
    let report = upcycle(&spec(&llama_tiny(), &out, 4, 2, UpcycleLayout::Mixtral), &mut |d, t| {
        assert!(d >= last.0 && d <= t);
        last = (d, t);
    })
    .unwrap();
    assert_eq!(last.0, last.1, "progress ends at its total");
    assert_eq!((report.layers, report.experts, report.top_k, report.layout), (2, 4, 2, "mixtral"));
    assert_eq!(report.source_model_type, "llama");
    assert_eq!(report.expert_bytes, 3 * 64 * 128 * 4);
    assert_eq!(report.bank_bytes, 2 * 4 * report.expert_bytes);
    let files: u64 = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert_eq!(files, report.total_bytes);
    assert!(out.join("generation_config.json").exists());
    let cfg: Value = serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["model_type"], "mixtral");
    assert_eq!(cfg["num_local_experts"], 4);
    assert_eq!(cfg["sliding_window"], Value::Null);

    let dense = load_model(&llama_tiny(), None).unwrap();
    let moe = load_model(&out, None).unwrap();
    let ids: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 512).collect();
    let a = dense.forward(&ids, &mut dense.new_state(), None).unwrap();
    let mut trace = RouteTrace::default();
    let b = moe.forward(&ids, &mut moe.new_state(), Some(&mut trace)).unwrap();
    let scale = a.row(0).iter().chain(a.row(ids.len() - 1)).fold(0f32, |m, x| m.max(x.abs()));
    let mut worst = 0f32;
    for p in 0..ids.len() {
        let diff = a.row(p).iter().zip(b.row(p)).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(diff <= 1e-4 * scale, "position {p}: max |diff| {diff} vs logit scale {scale}");
        assert_eq!(argmax(a.row(p)), argmax(b.row(p)), "argmax at position {p}");
        worst = worst.max(diff);
    }
    eprintln!(
        "upcycled llama_tiny: max |logit diff| {worst:e} over {} positions (logit scale {scale})",
        ids.len()
    );
    // The router is random, not constant: tokens do not all pick the same experts.
    for routes in trace.layers.values() {
        let first = &routes[0].experts;
        assert!(routes.iter().any(|r| &r.experts != first), "every token chose the same experts");
    }

    // Deterministic: the same seed writes the same bytes.
    let again = dir.join("again");
    run(&spec(&llama_tiny(), &again, 4, 2, UpcycleLayout::Mixtral)).unwrap();
    let shard = "model-00001-of-00001.safetensors";
    assert_eq!(std::fs::read(out.join(shard)).unwrap(), std::fs::read(again.join(shard)).unwrap());
    // An existing checkpoint is not overwritten.
    let err = run(&spec(&llama_tiny(), &out, 4, 2, UpcycleLayout::Mixtral))
        .unwrap_err()
        .to_string();
    assert!(err.contains("already holds a checkpoint"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

fn argmax(v: &[f32]) -> usize {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b })
}

/// llama_tiny with `field` of config.json set to `value`, in a scratch folder.
fn patched_source(name: &str, field: &str, value: Value) -> PathBuf {
    let dir = scratch(name);
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(llama_tiny().join("config.json")).unwrap()).unwrap();
    cfg[field] = value;
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(llama_tiny().join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    dir
}

#[test]
fn unsuitable_sources_and_flags_are_refused() {
    let cases = [
        (
            "gpt2",
            "model_type",
            Value::from("gpt2"),
            UpcycleLayout::Mixtral,
            "not a Llama-family dense model",
        ),
        (
            "bias",
            "attention_bias",
            Value::from(true),
            UpcycleLayout::Mixtral,
            "attention_bias",
        ),
        ("mlpbias", "mlp_bias", Value::from(true), UpcycleLayout::Mixtral, "mlp_bias"),
        ("gelu", "hidden_act", Value::from("gelu"), UpcycleLayout::Mixtral, "hidden_act"),
        (
            "qwen",
            "model_type",
            Value::from("llama"),
            UpcycleLayout::Qwen3Moe,
            "use the mixtral layout",
        ),
    ];
    for (name, field, value, layout, want) in cases {
        let src = patched_source(name, field, value);
        let out = src.join("out");
        let err = run(&spec(&src, &out, 4, 2, layout)).unwrap_err().to_string();
        assert!(err.contains(want) && err.contains("cannot upcycle"), "{name}: {err}");
        assert!(!out.exists(), "{name}: nothing is written for a refused source");
        std::fs::remove_dir_all(src).unwrap();
    }
    let dir = scratch("flags");
    for (experts, top_k, want) in [(4, 5, "--top-k"), (4, 0, "--top-k"), (0, 1, "--experts")] {
        let err = run(&spec(&llama_tiny(), &dir.join("out"), experts, top_k, UpcycleLayout::Mixtral))
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "experts {experts} top_k {top_k}: {err}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn an_interrupted_upcycle_is_not_loadable() {
    // Stop the upcycle as the first shard is half written (a panic in the
    // progress callback stands for a crash or a kill).
    let dir = scratch("interrupted");
    let out = dir.join("moe");
    let s = spec(&llama_tiny(), &out, 4, 2, UpcycleLayout::Mixtral);
    let crashed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        upcycle(&s, &mut |d, t| assert!(d < t / 2, "simulated crash"))
    }));
    assert!(crashed.is_err());
    assert!(!out.join("config.json").exists());
    assert!(out.join("model-00001-of-00001.safetensors.partial").exists());
    let err = load_model(&out, None)
        .err()
        .expect("an interrupted upcycle must not load")
        .to_string();
    assert!(err.contains("config.json"), "{err}");
    // Running again completes it.
    run(&s).unwrap();
    load_model(&out, None).unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn synth_progress_total_counts_every_byte_written() {
    // `larder synth`'s progress bar total: every tensor byte, spine included.
    let dir = scratch("synth-total");
    let spec = larder_model::synth::SynthSpec::preset("qwen3_moe", "tiny", None).unwrap();
    let mut written = 0u64;
    larder_model::synth::write(&spec, &dir, &mut |b| written += b).unwrap();
    assert_eq!(written, spec.total_bytes().unwrap());
    assert!(spec.total_bytes().unwrap() > spec.total_expert_bytes());
    std::fs::remove_dir_all(dir).unwrap();
}

/// A dense Qwen3 source: llama_tiny's tensors plus per-head q/k norms, `model_type: qwen3`.
fn qwen3_source(dir: &Path) {
    use safetensors::tensor::{Dtype, TensorView};
    let bytes = std::fs::read(llama_tiny().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let norm: Vec<u8> = (0..16).flat_map(|i| (1.0f32 + i as f32 / 32.0).to_le_bytes()).collect();
    let mut views: Vec<(String, TensorView)> = st.tensors();
    for l in 0..2 {
        for n in ["q_norm", "k_norm"] {
            let v = TensorView::new(Dtype::F32, vec![16], &norm).unwrap();
            views.push((format!("model.layers.{l}.self_attn.{n}.weight"), v));
        }
    }
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(llama_tiny().join("config.json")).unwrap()).unwrap();
    cfg["model_type"] = "qwen3".into();
    cfg["architectures"] = serde_json::json!(["Qwen3ForCausalLM"]);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
}

#[test]
fn upcycled_qwen3_matches_its_single_expert_form() {
    // larder runs no dense Qwen3, but one expert at top-1 (routing weight
    // exactly 1) computes the dense MLP exactly: 4 experts top-2 must match it.
    let dir = scratch("qwen3");
    qwen3_source(&dir);
    let err = run(&spec(&dir, &dir.join("x"), 4, 2, UpcycleLayout::Mixtral))
        .unwrap_err()
        .to_string();
    assert!(err.contains("qwen3_moe layout"), "{err}");
    let one = dir.join("one");
    run(&spec(&dir, &one, 1, 1, UpcycleLayout::Qwen3Moe)).unwrap();
    let four = dir.join("four");
    let report = run(&spec(&dir, &four, 4, 2, UpcycleLayout::Qwen3Moe)).unwrap();
    assert_eq!((report.layout, report.source_model_type.as_str()), ("qwen3_moe", "qwen3"));
    let cfg: Value = serde_json::from_str(&std::fs::read_to_string(four.join("config.json")).unwrap()).unwrap();
    assert_eq!((&cfg["num_experts"], &cfg["norm_topk_prob"]), (&Value::from(4), &Value::from(true)));
    let (a, b) = (load_model(&one, None).unwrap(), load_model(&four, None).unwrap());
    assert!(a.spec().qk_norm);
    let ids: Vec<u32> = (0..16).map(|i| (i * 53 + 11) % 512).collect();
    let la = a.forward(&ids, &mut a.new_state(), None).unwrap();
    let lb = b.forward(&ids, &mut b.new_state(), None).unwrap();
    for p in 0..ids.len() {
        let scale = la.row(p).iter().fold(0f32, |m, x| m.max(x.abs()));
        let diff = la.row(p).iter().zip(lb.row(p)).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(diff <= 1e-4 * scale, "position {p}: max |diff| {diff}, scale {scale}");
        assert_eq!(argmax(la.row(p)), argmax(lb.row(p)), "argmax at position {p}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}
