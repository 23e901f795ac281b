//! Qwen3-MoE: GQA with per-head q/k RMSNorm, softmax top-k routing with
//! optional `norm_topk_prob`, MoE on every `decoder_sparse_step`-th layer
//! except `mlp_only_layers`, which are dense.

use crate::config::{check_top_k, ConfigJson, ConfigKeys};
use crate::error::ModelError;
use crate::spec::{FfnSpec, LayerSpec, MixerSpec, ModelSpec, MoeNames, MoeSpec, SharedExpertSpec};

/// The keys of the layer plan Qwen2-MoE and Qwen3-MoE share ([`qwen_moe_layers`]).
pub(crate) const QWEN_MOE_KEYS: &[&str] = &[
    "intermediate_size",
    "moe_intermediate_size",
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "norm_topk_prob",
    "decoder_sparse_step",
    "mlp_only_layers",
    "layer_types",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
];

/// `model_type: qwen3_moe`'s config.json keys.
pub(crate) const KEYS: ConfigKeys = ConfigKeys {
    docs: "Qwen3-MoE",
    read: &[super::SHARED_KEYS, QWEN_MOE_KEYS],
    refused: &[],
};

/// `model_type: qwen3_moe`.
pub(crate) fn spec(cfg: &ConfigJson) -> Result<ModelSpec, ModelError> {
    let spec = ModelSpec {
        qk_norm: true,
        ..super::base_spec(cfg, 10000.0, 32768, MoeNames::QWEN)?
    };
    let layers = qwen_moe_layers(cfg, None)?;
    super::finish(cfg, spec, layers)
}

/// The layer plan shared by Qwen2-MoE and Qwen3-MoE.
pub(crate) fn qwen_moe_layers(cfg: &ConfigJson, shared: Option<SharedExpertSpec>) -> Result<Vec<LayerSpec>, ModelError> {
    let n = cfg.num_layers()?;
    // Hub configs say `num_experts`; transformers 5 writes `num_local_experts`.
    let num_experts = match cfg.opt_usize("num_experts")? {
        Some(n) => n,
        None => cfg.opt_usize("num_local_experts")?.unwrap_or(0),
    };
    let step = cfg.opt_usize("decoder_sparse_step")?.unwrap_or(1);
    if step == 0 {
        return Err(cfg.err("decoder_sparse_step", "must be positive"));
    }
    let dense_only = cfg.opt_usize_list("mlp_only_layers")?;
    if let Some(&bad) = dense_only.iter().find(|&&l| l >= n) {
        return Err(cfg.err("mlp_only_layers", format!("layer {bad} does not exist ({n} layers)")));
    }
    let windows = super::qwen_sliding_windows(cfg, n)?;
    let moe = if num_experts > 0 {
        let top_k = cfg.usize("num_experts_per_tok")?;
        check_top_k(cfg, num_experts, top_k)?;
        Some(MoeSpec {
            renormalize: cfg.opt_bool("norm_topk_prob")?.unwrap_or(false),
            shared_expert: shared,
            ..MoeSpec::new(num_experts, top_k, cfg.usize("moe_intermediate_size")?)
        })
    } else {
        None
    };
    let dense = || -> Result<FfnSpec, ModelError> {
        Ok(FfnSpec::Dense {
            intermediate: cfg.usize("intermediate_size")?,
        })
    };
    (0..n)
        .map(|l| {
            let ffn = match &moe {
                Some(m) if !dense_only.contains(&l) && (l + 1) % step == 0 => FfnSpec::Moe(m.clone()),
                _ => dense()?,
            };
            Ok(LayerSpec {
                sliding_window: windows[l],
                ..LayerSpec::new(MixerSpec::Gqa, ffn)
            })
        })
        .collect()
}
