//! Mixtral: Mistral attention with a sparse MoE on every layer
//! (`block_sparse_moe`, experts `w1`/`w3`/`w2`), softmax top-k, always
//! renormalised.

use crate::config::{check_top_k, ConfigJson, FfnSpec, LayerSpec, MixerSpec, ModelSpec, MoeNames, MoeSpec};
use crate::error::ModelError;

const NAMES: MoeNames = MoeNames {
    block: "block_sparse_moe",
    router: "gate",
    expert_proj: ["w1", "w3", "w2"],
    shared_expert: "shared_expert",
    shared_expert_gate: "shared_expert_gate",
};

/// `model_type: mixtral`.
pub fn spec(cfg: &ConfigJson) -> Result<ModelSpec, ModelError> {
    let spec = super::base_spec(cfg, 1e6, 4096 * 32, NAMES)?;
    let n = cfg.num_layers()?;
    let num_experts = cfg.usize("num_local_experts")?;
    let top_k = cfg.usize("num_experts_per_tok")?;
    check_top_k(cfg, num_experts, top_k)?;
    let moe = MoeSpec {
        num_experts,
        top_k,
        renormalize: true,
        expert_intermediate: cfg.usize("intermediate_size")?,
        latent: None,
        shared_expert: None,
        scoring: crate::config::Scoring::Softmax,
        experts: crate::config::ExpertKind::Swiglu,
    };
    let window = cfg.opt_usize("sliding_window")?;
    let layers = (0..n)
        .map(|_| LayerSpec {
            mixer: MixerSpec::Gqa,
            sliding_window: window,
            ffn: FfnSpec::Moe(moe.clone()),
        })
        .collect();
    super::finish(cfg, spec, layers)
}
