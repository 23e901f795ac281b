//! Llama (and Mistral): dense SwiGLU decoders, e.g. SmolLM2, Llama 3.x.
//! Used for real-text tests and as draft models.

use crate::config::{ConfigJson, ConfigKeys};
use crate::error::ModelError;
use crate::spec::{FfnSpec, LayerSpec, MixerSpec, ModelSpec, MoeNames};

/// Llama's own keys, beyond the shared ones (`super::SHARED_KEYS`).
const LLAMA: &[&str] = &[
    "intermediate_size",
    // No effect: nanotron's export marker (SmolLM2).
    "is_llama_config",
];

/// `model_type: llama`'s config.json keys.
pub(crate) const LLAMA_KEYS: ConfigKeys = ConfigKeys {
    docs: "Llama / Mistral",
    read: &[super::SHARED_KEYS, LLAMA],
    refused: &[],
};

/// `model_type: mistral`'s config.json keys: Llama's and `sliding_window`.
pub(crate) const MISTRAL_KEYS: ConfigKeys = ConfigKeys {
    docs: "Llama / Mistral",
    read: &[super::SHARED_KEYS, LLAMA, &["sliding_window"]],
    refused: &[],
};

/// `model_type: llama`.
pub(crate) fn spec(cfg: &ConfigJson) -> Result<ModelSpec, ModelError> {
    dense(cfg, None)
}

/// `model_type: mistral`: Llama with an optional sliding window on every layer.
pub(crate) fn spec_mistral(cfg: &ConfigJson) -> Result<ModelSpec, ModelError> {
    let window = cfg.opt_usize("sliding_window")?;
    dense(cfg, window)
}

fn dense(cfg: &ConfigJson, window: Option<usize>) -> Result<ModelSpec, ModelError> {
    let spec = super::base_spec(cfg, 10000.0, 2048, MoeNames::QWEN)?;
    let n = cfg.num_layers()?;
    let intermediate = cfg.usize("intermediate_size")?;
    let layer = LayerSpec {
        sliding_window: window,
        ..LayerSpec::new(MixerSpec::Gqa, FfnSpec::Dense { intermediate })
    };
    super::finish(cfg, spec, vec![layer; n])
}
