//! Kimi Linear with block attention residuals (K3 extension
//! `n_layers_per_attn_res_block`, `src/attn_residual.rs`) against
//! `fixtures/kimi_linear_attn_res` (transformers 5.24.0's KimiLinearForCausalLM
//! with inkling2's block attention residuals, scripts/fixtures_k3_attn_res.py):
//! logits within 1e-4 of the one-pass and token-by-token references, routing
//! and greedy ids identical; bit-identical logits whatever the chunking and
//! batch company; a missing query tensor and a bad block size are named.

mod kimi_common;

use kimi_common::{
    check_batch_against_alone, check_missing_tensors_are_named, check_prefill_chunking, check_reference, copy_fixture, edit, load,
    load_error, prompt_of,
};
use serde_json::Value;

const NAME: &str = "kimi_linear_attn_res";

#[test]
fn matches_transformers() {
    check_reference(NAME);
}

#[test]
fn prefill_chunking_is_bit_identical() {
    check_prefill_chunking(NAME);
}

#[test]
fn a_batch_is_bit_identical_to_each_sequence_alone() {
    check_batch_against_alone(NAME);
}

#[test]
fn the_attention_residuals_change_the_logits() {
    let model = load(NAME);
    let prompt = prompt_of(NAME);
    let with = model.forward(&prompt, &mut model.new_state(), None).unwrap();
    let dir = copy_fixture(NAME, "plain");
    edit(&dir, |v| v["n_layers_per_attn_res_block"] = Value::Null);
    let plain = larder_model::load_model(&dir, None).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let without = plain.forward(&prompt, &mut plain.new_state(), None).unwrap();
    let worst = with
        .as_slice()
        .iter()
        .zip(without.as_slice())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst > 1.0, "null n_layers_per_attn_res_block should be the plain model ({worst})");
}

#[test]
fn a_missing_query_is_named() {
    check_missing_tensors_are_named(
        NAME,
        &[
            "model.final_input.query",
            "model.layers.0.mlp_input.query",
            "model.layers.3.attention_input.query",
        ],
    );
}

#[test]
fn bad_block_sizes_are_refused_naming_the_field() {
    let cases = [(Value::from(0), "0"), (Value::from(-2), "-2"), (Value::from("2"), "\"2\"")];
    for (i, (value, shown)) in cases.into_iter().enumerate() {
        let dir = copy_fixture(NAME, &format!("block{i}"));
        edit(&dir, |v| v["n_layers_per_attn_res_block"] = value);
        let msg = load_error(&dir);
        for w in ["config.json", "n_layers_per_attn_res_block", shown] {
            assert!(msg.contains(w), "{msg} should name {w}");
        }
    }
}

#[test]
fn attn_res_block_size_stays_refused() {
    let dir = copy_fixture(NAME, "block-size");
    edit(&dir, |v| v["attn_res_block_size"] = Value::from(2));
    let msg = load_error(&dir);
    for w in ["attn_res_block_size", "no reference defines", "n_layers_per_attn_res_block"] {
        assert!(msg.contains(w), "{msg} should name {w}");
    }
}
