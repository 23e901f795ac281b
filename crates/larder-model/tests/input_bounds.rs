//! Sizes read from config.json never become an allocation before something
//! checks them (issue 37, finding 6): a huge
//! `linear_attn_config.short_conv_kernel_size` is an error naming the field
//! in `read_spec`, and a kernel size the checkpoint disagrees with is a shape
//! error on every loading path (`larder run`'s checkpoint load, and the
//! recorded load `larder doctor`, `plan`, `pack` and streaming make to find
//! the routed experts), never an abort. Before the fix each of these aborted
//! the process (`Vec::with_capacity` of the convolution taps before their
//! shapes were checked).

use std::path::{Path, PathBuf};

use larder_model::arch::read_spec;
use larder_model::checkpoint::Checkpoint;
use larder_model::config::{MixerSpec, ModelSpec, MAX_TENSOR_ELEMENTS};
use larder_model::{routed_expert_parts, DecoderModel};
use serde_json::{json, Value};

const FIELD: &str = "linear_attn_config.short_conv_kernel_size";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

/// A fresh folder holding kimi_linear_tiny's config.json patched by `patch`.
fn patched_config(name: &str, patch: impl FnOnce(&mut Value)) -> PathBuf {
    let text = std::fs::read_to_string(fixture("kimi_linear_tiny").join("config.json")).unwrap();
    let mut cfg: Value = serde_json::from_str(&text).unwrap();
    patch(&mut cfg);
    let dir = std::env::temp_dir().join(format!("larder-input-bounds-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    dir
}

/// The tiny Kimi Linear fixture's spec with every KDA layer's kernel set to `kernel`.
fn spec_with_kernel(kernel: usize) -> ModelSpec {
    let mut spec = read_spec(&fixture("kimi_linear_tiny")).unwrap();
    for layer in &mut spec.layers {
        if let MixerSpec::Kda(k) = &mut layer.mixer {
            k.conv_kernel = kernel;
        }
    }
    spec
}

#[test]
fn a_kernel_longer_than_the_context_is_a_config_error_naming_the_field() {
    let dir = patched_config("long-kernel", |c| {
        c["linear_attn_config"]["short_conv_kernel_size"] = json!(1u64 << 31)
    });
    let err = read_spec(&dir).unwrap_err().to_string();
    assert!(
        err.contains(FIELD) && err.contains("2147483648") && err.contains("model_max_length"),
        "{err}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_convolution_over_the_tensor_limit_is_a_config_error_naming_the_field() {
    // A context long enough for the kernel: 2^20 heads of 128 channels
    // (q_proj 2^33 elements at hidden 64) x 2^30 taps is 2^57 elements per
    // convolution tensor.
    let dir = patched_config("huge-conv", |c| {
        c["model_max_length"] = json!(1u64 << 31);
        c["linear_attn_config"]["num_heads"] = json!(1u64 << 20);
        c["linear_attn_config"]["head_dim"] = json!(128);
        c["linear_attn_config"]["short_conv_kernel_size"] = json!(1u64 << 30);
    });
    let err = read_spec(&dir).unwrap_err().to_string();
    assert!(err.contains(FIELD) && err.contains(&MAX_TENSOR_ELEMENTS.to_string()), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_kernel_the_checkpoint_disagrees_with_is_a_shape_error_on_every_loading_path() {
    let ckpt = Checkpoint::open(&fixture("kimi_linear_tiny")).unwrap();
    let spec = spec_with_kernel(1 << 31);
    // The recorded load of doctor, plan, pack and streaming runs.
    let err = routed_expert_parts(&spec, &ckpt).unwrap_err().to_string();
    assert!(err.contains("short_conv_kernel_size") && err.contains("q_conv1d"), "{err}");
    // The in-RAM load of `larder run`.
    let err = DecoderModel::load(spec, &ckpt, None).err().expect("a shape error").to_string();
    assert!(err.contains("short_conv_kernel_size") && err.contains("q_conv1d"), "{err}");
}

#[test]
fn the_fixture_still_loads_on_every_path() {
    let dir = fixture("kimi_linear_tiny");
    let ckpt = Checkpoint::open(&dir).unwrap();
    let spec = read_spec(&dir).unwrap();
    assert!(!routed_expert_parts(&spec, &ckpt).unwrap().is_empty());
    DecoderModel::load(spec, &ckpt, None).unwrap();
}
