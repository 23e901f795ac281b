//! Kimi K3 as published (`model_type: kimi_k3` wrapping a `kimi_linear`
//! text model) against the f32 numpy reference transcribed from Moonshot's
//! `modeling_kimi_linear.py` (scripts/fixtures_kimi_k3.py):
//! `fixtures/kimi_k3_tiny` (every K3 feature on: SiTU with both clips,
//! MXFP4 latent experts with the latent norm, attention residuals over three
//! blocks, the lower-bounded KDA gate and full-rank output gate, the MLA
//! output gate, a padded `A_log`, vision tensors to skip) and
//! `fixtures/kimi_k3_plain` (the other options: SiTU with `beta` 0 → 1 and
//! no up clip, bf16 experts at hidden width, softplus gate, low-rank gates,
//! grouped routing). Logits within 1e-4, routing and greedy ids equal; each
//! feature switched off moves the logits far beyond the tolerance; bad
//! inputs are named.

mod kimi_common;

use std::path::Path;

use kimi_common::{check_reference, copy_fixture, edit, fixture_dir, load_error, max_diff, reference};
use larder_model::checkpoint::Checkpoint;
use larder_model::config::{FfnSpec, MixerSpec};
use larder_model::{DecoderModel, ModelError, ModelSpec, Weight, WeightRequest, WeightSource};
use larder_tensor::GluActivation;
use serde_json::Value;

#[test]
fn tiny_matches_the_reference() {
    check_reference("kimi_k3_tiny");
}

#[test]
#[ignore]
fn print_diffs() {
    for name in ["kimi_k3_tiny", "kimi_k3_plain"] {
        let r = reference(&fixture_dir(name));
        for (label, model) in kimi_common::loads(name) {
            let prompt = kimi_common::prompt_of(name);
            let logits = model.forward(&prompt, &mut model.new_state(), None).unwrap();
            let per: Vec<String> = (0..prompt.len())
                .map(|p| format!("{:.1e}", max_diff(&logits.gather_rows(&[p]), &r.logits[p * r.vocab..], r.vocab)))
                .collect();
            eprintln!("{label}: {}", per.join(" "));
        }
    }
}

#[test]
fn plain_matches_the_reference() {
    check_reference("kimi_k3_plain");
}

/// The vision tower's tensors (in a text shard and a shard of their own)
/// are recognised and set aside, never read.
#[test]
fn vision_tensors_are_skipped() {
    let ckpt = Checkpoint::open(&fixture_dir("kimi_k3_tiny")).unwrap();
    let skipped: Vec<&str> = ckpt.skipped().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(skipped.len(), 5, "{skipped:?}");
    assert!(skipped
        .iter()
        .all(|n| n.starts_with("vision_tower.") || n.starts_with("mm_projector.")));
    assert!(ckpt.has("model.embed_tokens.weight") && ckpt.has("lm_head.weight"));
    assert!(!ckpt
        .names()
        .iter()
        .any(|n| n.starts_with("language_model.") || n.starts_with("vision_tower.")));
}

/// A checkpoint source hiding some tensors (a feature's weights, once the
/// feature is switched off in the spec).
struct Hiding<'a> {
    ckpt: &'a Checkpoint,
    hide: &'a dyn Fn(&str) -> bool,
}

impl WeightSource for Hiding<'_> {
    fn load(&self, request: &WeightRequest<'_>) -> Result<Weight, ModelError> {
        match request {
            WeightRequest::Present { name } if (self.hide)(name) => Ok(Weight::Present(false)),
            _ => self.ckpt.load(request),
        }
    }

    fn configure(&self, spec: &ModelSpec) {
        self.ckpt.configure(spec)
    }
}

fn logits_with(dir: &Path, change: impl FnOnce(&mut ModelSpec), hide: &dyn Fn(&str) -> bool) -> larder_tensor::Mat {
    let mut spec = larder_model::arch::read_spec(dir).unwrap();
    change(&mut spec);
    let ckpt = Checkpoint::open(dir).unwrap();
    let model = DecoderModel::load(spec, &Hiding { ckpt: &ckpt, hide }, None).unwrap();
    let prompt = kimi_common::prompt_of(dir.file_name().unwrap().to_str().unwrap());
    model.forward(&prompt, &mut model.new_state(), None).unwrap()
}

/// A feature's name, how to switch it off in the spec, and which tensors to hide then.
type FeatureOff<'a> = (&'a str, Box<dyn Fn(&mut ModelSpec)>, &'a dyn Fn(&str) -> bool);

/// Every K3 feature matters: switched off, the logits move far beyond the
/// 1e-4 tolerance (the reference's own diffs are 6 to 12).
#[test]
fn switching_each_feature_off_moves_the_logits() {
    let dir = fixture_dir("kimi_k3_tiny");
    let r = reference(&dir);
    let none = |_: &str| false;
    let mla_gate = |n: &str| n.ends_with("self_attn.g_proj.weight") && [2, 5, 6].iter().any(|l| n.contains(&format!("layers.{l}.")));
    let cases: Vec<FeatureOff> = vec![
        ("situ", Box::new(|s: &mut ModelSpec| s.ffn_activation = GluActivation::Silu), &none),
        (
            "situ_linear_beta",
            Box::new(|s: &mut ModelSpec| {
                s.ffn_activation = GluActivation::Situ {
                    beta: 1.5,
                    linear_beta: None,
                }
            }),
            &none,
        ),
        (
            "latent_norm",
            Box::new(|s: &mut ModelSpec| {
                for l in &mut s.layers {
                    if let FfnSpec::Moe(m) = &mut l.ffn {
                        m.latent.as_mut().unwrap().norm = false;
                    }
                }
            }),
            &none,
        ),
        ("attn_res", Box::new(|s: &mut ModelSpec| s.attn_res_block = None), &none),
        (
            "mla_output_gate",
            Box::new(|s: &mut ModelSpec| {
                for l in &mut s.layers {
                    if let MixerSpec::Mla(m) = &mut l.mixer {
                        m.output_gate = false;
                    }
                }
            }),
            &mla_gate,
        ),
        (
            "kda_lower_bound",
            Box::new(|s: &mut ModelSpec| {
                for l in &mut s.layers {
                    if let MixerSpec::Kda(k) = &mut l.mixer {
                        k.gate_lower_bound = None;
                    }
                }
            }),
            &none,
        ),
    ];
    for (feature, change, hide) in cases {
        let got = max_diff(&logits_with(&dir, change, hide), &r.logits, r.vocab);
        let want = r.json["feature_off_max_abs_diff"][feature].as_f64().unwrap() as f32;
        eprintln!("{feature} off: max |logit diff| {got:.3} (reference {want:.3})");
        assert!(got > 1.0, "{feature} off moves the logits only {got}");
        assert!((got - want).abs() < 1e-3, "{feature} off: {got} vs the reference's {want}");
    }
}

#[test]
fn a_wrapper_without_text_config_is_refused() {
    let dir = copy_fixture("kimi_k3_tiny", "no-text");
    edit(&dir, |v| {
        v.as_object_mut().unwrap().remove("text_config");
    });
    let msg = load_error(&dir);
    for w in ["config.json", "text_config", "missing"] {
        assert!(msg.contains(w), "{msg} should name {w}");
    }
}

#[test]
fn text_fields_are_named_under_text_config() {
    // A field that disagrees with the tensors, named where it sits.
    let dir = copy_fixture("kimi_k3_tiny", "width");
    edit(&dir, |v| v["text_config"]["routed_expert_hidden_size"] = Value::from(64));
    let msg = load_error(&dir);
    assert!(msg.contains("routed_expert_down_proj"), "{msg}");
    // A refused value.
    let dir = copy_fixture("kimi_k3_tiny", "beta");
    edit(&dir, |v| v["text_config"]["activation_situ_linear_beta"] = Value::from(0.0));
    let msg = load_error(&dir);
    assert!(msg.contains("text_config.activation_situ_linear_beta"), "{msg}");
    // Situ betas with a silu activation would be ignored: refused.
    let dir = copy_fixture("kimi_k3_tiny", "silu");
    edit(&dir, |v| v["text_config"]["hidden_act"] = Value::from("silu"));
    let msg = load_error(&dir);
    assert!(msg.contains("text_config.activation_situ_beta"), "{msg}");
}

#[test]
fn a_missing_k3_tensor_is_named() {
    for (tag, name) in [
        ("res", "language_model.model.layers.3.mlp_res_proj.weight"),
        ("final", "language_model.model.output_attn_res_norm.weight"),
        ("latent", "language_model.model.layers.1.block_sparse_moe.routed_expert_norm.weight"),
    ] {
        let dir = copy_fixture("kimi_k3_tiny", tag);
        kimi_common::drop_tensor(&dir, name);
        let msg = load_error(&dir);
        assert!(msg.contains(&format!("`{name}`")), "{tag}: {msg}");
    }
}

#[test]
fn a_padded_a_log_must_pad_with_zeros() {
    let dir = copy_fixture("kimi_k3_tiny", "alog");
    let name = "language_model.model.layers.0.self_attn.A_log";
    kimi_common::rewrite_tensor(&dir, name, |bytes| bytes[12..16].copy_from_slice(&0.5f32.to_le_bytes()));
    let msg = load_error(&dir);
    for w in ["A_log", "padding is not zero", "linear_attn_config.num_heads"] {
        assert!(msg.contains(w), "{msg} should name {w}");
    }
}

#[test]
fn a_packed_tensor_without_a_scheme_is_refused() {
    let dir = copy_fixture("kimi_k3_tiny", "noscheme");
    edit(&dir, |v| {
        v["text_config"].as_object_mut().unwrap().remove("quantization_config");
    });
    let msg = load_error(&dir);
    for w in ["quantization_config", "weight_packed", "ships packed"] {
        assert!(msg.contains(w), "{msg} should name {w}");
    }
}
