//! Llama (and Mistral): dense SwiGLU decoders, e.g. SmolLM2, Llama 3.x.
//! Used for real-text tests and as draft models.

use crate::config::{ConfigJson, FfnSpec, LayerSpec, MixerSpec, ModelSpec, MoeNames};
use crate::error::ModelError;

/// `model_type: llama`.
pub fn spec(cfg: &ConfigJson) -> Result<ModelSpec, ModelError> {
    dense(cfg, None)
}

/// `model_type: mistral`: Llama with an optional sliding window on every layer.
pub fn spec_mistral(cfg: &ConfigJson) -> Result<ModelSpec, ModelError> {
    let window = cfg.opt_usize("sliding_window")?;
    dense(cfg, window)
}

fn dense(cfg: &ConfigJson, window: Option<usize>) -> Result<ModelSpec, ModelError> {
    let spec = super::base_spec(cfg, 10000.0, 2048, MoeNames::QWEN)?;
    let n = cfg.num_layers()?;
    let intermediate = cfg.usize("intermediate_size")?;
    let layers = (0..n)
        .map(|_| LayerSpec {
            mixer: MixerSpec::Gqa,
            sliding_window: window,
            ffn: FfnSpec::Dense { intermediate },
        })
        .collect();
    super::finish(cfg, spec, layers)
}
