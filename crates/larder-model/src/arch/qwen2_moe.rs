//! Qwen2-MoE: Qwen3-MoE's layer plan without q/k norms, with q/k/v biases and
//! a shared expert scaled by `sigmoid(shared_expert_gate(x))`.

use crate::config::{ConfigJson, ConfigKeys};
use crate::error::ModelError;
use crate::spec::{ModelSpec, MoeNames, SharedExpertSpec};

/// `model_type: qwen2_moe`'s config.json keys.
pub(crate) const KEYS: ConfigKeys = ConfigKeys {
    docs: "Qwen2-MoE",
    read: &[
        super::SHARED_KEYS,
        super::qwen3_moe::QWEN_MOE_KEYS,
        &["qkv_bias", "shared_expert_intermediate_size"],
    ],
    refused: &[],
};

/// `model_type: qwen2_moe`.
pub(crate) fn spec(cfg: &ConfigJson) -> Result<ModelSpec, ModelError> {
    let base = super::base_spec(cfg, 10000.0, 8192, MoeNames::QWEN)?;
    let spec = ModelSpec {
        qkv_bias: cfg.opt_bool("qkv_bias")?.unwrap_or(true),
        o_bias: false,
        ..base
    };
    let shared = match cfg.opt_usize("shared_expert_intermediate_size")? {
        Some(0) | None => None,
        Some(intermediate) => Some(SharedExpertSpec {
            sigmoid_gate: true,
            ..SharedExpertSpec::new(intermediate)
        }),
    };
    let layers = super::qwen3_moe::qwen_moe_layers(cfg, shared)?;
    super::finish(cfg, spec, layers)
}
