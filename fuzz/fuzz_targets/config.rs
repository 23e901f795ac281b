//! Fuzzes `config.json` through everything that sizes or loads a model from
//! it: `larder_model::arch::read_spec` (every architecture); for a spec, the
//! sizes `doctor` and `plan` estimate from a config.json alone
//! (`larder_engine::estimate_sizes`: a recorded load; the
//! KV-cache bytes per token);
//! then, with the weights of the fixture checkpoint of its architecture
//! beside the fuzzed config.json, the recorded load `doctor`, `plan`, `pack`
//! and streaming make to find the routed experts
//! (`larder_model::routed_expert_parts`) and the in-RAM load of `run`
//! (`DecoderModel::load`). Any input is a model or an error naming the
//! field or tensor, never a panic, an abort or a huge allocation (a
//! `short_conv_kernel_size` of 2^31 aborted the recorded load: issue 37).
#![no_main]

use std::path::Path;

use larder_engine::{config_float_dtype, estimate_sizes};
use larder_model::checkpoint::Checkpoint;
use larder_model::{routed_expert_parts, DecoderModel, MlaCache, ModelSpec};
use libfuzzer_sys::fuzz_target;

/// The fixture checkpoint whose weights a config of `model_type` is loaded against.
fn fixture_of(model_type: &str) -> Option<&'static str> {
    Some(match model_type {
        "llama" | "mistral" => "llama_tiny",
        "qwen3_moe" => "qwen3_moe_tiny",
        "qwen2_moe" => "qwen2_moe_tiny",
        "mixtral" => "mixtral_tiny",
        "deepseek_v3" => "deepseek_v3_tiny",
        "kimi_k2" => "kimi_k2_tiny",
        "kimi_linear" => "kimi_linear_tiny",
        "gpt_oss" => "gpt_oss_tiny",
        _ => return None,
    })
}

/// What `doctor` and `plan` compute from a config.json alone.
fn estimate(spec: &ModelSpec) {
    for dtype in [Some("bfloat16"), Some("float32"), None] {
        if let Ok(dtype) = config_float_dtype(dtype) {
            let _ = estimate_sizes(spec, dtype);
        }
    }
    let _ = spec.kv_bytes_per_token(MlaCache::Compact);
    let _ = spec.kv_bytes_per_token(MlaCache::Expanded);
}

/// The recorded and in-RAM loads of `spec` against the fixture weights
/// linked into `dir`.
fn load(dir: &Path, spec: ModelSpec) {
    let Some(fixture) = fixture_of(&spec.model_type) else { return };
    let weights = larder_fuzz::fixtures().join(fixture).join("model.safetensors");
    if let Err(e) = std::os::unix::fs::symlink(&weights, dir.join("model.safetensors")) {
        panic!("cannot link {}: {e}", weights.display());
    }
    let Ok(ckpt) = Checkpoint::open(dir) else { return };
    let _ = routed_expert_parts(&spec, &ckpt);
    let _ = DecoderModel::load(spec, &ckpt, None);
}

fuzz_target!(|data: &[u8]| {
    let dir = larder_fuzz::scratch_dir("config");
    larder_fuzz::write(dir, "config.json", data);
    let Ok(spec) = larder_model::arch::read_spec(dir) else { return };
    estimate(&spec);
    load(dir, spec);
});
