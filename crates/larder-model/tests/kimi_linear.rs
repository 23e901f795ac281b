//! Kimi Linear (`model_type: kimi_linear`, KDA + MLA hybrid) against the
//! transformers 5.24.0 references in `fixtures/kimi_linear_*`: logits within
//! 1e-4 of the one-pass (chunked KDA) and the token-by-token (recurrent KDA)
//! references, identical routing, greedy ids with and without the state;
//! bit-identical logits whatever the prefill chunking and batch company;
//! snapshot/restore exactness, rollback refused; a failed pass leaves the
//! recurrent state as it was; bad configs and checkpoints name the field or
//! tensor.

mod kimi_common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kimi_common::{
    bits, check_batch_against_alone, check_missing_tensors_are_named, check_prefill_chunking, check_reference, copy_fixture, edit,
    fixture_dir, load, load_error, prompt_of,
};
use larder_model::checkpoint::Checkpoint;
use larder_model::Mlp;
use larder_model::{expert_layers, expert_tensors, load_model, ExpertProvider, InMemoryExperts, ModelError};
use serde_json::Value;

const FIXTURES: [&str; 4] = ["kimi_linear_tiny", "kimi_linear_mla_first", "kimi_k3_tiny", "kimi_k3_plain"];

#[test]
fn tiny_matches_transformers() {
    check_reference("kimi_linear_tiny");
}

#[test]
fn mla_first_matches_transformers() {
    check_reference("kimi_linear_mla_first");
}

#[test]
fn prefill_chunking_is_bit_identical() {
    for name in FIXTURES {
        check_prefill_chunking(name);
    }
}

#[test]
fn a_batch_is_bit_identical_to_each_sequence_alone() {
    for name in FIXTURES {
        check_batch_against_alone(name);
    }
}

/// A snapshot taken inside a pass (`mark_after`) equals the snapshot of a
/// state that stopped there, at every mark and chunking; the marked pass's
/// logits are unchanged; a failed pass or no request gives none.
#[test]
fn a_snapshot_inside_a_pass_equals_stopping_there() {
    for name in FIXTURES {
        let model = load(name);
        let prompt = prompt_of(name);
        let n = prompt.len();
        let mut plain = model.new_state();
        let want_logits = model.forward(&prompt, &mut plain, None).unwrap();
        for mark in [0, 1, n / 2, n - 1, n] {
            let mut stopped = model.new_state();
            if mark > 0 {
                model.forward_last(&prompt[..mark], &mut stopped, None).unwrap();
            }
            let mut marked = model.new_state();
            marked.mark_after(mark);
            let logits = model.forward(&prompt, &mut marked, None).unwrap();
            assert_eq!(bits(&logits), bits(&want_logits), "{name} mark {mark}: logits");
            assert_eq!(marked.take_marked(), Some(stopped.snapshot()), "{name} mark {mark}");
            assert_eq!(marked.take_marked(), None, "{name}: taken once");
            // In a later pass of a chunked prefill.
            let mut later = model.new_state();
            model.forward_last(&prompt[..1], &mut later, None).unwrap();
            if mark >= 1 {
                later.mark_after(mark - 1);
                model.forward_last(&prompt[1..], &mut later, None).unwrap();
                assert_eq!(later.take_marked(), Some(stopped.snapshot()), "{name} mark {mark} second pass");
            }
        }
        let mut failed = model.new_state();
        failed.mark_after(1);
        assert!(model.forward_last(&[u32::MAX], &mut failed, None).is_err());
        assert_eq!(failed.take_marked(), None, "{name}: a failed pass takes no snapshot");
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
        let dir = copy_fixture("kimi_k3_tiny", &format!("gate-off{i}"));
        edit(&dir, |v| match field.strip_prefix("linear_attn_config.") {
            Some(key) => v["text_config"]["linear_attn_config"][key] = Value::Bool(false),
            None => v["text_config"][field] = Value::Bool(false),
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
    check_missing_tensors_are_named(
        "kimi_linear_tiny",
        &[
            "model.layers.1.self_attn.dt_bias",
            "model.layers.2.self_attn.g_b_proj.weight",
            "model.layers.4.self_attn.v_conv1d.weight",
        ],
    );
}

/// Kimi Linear as transformers 5.x `save_pretrained` may name a dense
/// layer's MLP (`block_sparse_moe.{gate,up,down}_proj`): loads, with logits
/// bit-identical to the `mlp.` spelling; both spellings at once are refused.
#[test]
fn dense_layers_under_block_sparse_moe_load_the_same() {
    let name = "kimi_linear_tiny";
    let prompt = prompt_of(name);
    let want = load(name).forward(&prompt, &mut load(name).new_state(), None).unwrap();
    let rename = |both: bool, tag: &str| {
        let dir = copy_fixture(name, tag);
        let path = dir.join("model.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut tensors: Vec<(String, _)> = Vec::new();
        for (n, v) in st.tensors() {
            if let Some(rest) = n.strip_prefix("model.layers.0.mlp.") {
                tensors.push((format!("model.layers.0.block_sparse_moe.{rest}"), v.clone()));
                if !both {
                    continue;
                }
            }
            tensors.push((n, v));
        }
        std::fs::write(&path, safetensors::serialize(tensors, None).unwrap()).unwrap();
        dir
    };
    let dir = rename(false, "saved-dense");
    let model = load_model(&dir, None).unwrap();
    let got = model.forward(&prompt, &mut model.new_state(), None).unwrap();
    assert_eq!(bits(&got), bits(&want));
    let msg = load_error(&rename(true, "both-dense"));
    assert!(msg.contains("model.layers.0") && msg.contains("twice"), "{msg}");
}
