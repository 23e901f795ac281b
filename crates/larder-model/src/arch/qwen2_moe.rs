//! Qwen2-MoE: Qwen3-MoE's layer plan without q/k norms, with q/k/v biases and
//! a shared expert scaled by `sigmoid(shared_expert_gate(x))`.

use crate::config::{ConfigJson, ModelSpec, MoeNames, SharedExpertSpec};
use crate::error::ModelError;

/// `model_type: qwen2_moe`.
pub fn spec(cfg: &ConfigJson) -> Result<ModelSpec, ModelError> {
    let mut spec = super::base_spec(cfg, 10000.0, 8192, MoeNames::QWEN)?;
    spec.qkv_bias = cfg.opt_bool("qkv_bias")?.unwrap_or(true);
    spec.o_bias = false;
    let shared = match cfg.opt_usize("shared_expert_intermediate_size")? {
        Some(0) | None => None,
        Some(intermediate) => Some(SharedExpertSpec {
            intermediate,
            sigmoid_gate: true,
        }),
    };
    let layers = super::qwen3_moe::qwen_moe_layers(cfg, shared)?;
    super::finish(cfg, spec, layers)
}
