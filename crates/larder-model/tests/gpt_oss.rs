//! gpt-oss (`model_type: gpt_oss`) against the transformers 5.24.0 references
//! in `fixtures/gpt_oss_bf16` (unquantized experts) and `fixtures/gpt_oss_tiny`
//! (MXFP4 experts as gpt-oss ships them, scripts/fixtures_4bit.py)
//! (scripts/fixtures_gpt_oss_bf16.py: sinks,
//! alternating sliding (window 4) / full layers, YaRN, router and expert
//! biases, interleaved gate/up with the swiglu clamps biting): logits within
//! 1e-4, identical routing, greedy ids with and without the cache;
//! bit-identical logits whatever the prefill chunking and batch company;
//! bad configs and checkpoints name the field or tensor.

mod kimi_common;

use kimi_common::{check_batch_against_alone, check_prefill_chunking, check_reference, copy_fixture, drop_tensor, edit, load, load_error};
use larder_model::config::{ExpertKind, FfnSpec, Scoring};
use serde_json::Value;

const FIXTURE: &str = "gpt_oss_bf16";
/// MXFP4 experts (`quantization_config.quant_method: mxfp4`).
const MXFP4: &str = "gpt_oss_tiny";

#[test]
fn matches_transformers() {
    check_reference(FIXTURE);
    check_reference(MXFP4);
}

#[test]
fn prefill_chunking_is_bit_identical() {
    check_prefill_chunking(FIXTURE);
    check_prefill_chunking(MXFP4);
}

#[test]
fn a_batch_is_bit_identical_to_each_sequence_alone() {
    check_batch_against_alone(FIXTURE);
    check_batch_against_alone(MXFP4);
}

#[test]
fn the_spec_is_read_from_every_field() {
    let spec = load(FIXTURE).spec().clone();
    assert!(spec.attention_sinks && spec.qkv_bias && spec.o_bias);
    let windows: Vec<_> = spec.layers.iter().map(|l| l.sliding_window).collect();
    assert_eq!(windows, [Some(4), None, Some(4), None]);
    let FfnSpec::Moe(m) = &spec.layers[0].ffn else {
        panic!("gpt-oss layers are MoE")
    };
    assert_eq!((m.num_experts, m.top_k, m.expert_intermediate), (12, 4, 32));
    assert_eq!(m.scoring, Scoring::TopKSoftmax);
    assert_eq!(m.experts, ExpertKind::GptOss { alpha: 1.702, limit: 7.0 });
}

/// The swiglu limit is read: another limit changes the logits (the
/// reference has clamped gate and up pre-activations, reference.json
/// `quantization.swiglu_*_clamped_fraction`).
#[test]
fn swiglu_limit_matters() {
    let base = load(FIXTURE);
    let prompt = kimi_common::prompt_of(FIXTURE);
    let want = base.forward(&prompt, &mut base.new_state(), None).unwrap();
    let dir = copy_fixture(FIXTURE, "limit");
    edit(&dir, |c| c["swiglu_limit"] = 3.0.into());
    let m = larder_model::load_model(&dir, None).unwrap();
    assert_ne!(
        m.forward(&prompt, &mut m.new_state(), None).unwrap(),
        want,
        "swiglu_limit has no effect"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A config edit, with the tag of its fixture copy and the field its error must name.
type Case = (&'static str, Box<dyn FnOnce(&mut Value)>, &'static str);

/// The config as transformers 5.24.0 saves it (`rope_parameters` holding
/// `rope_theta`, `swiglu_alpha`, no `experts_per_token` or
/// `initial_context_length`) is the same model: bit-identical logits.
#[test]
fn a_transformers_saved_config_is_the_same_model() {
    let base = load(FIXTURE);
    let prompt = kimi_common::prompt_of(FIXTURE);
    let want = base.forward(&prompt, &mut base.new_state(), None).unwrap();
    let dir = copy_fixture(FIXTURE, "saved");
    edit(&dir, |c| {
        let o = c.as_object_mut().unwrap();
        let mut rope = o.remove("rope_scaling").unwrap();
        rope["rope_theta"] = o.remove("rope_theta").unwrap();
        o.insert("rope_parameters".into(), rope);
        o.remove("experts_per_token");
        o.remove("initial_context_length");
        o.insert("swiglu_alpha".into(), 1.702.into());
        o.insert("dtype".into(), "bfloat16".into());
    });
    let m = larder_model::load_model(&dir, None).unwrap();
    assert_eq!(m.forward(&prompt, &mut m.new_state(), None).unwrap(), want);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn refused(tag: &str, f: impl FnOnce(&mut Value)) -> String {
    let dir = copy_fixture(FIXTURE, tag);
    edit(&dir, f);
    load_error(&dir)
}

#[test]
fn bad_config_fields_are_named() {
    let cases: Vec<Case> = vec![
        ("unknown", Box::new(|c| c["use_kernels"] = true.into()), "use_kernels"),
        ("topk", Box::new(|c| c["experts_per_token"] = 2.into()), "experts_per_token"),
        (
            "k13",
            Box::new(|c| {
                c["num_experts_per_tok"] = 13.into();
                c["experts_per_token"] = 13.into();
            }),
            "num_experts_per_tok",
        ),
        ("limit", Box::new(|c| c["swiglu_limit"] = (-1.0).into()), "swiglu_limit"),
        ("alpha", Box::new(|c| c["swiglu_alpha"] = "x".into()), "swiglu_alpha"),
        (
            "ctx",
            Box::new(|c| c["initial_context_length"] = 8192.into()),
            "initial_context_length",
        ),
        (
            "norope",
            Box::new(|c| {
                c.as_object_mut().unwrap().remove("rope_scaling");
            }),
            "rope_scaling",
        ),
        (
            "ropekey",
            Box::new(|c| c["rope_scaling"]["low_freq_factor"] = 1.0.into()),
            "rope_scaling.low_freq_factor",
        ),
        (
            "types",
            Box::new(|c| c["layer_types"][1] = "linear_attention".into()),
            "layer_types",
        ),
        (
            "ntypes",
            Box::new(|c| c["layer_types"] = serde_json::json!(["full_attention"])),
            "layer_types",
        ),
        ("act", Box::new(|c| c["hidden_act"] = "gelu".into()), "hidden_act"),
    ];
    for (tag, f, field) in cases {
        let e = refused(tag, f);
        assert!(e.contains("config.json") && e.contains(field), "{tag}: {e}");
    }
}

#[test]
fn missing_tensors_are_named() {
    for name in [
        "model.layers.1.self_attn.sinks",
        "model.layers.0.mlp.router.bias",
        "model.layers.2.mlp.experts.gate_up_proj",
        "model.layers.3.mlp.experts.down_proj_bias",
        "model.layers.0.self_attn.o_proj.bias",
    ] {
        let dir = copy_fixture(FIXTURE, "drop");
        drop_tensor(&dir, name);
        let e = load_error(&dir);
        assert!(e.contains(name), "{name}: {e}");
    }
}

/// Loading `fixture` with the config edited by `f`: the error text.
fn refused_in(fixture: &str, tag: &str, f: impl FnOnce(&mut Value)) -> String {
    let dir = copy_fixture(fixture, tag);
    edit(&dir, f);
    load_error(&dir)
}

#[test]
fn bad_mxfp4_quantization_configs_are_named() {
    let cases: Vec<Case> = vec![
        (
            "qmethod",
            Box::new(|c| c["quantization_config"]["quant_method"] = "fp8".into()),
            "quantization_config.quant_method",
        ),
        (
            "qkey",
            Box::new(|c| c["quantization_config"]["dequantize"] = true.into()),
            "quantization_config.dequantize",
        ),
        (
            "qlist",
            Box::new(|c| c["quantization_config"]["modules_to_not_convert"] = "lm_head".into()),
            "quantization_config.modules_to_not_convert",
        ),
    ];
    for (tag, f, field) in cases {
        let e = refused_in(MXFP4, tag, f);
        assert!(e.contains("config.json") && e.contains(field), "{tag}: {e}");
    }
}

/// Experts shipped otherwise than `quantization_config` says: the error
/// names the tensor looked for and the field that decided.
#[test]
fn experts_shipped_against_the_config_are_named() {
    // MXFP4 experts, but the config says layer 1's are not converted.
    let e = refused_in(MXFP4, "listed", |c| {
        c["quantization_config"]["modules_to_not_convert"]
            .as_array_mut()
            .unwrap()
            .push("model.layers.1.mlp.experts".into())
    });
    assert!(
        e.contains("model.layers.1.mlp.experts.gate_up_proj`")
            && e.contains("gate_up_proj_blocks")
            && e.contains("quantization_config.modules_to_not_convert"),
        "{e}"
    );
    // A glob over every layer, as transformers matches it.
    let e = refused_in(MXFP4, "glob", |c| {
        c["quantization_config"]["modules_to_not_convert"] = serde_json::json!(["model.layers.*.mlp.experts"])
    });
    assert!(
        e.contains("model.layers.0.mlp.experts.gate_up_proj`") && e.contains("modules_to_not_convert"),
        "{e}"
    );
    // Unquantized experts, but the config says MXFP4.
    let e = refused_in(FIXTURE, "mxfp4", |c| {
        c["quantization_config"] = serde_json::json!({"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]})
    });
    assert!(
        e.contains("model.layers.0.mlp.experts.gate_up_proj_blocks") && e.contains("quantization_config.modules_to_not_convert"),
        "{e}"
    );
    // MXFP4 experts without a quantization_config.
    let e = refused_in(MXFP4, "noq", |c| {
        c.as_object_mut().unwrap().remove("quantization_config");
    });
    assert!(
        e.contains("model.layers.0.mlp.experts.gate_up_proj`") && e.contains("quantization_config"),
        "{e}"
    );
}

#[test]
fn missing_mxfp4_tensors_are_named() {
    kimi_common::check_missing_tensors_are_named(
        MXFP4,
        &[
            "model.layers.0.mlp.experts.gate_up_proj_blocks",
            "model.layers.1.mlp.experts.gate_up_proj_scales",
            "model.layers.2.mlp.experts.down_proj_blocks",
            "model.layers.3.mlp.experts.down_proj_scales",
            "model.layers.3.mlp.experts.down_proj_bias",
        ],
    );
}

/// Rewrites `dir`'s model.safetensors with tensor `name` cut to its first
/// `keep` bytes and given `shape` (a truncated or misshaped tensor).
fn misshape_tensor(dir: &std::path::Path, name: &str, shape: Vec<usize>, keep: usize) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut views = Vec::new();
    for (n, t) in st.tensors() {
        let (dtype, shape, data) = match n == name {
            true => (t.dtype(), shape.clone(), t.data()[..keep].to_vec()),
            false => (t.dtype(), t.shape().to_vec(), t.data().to_vec()),
        };
        views.push((
            n,
            safetensors::tensor::TensorView::new(dtype, shape, Box::leak(data.into_boxed_slice())).unwrap(),
        ));
    }
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
}

/// Truncated blocks, scales of the wrong shape: the error names the tensor.
#[test]
fn misshaped_mxfp4_tensors_are_named() {
    // gpt_oss_tiny: E 12, H 64, I 64.
    let cases: [(&str, Vec<usize>, usize); 3] = [
        (
            "model.layers.0.mlp.experts.gate_up_proj_blocks",
            vec![11, 128, 2, 16],
            11 * 128 * 32,
        ),
        ("model.layers.1.mlp.experts.gate_up_proj_scales", vec![12, 128, 1], 12 * 128),
        ("model.layers.2.mlp.experts.down_proj_scales", vec![12, 2, 64], 12 * 128),
    ];
    for (name, shape, keep) in cases {
        let dir = copy_fixture(MXFP4, "misshape");
        misshape_tensor(&dir, name, shape, keep);
        let e = load_error(&dir);
        assert!(e.contains(name), "{name}: {e}");
    }
}
