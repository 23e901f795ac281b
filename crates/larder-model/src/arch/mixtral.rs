//! Mixtral: Mistral attention with a sparse MoE on every layer
//! (`block_sparse_moe`, experts `w1`/`w3`/`w2`), softmax top-k, always
//! renormalised.

use crate::config::{check_top_k, ConfigJson, ConfigKeys};
use crate::error::ModelError;
use crate::spec::{FfnSpec, LayerSpec, MixerSpec, ModelSpec, MoeNames, MoeSpec};

const NAMES: MoeNames = MoeNames {
    block: "block_sparse_moe",
    expert_proj: ["w1", "w3", "w2"],
    ..MoeNames::QWEN
};

/// `model_type: mixtral`'s config.json keys, beyond the shared ones.
pub(crate) const KEYS: ConfigKeys = ConfigKeys {
    docs: "Mixtral",
    read: &[
        super::SHARED_KEYS,
        &[
            "intermediate_size",
            "num_local_experts",
            "num_experts_per_tok",
            "sliding_window",
            // No effect at inference: training-time router noise.
            "router_jitter_noise",
        ],
    ],
    refused: &[],
};

/// `model_type: mixtral`.
pub(crate) fn spec(cfg: &ConfigJson) -> Result<ModelSpec, ModelError> {
    let spec = super::base_spec(cfg, 1e6, 4096 * 32, NAMES)?;
    let n = cfg.num_layers()?;
    let num_experts = cfg.usize("num_local_experts")?;
    let top_k = cfg.usize("num_experts_per_tok")?;
    check_top_k(cfg, num_experts, top_k)?;
    let moe = MoeSpec {
        renormalize: true,
        ..MoeSpec::new(num_experts, top_k, cfg.usize("intermediate_size")?)
    };
    let layer = LayerSpec {
        sliding_window: cfg.opt_usize("sliding_window")?,
        ..LayerSpec::new(MixerSpec::Gqa, FfnSpec::Moe(moe))
    };
    super::finish(cfg, spec, vec![layer; n])
}
