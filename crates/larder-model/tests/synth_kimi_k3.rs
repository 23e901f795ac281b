//! Synthetic Kimi K3 checkpoints (`larder synth --arch kimi_k3`): the
//! published layout, checked against fixtures/kimi_k3_tiny (the same
//! config.json keys at every level, the released quantization_config, the
//! same tensor names by layer kind and dtypes, the vision tower in a shard
//! of its own); the tiny preset loads (vision skipped), runs with finite
//! logits and spread routing, prefills as it decodes bit for bit; the
//! routing knobs work through the attention residuals.

mod synth_common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use larder_model::checkpoint::Checkpoint;
use larder_model::config::{FfnSpec, MixerSpec};
use larder_model::synth::{write, ExpertsFormat, Routing, SynthSpec};
use larder_model::{load_model, RouteTrace};
use serde_json::Value;

fn scratch(name: &str) -> PathBuf {
    synth_common::scratch("k3", name)
}

fn tiny(seed: u64) -> SynthSpec {
    synth_common::tiny("kimi_k3", seed)
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Every tensor of a checkpoint folder: name -> (shard file, dtype, shape).
fn tensors(dir: &Path) -> BTreeMap<String, (String, String, Vec<usize>)> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        if !file.starts_with("model-") || !file.ends_with(".safetensors") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (n, t) in st.tensors() {
            out.insert(n, (file.clone(), format!("{:?}", t.dtype()), t.shape().to_vec()));
        }
    }
    out
}

/// A tensor name with its layer's kind for the index (`layers.<kda|mla|dense>.`)
/// and the expert index dropped, so two checkpoints of different depths compare.
fn pattern(name: &str, kinds: &[&str]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut it = name.split('.').peekable();
    while let Some(p) = it.next() {
        parts.push(p.to_string());
        if p == "layers" || p == "experts" || p == "blocks" {
            if let Some(i) = it.next() {
                let kind = match (p, i.parse::<usize>()) {
                    ("layers", Ok(l)) => kinds.get(l).copied().unwrap_or("?").to_string(),
                    _ => "N".to_string(),
                };
                parts.push(kind);
            }
        }
    }
    parts.join(".")
}

/// Each layer's kind as the config makes it: `dense` (KDA with a dense
/// MLP, layer 0), `kda` or `mla` (with MoE).
fn kinds(dir: &Path) -> Vec<&'static str> {
    let spec = larder_model::arch::read_spec(dir).unwrap();
    spec.layers
        .iter()
        .map(|l| match (&l.mixer, &l.ffn) {
            (_, FfnSpec::Dense { .. }) => "dense",
            (MixerSpec::Kda(_), _) => "kda",
            _ => "mla",
        })
        .collect()
}

/// Keys of a JSON object (empty for anything else).
fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default()
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/kimi_k3_tiny")
}

#[test]
fn the_layout_is_the_published_one_as_the_fixture_has_it() {
    let dir = scratch("layout");
    let spec = tiny(0);
    let mut written = 0u64;
    write(&spec, &dir, &mut |b| written += b).unwrap();
    assert_eq!(written, spec.total_bytes().unwrap(), "progress counts every tensor byte");

    let (ours, theirs) = (json(&dir.join("config.json")), json(&fixture().join("config.json")));
    let mut top = keys(&theirs);
    top.insert("larder_synth".into());
    assert_eq!(keys(&ours), top, "top-level keys (+ larder_synth)");
    for key in ["text_config", "vision_config"] {
        assert_eq!(keys(&ours[key]), keys(&theirs[key]), "{key} keys");
    }
    let (t, f) = (&ours["text_config"], &theirs["text_config"]);
    assert_eq!(keys(&t["linear_attn_config"]), keys(&f["linear_attn_config"]));
    assert_eq!(
        t["quantization_config"], f["quantization_config"],
        "the released quantization_config"
    );
    for (field, value) in [
        ("hidden_act", serde_json::json!("situ")),
        ("activation_situ_beta", serde_json::json!(4.0)),
        ("activation_situ_linear_beta", serde_json::json!(25.0)),
        ("latent_moe_use_norm", serde_json::json!(true)),
        ("mla_use_output_gate", serde_json::json!(true)),
        ("routed_expert_hidden_size", serde_json::json!(32)),
        ("attn_res_block_size", serde_json::json!(3)),
    ] {
        assert_eq!(t[field], value, "text_config.{field}");
    }
    assert_eq!(t["linear_attn_config"]["use_full_rank_gate"], true);
    assert_eq!(t["linear_attn_config"]["gate_lower_bound"], -5.0);
    assert_eq!(
        t["linear_attn_config"]["full_attn_layers"],
        serde_json::json!([4, 6]),
        "every 4th and the last"
    );

    // Tensor names by layer kind, and their dtypes, as the fixture ships them.
    let (mine, fixture_tensors) = (tensors(&dir), tensors(&fixture()));
    let by_pattern = |t: &BTreeMap<String, (String, String, Vec<usize>)>, k: &[&str]| -> BTreeSet<(String, String)> {
        t.iter().map(|(n, (_, d, _))| (pattern(n, k), d.clone())).collect()
    };
    let (ka, kb) = (kinds(&dir), kinds(&fixture()));
    let (a, b) = (by_pattern(&mine, &ka), by_pattern(&fixture_tensors, &kb));
    let only_ours: Vec<_> = a.difference(&b).collect();
    let only_fixture: Vec<_> = b.difference(&a).collect();
    assert!(
        only_ours.is_empty() && only_fixture.is_empty(),
        "synth only: {only_ours:#?}\nfixture only: {only_fixture:#?}"
    );

    // A_log zero-padded to 64 values for 2 heads; the vision tower in the last shard, alone.
    let a_log = &mine["language_model.model.layers.0.self_attn.A_log"];
    assert_eq!((a_log.1.as_str(), a_log.2.clone()), ("F32", vec![64]));
    let last = "model-00008-of-00008.safetensors";
    let vision: BTreeSet<&str> = mine.iter().filter(|(_, t)| t.0 == last).map(|(n, _)| n.as_str()).collect();
    assert_eq!(vision.len(), 5, "{vision:?}");
    assert!(vision
        .iter()
        .all(|n| n.starts_with("vision_tower.") || n.starts_with("mm_projector.")));
    assert!(mine.keys().all(|n| n.starts_with("language_model.") || vision.contains(n.as_str())));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn tiny_kimi_k3_loads_skips_the_vision_tower_and_runs() {
    let dir = scratch("runs");
    let spec = tiny(3);
    write(&spec, &dir, &mut |_| {}).unwrap();

    let ckpt = Checkpoint::open(&dir).unwrap();
    let skipped: Vec<&str> = ckpt.skipped().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(skipped.len(), 5, "{skipped:?}");
    assert!(ckpt.has("model.embed_tokens.weight") && ckpt.has("lm_head.weight"));

    let model = load_model(&dir, None).unwrap();
    let s = model.spec();
    assert_eq!(s.model_type, "kimi_k3");
    let mla: Vec<usize> = (0..s.layers.len())
        .filter(|&l| matches!(s.layers[l].mixer, MixerSpec::Mla(_)))
        .collect();
    assert_eq!(mla, [3, 5], "MLA at 1-based 4 and the last layer");
    assert_eq!(s.attn_res_block, Some(3));

    // Greedy decoding: finite logits, routing spread over the experts.
    let mut state = model.new_state();
    let mut trace = RouteTrace::default();
    let mut tok = 5u32;
    for _ in 0..48 {
        let logits = model.forward_last(&[tok], &mut state, Some(&mut trace)).unwrap();
        assert!(logits.iter().all(|v| v.is_finite()), "finite logits");
        tok = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap() as u32;
    }
    assert_eq!(trace.layers.len(), 5, "layers 1..=5 are MoE");
    for (l, routes) in &trace.layers {
        let used: BTreeSet<usize> = routes.iter().flat_map(|r| r.experts.iter().copied()).collect();
        assert!(used.len() >= 12, "layer {l} uses {} of 16 experts", used.len());
    }
    let (overlap, _) = trace.consecutive_overlap();
    assert!(overlap < 3.0 * 4.0 / 16.0, "consecutive tokens share few experts: {overlap}");

    // One pass over a prompt = token by token, bit for bit.
    let prompt = [5u32, 17, 42, 99, 3, 250, 7];
    let whole = model.forward(&prompt, &mut model.new_state(), None).unwrap();
    let mut state = model.new_state();
    for (p, &id) in prompt.iter().enumerate() {
        let row = model.forward(&[id], &mut state, None).unwrap();
        let same = row.row(0).iter().zip(whole.row(p)).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "position {p}: token by token = one pass");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bf16_experts_and_fewer_layers_and_experts_load() {
    let dir = scratch("bf16");
    let mut spec = tiny(5);
    spec.set_experts_format(ExpertsFormat::Bf16).unwrap();
    (spec.layers, spec.experts) = (4, 8);
    write(&spec, &dir, &mut |_| {}).unwrap();
    let config = json(&dir.join("config.json"));
    assert!(
        config["text_config"].get("quantization_config").is_none(),
        "bf16 experts: no quantization_config"
    );
    let model = load_model(&dir, None).unwrap();
    let logits = model.forward(&[1, 2, 3], &mut model.new_state(), None).unwrap();
    assert!(logits.as_slice().iter().all(|v| v.is_finite()));
    assert!(spec.set_experts_format(ExpertsFormat::Int4).is_err(), "K3 ships MXFP4 (or bf16)");
    std::fs::remove_dir_all(dir).unwrap();
}

use synth_common::overlap;

#[test]
fn routing_knobs_apply_through_the_attention_residuals() {
    let (u, k, l) = (scratch("uniform"), scratch("skewed"), scratch("local"));
    write(&tiny(1), &u, &mut |_| {}).unwrap();
    let mut skewed = tiny(1);
    skewed.routing = Routing::Skewed;
    write(&skewed, &k, &mut |_| {}).unwrap();
    let mut local = tiny(1);
    local.routing = Routing::Local;
    write(&local, &l, &mut |_| {}).unwrap();
    let (ou, ok, ol) = (overlap(&u), overlap(&k), overlap(&l));
    assert!(ok > ou && ol > ou, "skewed {ok} and local {ol} > uniform {ou}");
    let config = json(&k.join("config.json"));
    assert_eq!(config["larder_synth"]["routing"], "skewed");
    for d in [u, k, l] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn latent_experts_are_refused_outside_the_kimi_layouts() {
    for (arch, latent, norm) in [
        ("deepseek_v3", Some(32), false),
        ("kimi_linear", Some(0), false),
        ("kimi_linear", None, true),
    ] {
        let mut spec = SynthSpec::preset(arch, "tiny", None).unwrap();
        spec.routed_expert_hidden_size = latent;
        spec.latent_moe_use_norm = norm;
        let dir = scratch(&format!("latent-{arch}-{norm}"));
        let e = write(&spec, &dir, &mut |_| {}).unwrap_err().to_string();
        assert!(
            e.contains("routed_expert_hidden_size") || e.contains("latent_moe_use_norm"),
            "{arch}: {e}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
    let err = SynthSpec::preset("kimi_k3", "k3-mini", None).unwrap_err();
    assert!(err.contains("tiny") && err.contains("k3"), "{err}");
}
