//! Synthetic `kimi_linear` checkpoints (`larder_model::synth`): the layout
//! loads (KDA and MLA in the K3 ratio, dense first layer, f32 gate tensors),
//! runs with finite logits and spread routing, is seed-deterministic byte
//! for byte, and `--experts-gib` sizes the expert bank to whole MoE layers;
//! K3's latent experts (`routed_expert_hidden_size`, with
//! `latent_moe_use_norm`) are written at their width, under K3's names, and
//! load.

mod synth_common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use larder_model::config::MixerSpec;
use larder_model::synth::{write, Routing, SynthSpec};
use larder_model::{load_model, RouteTrace};

fn scratch(name: &str) -> PathBuf {
    synth_common::scratch("kimi", name)
}

fn tiny(seed: u64) -> SynthSpec {
    synth_common::tiny("kimi_linear", seed)
}

/// Every file of a checkpoint folder, by name, with its bytes.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    v.sort();
    v
}

/// Every tensor's (name, dtype, shape, byte length) over a checkpoint's shards.
fn tensors(dir: &Path) -> Vec<(String, String, Vec<usize>, usize)> {
    let mut v = Vec::new();
    for (name, bytes) in files(dir) {
        if !name.ends_with(".safetensors") {
            continue;
        }
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (n, t) in st.tensors() {
            v.push((n, format!("{:?}", t.dtype()), t.shape().to_vec(), t.data().len()));
        }
    }
    v
}

#[test]
fn tiny_kimi_linear_loads_with_the_k3_layer_ratio_and_runs() {
    let dir = scratch("runs");
    let spec = tiny(3);
    let mut written = 0u64;
    write(&spec, &dir, &mut |b| written += b).unwrap();
    assert_eq!(written, spec.total_bytes().unwrap(), "progress counts every tensor byte");

    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["model_type"], "kimi_linear");
    assert_eq!(config["linear_attn_config"]["kda_layers"], serde_json::json!([1, 2, 3, 5]));
    assert_eq!(config["linear_attn_config"]["full_attn_layers"], serde_json::json!([4]));
    assert_eq!(config["q_lora_rank"], serde_json::Value::Null);
    let dtypes: Vec<_> = tensors(&dir)
        .into_iter()
        .filter(|(_, d, _, _)| d != "BF16")
        .map(|(n, d, _, _)| (n, d))
        .collect();
    for suffix in ["A_log", "dt_bias", "gate.weight", "e_score_correction_bias"] {
        assert!(
            dtypes.iter().any(|(n, d)| n.ends_with(suffix) && d == "F32"),
            "{suffix} in f32: {dtypes:?}"
        );
    }

    let model = load_model(&dir, None).unwrap();
    let kinds: Vec<bool> = model.spec().layers.iter().map(|l| matches!(l.mixer, MixerSpec::Kda(_))).collect();
    assert_eq!(kinds, [true, true, true, false, true], "MLA is the 4th layer only");

    // Greedy decoding: finite logits, and routing spread over the experts.
    let mut state = model.new_state();
    let mut trace = RouteTrace::default();
    let mut tok = 5u32;
    for _ in 0..48 {
        let logits = model.forward_last(&[tok], &mut state, Some(&mut trace)).unwrap();
        assert!(logits.iter().all(|v| v.is_finite()), "finite logits");
        tok = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap() as u32;
    }
    assert_eq!(trace.layers.len(), 4, "layers 1..=4 are MoE");
    for (l, routes) in &trace.layers {
        let used: BTreeSet<usize> = routes.iter().flat_map(|r| r.experts.iter().copied()).collect();
        assert!(used.len() >= 12, "layer {l} uses {} of 16 experts", used.len());
    }
    let (overlap, _) = trace.consecutive_overlap();
    assert!(overlap < 3.0 * 2.0 / 16.0, "consecutive tokens share few experts: {overlap}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn latent_experts_are_written_at_their_width_and_load() {
    let dir = scratch("latent");
    let mut spec = tiny(4);
    spec.routed_expert_hidden_size = Some(24);
    spec.latent_moe_use_norm = true;
    let mut written = 0u64;
    write(&spec, &dir, &mut |b| written += b).unwrap();
    assert_eq!(written, spec.total_bytes().unwrap());
    assert_eq!(spec.expert_bytes(), 3 * 32 * 24 * 2);
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["routed_expert_hidden_size"], 24);
    assert_eq!(config["latent_moe_use_norm"], true);
    let shapes: std::collections::BTreeMap<String, Vec<usize>> = tensors(&dir).into_iter().map(|(n, _, shape, _)| (n, shape)).collect();
    let block = "model.layers.2.block_sparse_moe";
    assert_eq!(shapes[&format!("{block}.routed_expert_down_proj.weight")], [24, 64]);
    assert_eq!(shapes[&format!("{block}.routed_expert_up_proj.weight")], [64, 24]);
    assert_eq!(shapes[&format!("{block}.routed_expert_norm.weight")], [24]);
    assert_eq!(shapes[&format!("{block}.experts.7.w1.weight")], [32, 24]);
    assert_eq!(shapes[&format!("{block}.experts.7.w2.weight")], [24, 32]);
    assert_eq!(
        shapes[&format!("{block}.gate.weight")],
        [16, 64],
        "the router sees the full hidden state"
    );
    assert!(
        !shapes
            .keys()
            .any(|n| n.starts_with("model.layers.0.") && n.contains("routed_expert")),
        "dense layers have none"
    );

    let model = load_model(&dir, None).unwrap();
    let prompt = [5u32, 17, 42, 99, 3, 250, 7];
    let whole = model.forward(&prompt, &mut model.new_state(), None).unwrap();
    assert!(whole.as_slice().iter().all(|v| v.is_finite()));
    let mut state = model.new_state();
    for (p, &id) in prompt.iter().enumerate() {
        let row = model.forward(&[id], &mut state, None).unwrap();
        let same = row.row(0).iter().zip(whole.row(p)).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "position {p}: token by token = one pass");
    }
    std::fs::remove_dir_all(dir).unwrap();

    // Only the Kimi layouts write latent experts, at a positive width.
    for (arch, latent) in [("deepseek_v3", 8), ("kimi_linear", 0)] {
        let mut spec = SynthSpec::preset(arch, "tiny", None).unwrap();
        spec.routed_expert_hidden_size = Some(latent);
        let dir = scratch(&format!("latent-{arch}"));
        let e = write(&spec, &dir, &mut |_| {}).unwrap_err().to_string();
        assert!(e.contains("routed_expert_hidden_size"), "{arch}: {e}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}

use synth_common::overlap;

#[test]
fn skewed_routing_reuses_more_experts_than_uniform() {
    let (u, k) = (scratch("uniform"), scratch("skewed"));
    write(&tiny(1), &u, &mut |_| {}).unwrap();
    let mut skewed = tiny(1);
    skewed.routing = Routing::Skewed;
    write(&skewed, &k, &mut |_| {}).unwrap();
    let (ou, ok) = (overlap(&u), overlap(&k));
    assert!(ok > ou, "skewed {ok} > uniform {ou}");
    for d in [u, k] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn the_same_seed_writes_the_same_bytes_and_another_seed_does_not() {
    let (a, b, c) = (scratch("seed-a"), scratch("seed-b"), scratch("seed-c"));
    write(&tiny(7), &a, &mut |_| {}).unwrap();
    write(&tiny(7), &b, &mut |_| {}).unwrap();
    write(&tiny(8), &c, &mut |_| {}).unwrap();
    let (fa, fb, fc) = (files(&a), files(&b), files(&c));
    assert_eq!(fa.len(), 9, "6 shards, index, generation config, config");
    assert!(fa == fb, "same seed, same bytes in every file");
    let shards_differ = fa
        .iter()
        .zip(&fc)
        .filter(|((n, _), _)| n.ends_with(".safetensors"))
        .all(|((_, x), (_, y))| x != y);
    assert!(shards_differ, "another seed changes every shard");
    for d in [a, b, c] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn experts_gib_sizes_the_bank_to_whole_moe_layers() {
    // The documented tolerance: the bank is rounded to whole MoE layers, so it
    // is within half a layer's bank of the request (plus the dense first layer).
    for gib in [4.0, 8.0, 16.0] {
        let spec = SynthSpec::preset("kimi_linear", "k3-mini", Some(gib)).unwrap();
        let layer_bank = (spec.experts * spec.expert_bytes()) as f64;
        let want = gib * (1u64 << 30) as f64;
        let got = spec.total_expert_bytes() as f64;
        assert!((got - want).abs() <= layer_bank / 2.0, "{gib} GiB: {got} bytes");
        assert_eq!(spec.layers, spec.moe_layers() + 1, "one dense first layer");
        assert_eq!(spec.expert_bytes(), 3 * 2048 * 1408 * 2, "17.3 MB experts");
    }
    // Written: the expert tensors on disk are exactly the bank the spec reports.
    let dir = scratch("gib");
    let spec = SynthSpec::preset("kimi_linear", "tiny", Some(0.001)).unwrap();
    assert_eq!(spec.layers, 6, "1 MiB of 192 KiB layers: 5 MoE layers and the dense one");
    write(&spec, &dir, &mut |_| {}).unwrap();
    let expert_bytes: usize = tensors(&dir)
        .iter()
        .filter(|(n, _, _, _)| n.contains(".block_sparse_moe.experts."))
        .map(|t| t.3)
        .sum();
    assert_eq!(expert_bytes as u64, spec.total_expert_bytes());
    let model = load_model(&dir, None).unwrap();
    let mla: Vec<usize> = (0..6)
        .filter(|&l| matches!(model.spec().layers[l].mixer, MixerSpec::Mla(_)))
        .collect();
    assert_eq!(mla, [3], "MLA at 1-based layer 4 only");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn unknown_architectures_and_presets_are_refused_by_name() {
    let err = SynthSpec::preset("kimi_k4", "tiny", None).unwrap_err();
    assert!(
        err.contains("kimi_k4") && err.contains("kimi_linear") && err.contains("kimi_k3"),
        "{err}"
    );
    let err = SynthSpec::preset("kimi_linear", "huge", None).unwrap_err();
    assert!(err.contains("huge") && err.contains("k3-mini"), "{err}");
    assert!(SynthSpec::preset("kimi_linear", "tiny", Some(0.0)).is_err());
}
