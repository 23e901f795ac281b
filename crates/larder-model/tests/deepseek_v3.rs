//! DeepSeek-V3 / Kimi-K2 checkpoints: bad input gets clear errors naming the field or tensor;
//! multi-token-prediction layers are left out of the main model.

mod scratch;

use std::path::Path;

use scratch::FixtureCopy;

use larder_model::load_model;
use serde_json::Value;

fn copy_fixture(name: &str, tag: &str) -> FixtureCopy {
    FixtureCopy::new("larder-ds-err", name, tag)
}

fn edit(dir: &Path, f: impl FnOnce(&mut Value)) {
    let p = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, v.to_string()).unwrap();
}

fn load_error(dir: &Path) -> String {
    match load_model(dir, None) {
        Ok(_) => panic!("{} should not load", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn config_errors_name_the_field() {
    let cases: Vec<(&str, Value, &str)> = vec![
        ("scoring_func", Value::from("softmax"), "scoring_func"),
        ("topk_method", Value::from("greedy"), "topk_method"),
        ("n_group", Value::from(3), "n_group"),
        ("topk_group", Value::from(9), "topk_group"),
        ("qk_rope_head_dim", Value::from(7), "qk_rope_head_dim"),
        ("kv_lora_rank", Value::Null, "kv_lora_rank"),
        ("moe_layer_freq", Value::from(0), "moe_layer_freq"),
        ("attention_bias", Value::from(true), "attention_bias"),
    ];
    for (i, (field, value, want)) in cases.into_iter().enumerate() {
        let dir = copy_fixture("deepseek_v3_tiny", &format!("cfg{i}"));
        edit(&dir, |v| v[field] = value.clone());
        let msg = load_error(&dir);
        assert!(msg.contains(want), "{field}={value}: {msg}");
    }
}

#[test]
fn dims_that_do_not_match_the_tensors_name_the_tensor() {
    let dir = copy_fixture("deepseek_v3_tiny", "vdim");
    edit(&dir, |v| v["v_head_dim"] = Value::from(10));
    let msg = load_error(&dir);
    assert!(msg.contains("kv_b_proj"), "{msg}");

    let dir = copy_fixture("deepseek_v3_tiny", "experts");
    edit(&dir, |v| v["n_routed_experts"] = Value::from(12));
    let msg = load_error(&dir);
    assert!(msg.contains("mlp.gate.weight") || msg.contains("experts.8"), "{msg}");
}

#[test]
fn fp8_scales_and_quantization_config_are_required() {
    // A missing scale tensor is named.
    let dir = copy_fixture("deepseek_v3_fp8", "noscale");
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let dropped = "model.layers.0.self_attn.kv_b_proj.weight_scale_inv";
    let kept: Vec<_> = st.tensors().into_iter().filter(|(n, _)| n != dropped).collect();
    std::fs::write(&path, safetensors::serialize(kept, None).unwrap()).unwrap();
    let msg = load_error(&dir);
    assert!(msg.contains(dropped), "{msg}");

    // fp8 weights without a quantization_config.
    let dir = copy_fixture("deepseek_v3_fp8", "noquant");
    edit(&dir, |v| {
        v.as_object_mut().unwrap().remove("quantization_config");
    });
    let msg = load_error(&dir);
    assert!(msg.contains("weight_block_size"), "{msg}");

    // Other quantization methods are refused by name.
    let dir = copy_fixture("deepseek_v3_fp8", "awq");
    edit(&dir, |v| v["quantization_config"]["quant_method"] = Value::from("awq"));
    let msg = load_error(&dir);
    assert!(msg.contains("quant_method") && msg.contains("awq"), "{msg}");

    // A block size that disagrees with the scale tensors' shapes.
    let dir = copy_fixture("deepseek_v3_fp8", "block");
    edit(&dir, |v| {
        v["quantization_config"]["weight_block_size"] = serde_json::json!([16, 16])
    });
    let msg = load_error(&dir);
    assert!(msg.contains("scale tensor"), "{msg}");
}

#[test]
fn multi_token_prediction_layers_are_not_loaded() {
    // Real checkpoints carry MTP layers at index num_hidden_layers; add one and
    // check the main model loads and computes exactly as without it.
    let plain = copy_fixture("deepseek_v3_tiny", "mtp-plain");
    let dir = copy_fixture("deepseek_v3_tiny", "mtp");
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let extra: Vec<(String, Vec<u8>, Vec<usize>)> = vec![
        ("model.layers.3.eh_proj.weight".into(), vec![0u8; 64 * 128 * 2], vec![64, 128]),
        ("model.layers.3.enorm.weight".into(), vec![0u8; 64 * 2], vec![64]),
        (
            "model.layers.3.mlp.experts.0.gate_proj.weight".into(),
            vec![0u8; 24 * 64 * 2],
            vec![24, 64],
        ),
    ];
    let mut views: Vec<(String, safetensors::tensor::TensorView)> = st.tensors();
    for (name, data, shape) in &extra {
        views.push((
            name.clone(),
            safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, shape.clone(), data).unwrap(),
        ));
    }
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
    edit(&dir, |v| v["num_nextn_predict_layers"] = Value::from(1));
    let ids = [5u32, 17, 42, 99];
    let a = load_model(&plain, None).unwrap();
    let b = load_model(&dir, None).unwrap();
    let la = a.forward(&ids, &mut a.new_state(), None).unwrap();
    let lb = b.forward(&ids, &mut b.new_state(), None).unwrap();
    assert_eq!(la, lb);
}

/// transformers builds MLA's latent norms with the RMSNorm default eps
/// (1e-6), not `rms_norm_eps`: a config with another `rms_norm_eps` keeps
/// 1e-6 there and uses its own value for the layer norms.
#[test]
fn latent_norms_keep_their_own_epsilon() {
    let dir = copy_fixture("deepseek_v3_tiny", "eps");
    edit(&dir, |c| c["rms_norm_eps"] = serde_json::json!(1e-2));
    let spec = larder_model::arch::read_spec(&dir).unwrap();
    assert_eq!(spec.rms_norm_eps, 1e-2);
    for layer in &spec.layers {
        match &layer.mixer {
            larder_model::config::MixerSpec::Mla(m) => assert_eq!(m.latent_norm_eps, 1e-6),
            other => panic!("deepseek_v3 layers are MLA: {other:?}"),
        }
    }
}

/// DeepSeek-V3's real shape (61 MLA layers, 128 heads, nope 128, rope 64,
/// v 128, kv_lora_rank 512): the expanded cache takes 61 x 128 x (192 + 128)
/// f32 per token (9.53 MiB), the compact one 61 x (512 + 64) f32 (137.25 KiB).
#[test]
fn kv_bytes_per_token_of_the_real_deepseek_v3_shape() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/deepseek_v3_tiny");
    let mut cfg = larder_model::config::ConfigJson::read(&dir).unwrap();
    let real = serde_json::json!({
        "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "num_hidden_layers": 61, "first_k_dense_replace": 3, "num_attention_heads": 128,
        "num_key_value_heads": 128, "n_routed_experts": 256, "num_experts_per_tok": 8,
        "n_group": 8, "topk_group": 4, "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "vocab_size": 129280, "max_position_embeddings": 163840,
        "rope_parameters": {"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0},
    });
    for (k, v) in real.as_object().unwrap() {
        cfg.value[k] = v.clone();
    }
    let spec = larder_model::arch::spec_from_config(&cfg).unwrap();
    assert_eq!(spec.layers.len(), 61);
    let expanded = spec.kv_bytes_per_token(larder_model::MlaCache::Expanded);
    let compact = spec.kv_bytes_per_token(larder_model::MlaCache::Compact);
    assert_eq!(expanded, 61 * 128 * (128 + 64 + 128) * 4);
    assert_eq!(compact, 61 * (512 + 64) * 4);
    eprintln!(
        "DeepSeek-V3 KV per token: expanded {expanded} B ({:.2} MiB), compact {compact} B ({:.2} KiB), {:.1}x smaller",
        expanded as f64 / (1 << 20) as f64,
        compact as f64 / 1024.0,
        expanded as f64 / compact as f64
    );
    assert!((expanded as f64 / (1 << 20) as f64 - 9.53).abs() < 0.01);
    assert!((compact as f64 / 1024.0 - 137.25).abs() < 0.01);
}
