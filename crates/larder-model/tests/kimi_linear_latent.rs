//! Kimi Linear with latent-space experts (K3, `moe_latent_size`) against
//! `fixtures/kimi_linear_latent` (transformers 5.24.0's KimiLinearForCausalLM
//! with its MoE blocks computed as NemotronHMoE: scripts/fixtures_k3_latent.py):
//! logits within 1e-4 of the references, identical routing and greedy ids;
//! chunked prefill and token by token bit-identical; the latent width reaches
//! the expert shapes; bad latent configs and missing latent projections are
//! named. Streamed experts: crates/larder-engine/tests/kimi_linear.rs.

mod kimi_common;

use kimi_common::{
    bits, check_missing_tensors_are_named, check_prefill_chunking, check_reference, copy_fixture, edit, fixture_dir, load, load_error,
    prompt_of,
};
use larder_model::{expert_layers, expert_tensors, load_model, FfnSpec};
use serde_json::Value;

const NAME: &str = "kimi_linear_latent";

#[test]
fn latent_experts_match_transformers() {
    check_reference(NAME);
}

#[test]
fn prefill_chunking_is_bit_identical() {
    check_prefill_chunking(NAME);
}

#[test]
fn experts_are_latent_wide_and_the_projections_are_spine() {
    let spec = larder_model::arch::read_spec(&fixture_dir(NAME)).unwrap();
    let moe_layers = expert_layers(&spec);
    assert_eq!(moe_layers.len(), 5);
    for (l, _) in moe_layers {
        let FfnSpec::Moe(m) = &spec.layers[l].ffn else {
            panic!("layer {l}")
        };
        assert_eq!((m.latent, m.expert_width(spec.hidden_size)), (Some(24), 24));
        let [g, u, d] = expert_tensors(&spec, l, 3).unwrap();
        assert_eq!((g.shape, u.shape, d.shape), ([16, 24], [16, 24], [24, 16]));
        assert!(!g.name.contains("latent"), "{}", g.name);
    }
}

/// `latent_moe_use_norm: false` (a switch off) and an explicit
/// `moe_latent_size` equal to the fixture's load the same model.
#[test]
fn a_latent_switch_turned_off_is_accepted() {
    let want = load(NAME).forward(&prompt_of(NAME), &mut load(NAME).new_state(), None).unwrap();
    let dir = copy_fixture(NAME, "switch-off");
    edit(&dir, |v| v["latent_moe_use_norm"] = Value::from(false));
    let model = load_model(&dir, None).unwrap();
    let got = model.forward(&prompt_of(NAME), &mut model.new_state(), None).unwrap();
    assert_eq!(bits(&got), bits(&want));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_latent_configs_name_the_field() {
    let cases: &[(&str, Value, &[&str])] = &[
        ("moe_latent_size", Value::from(0), &["moe_latent_size", "0 is not a width"]),
        ("moe_latent_size", Value::from(-3), &["moe_latent_size", "-3"]),
        ("moe_latent_size", Value::from("24"), &["moe_latent_size"]),
        (
            "latent_moe_use_norm",
            Value::from(true),
            &["latent_moe_use_norm", "no reference model defines", "K3 extension"],
        ),
        (
            "routed_expert_hidden_size",
            Value::from(24),
            &["routed_expert_hidden_size", "no reference model defines"],
        ),
        // Widths that disagree with the tensors: the first tensor read at the wrong shape is named.
        ("moe_latent_size", Value::from(16), &["model.layers.1.block_sparse_moe", "shape"]),
        (
            "moe_latent_size",
            Value::Null,
            &["model.layers.1.block_sparse_moe.experts.0.w1.weight", "shape"],
        ),
    ];
    for (i, (field, value, want)) in cases.iter().enumerate() {
        let dir = copy_fixture(NAME, &format!("cfg{i}"));
        edit(&dir, |v| v[*field] = value.clone());
        let msg = load_error(&dir);
        for w in *want {
            assert!(msg.contains(w), "{field}={value}: {msg} should name {w}");
        }
    }
}

#[test]
fn a_missing_latent_projection_is_named() {
    check_missing_tensors_are_named(
        NAME,
        &[
            "model.layers.1.block_sparse_moe.fc1_latent_proj.weight",
            "model.layers.5.block_sparse_moe.fc2_latent_proj.weight",
        ],
    );
}
