//! Supported architectures: each file turns its `config.json` into a
//! [`ModelSpec`]; [`load_model`] picks the file by `model_type`.

pub mod deepseek_v3;
pub mod gpt_oss;
mod kimi_k3;
pub mod kimi_linear;
pub mod llama;
pub mod mixtral;
pub mod qwen2_moe;
pub mod qwen3_moe;

use std::path::Path;
use std::sync::Arc;

use crate::checkpoint::Checkpoint;
use crate::config::{ConfigJson, LayerSpec, MlaCache, ModelSpec, MoeNames};
use crate::decoder::DecoderModel;
use crate::error::ModelError;
use crate::expert::ExpertProvider;
use crate::rope::RopeSpec;

/// Reads one architecture's config.json into a [`ModelSpec`].
type SpecReader = fn(&ConfigJson) -> Result<ModelSpec, ModelError>;

/// `model_type` values larder can load, with the function that reads each config.
const ARCHITECTURES: &[(&str, SpecReader)] = &[
    ("llama", llama::spec),
    ("mistral", llama::spec_mistral),
    ("qwen3_moe", qwen3_moe::spec),
    ("qwen2_moe", qwen2_moe::spec),
    ("mixtral", mixtral::spec),
    ("deepseek_v3", deepseek_v3::spec),
    ("kimi_k2", deepseek_v3::spec),
    ("kimi_linear", kimi_linear::spec),
    ("gpt_oss", gpt_oss::spec),
];

/// Names of the supported `model_type`s.
pub fn supported() -> Vec<&'static str> {
    ARCHITECTURES.iter().map(|(n, _)| *n).collect()
}

/// Reads `dir/config.json` into a [`ModelSpec`].
pub fn read_spec(dir: &Path) -> Result<ModelSpec, ModelError> {
    spec_from_config(&ConfigJson::read(dir)?)
}

/// A parsed config.json into a [`ModelSpec`] (errors name `cfg.path`).
pub fn spec_from_config(cfg: &ConfigJson) -> Result<ModelSpec, ModelError> {
    let model_type = cfg
        .opt_str("model_type")?
        .ok_or_else(|| cfg.err("model_type", "missing; cannot tell the architecture"))?
        .to_string();
    let parse = ARCHITECTURES
        .iter()
        .find(|(n, _)| *n == model_type)
        .map(|(_, f)| *f)
        .ok_or_else(|| ModelError::UnknownArch {
            path: cfg.path.clone(),
            model_type: model_type.clone(),
            supported: supported().join(", "),
        })?;
    parse(cfg)
}

/// Loads a checkpoint folder: config, then every weight (experts from
/// `experts` when given, else into RAM).
pub fn load_model(dir: &Path, experts: Option<Arc<dyn ExpertProvider>>) -> Result<DecoderModel, ModelError> {
    load_model_with(dir, experts, MlaCache::default())
}

/// [`load_model`] with MLA layers caching as `mla_cache` says.
pub fn load_model_with(dir: &Path, experts: Option<Arc<dyn ExpertProvider>>, mla_cache: MlaCache) -> Result<DecoderModel, ModelError> {
    let spec = ModelSpec {
        mla_cache,
        ..read_spec(dir)?
    };
    let ckpt = Checkpoint::open(dir)?;
    DecoderModel::load(spec, &ckpt, experts)
}

/// The fields every architecture shares, read with its own defaults.
/// `layers` is left empty for the caller to fill.
pub(crate) fn base_spec(
    cfg: &ConfigJson,
    default_theta: f64,
    default_max_pos: usize,
    moe_names: MoeNames,
) -> Result<ModelSpec, ModelError> {
    cfg.require_silu()?;
    let (hidden_size, num_heads, num_kv_heads, head_dim) = cfg.attention_dims()?;
    let attention_bias = cfg.opt_bool("attention_bias")?.unwrap_or(false);
    if cfg.opt_bool("mlp_bias")?.unwrap_or(false) {
        return Err(cfg.err("mlp_bias", "MLP biases are not supported"));
    }
    Ok(ModelSpec {
        model_type: cfg.opt_str("model_type")?.unwrap_or_default().to_string(),
        hidden_size,
        vocab_size: cfg.usize("vocab_size")?,
        num_heads,
        num_kv_heads,
        head_dim,
        rms_norm_eps: cfg.rms_norm_eps()?,
        max_position_embeddings: cfg.opt_usize("max_position_embeddings")?.unwrap_or(default_max_pos),
        rope: RopeSpec::from_config(cfg, default_theta)?,
        tie_word_embeddings: cfg.opt_bool("tie_word_embeddings")?.unwrap_or(false),
        qkv_bias: attention_bias,
        o_bias: attention_bias,
        qk_norm: false,
        layers: Vec::new(),
        moe_names,
        fp8_block: None,
        compressed: None,
        mxfp4_experts: None,
        attn_res_block: None,
        attention_sinks: false,
        mla_cache: MlaCache::default(),
    })
}

/// Per-layer sliding windows: from `layer_types` when present, else the
/// Qwen convention (`use_sliding_window`, applied from `max_window_layers` on).
pub(crate) fn qwen_sliding_windows(cfg: &ConfigJson, num_layers: usize) -> Result<Vec<Option<usize>>, ModelError> {
    let window = cfg.opt_usize("sliding_window")?;
    if let Some(types) = cfg.raw("layer_types") {
        let types = types.as_array().ok_or_else(|| cfg.err("layer_types", "expected a list"))?;
        if types.len() != num_layers {
            return Err(cfg.err("layer_types", format!("{} entries for {num_layers} layers", types.len())));
        }
        return types
            .iter()
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(None),
                Some("sliding_attention") => window
                    .map(Some)
                    .ok_or_else(|| cfg.err("sliding_window", "required by a sliding_attention layer")),
                _ => Err(cfg.err("layer_types", format!("unsupported layer type {t}"))),
            })
            .collect();
    }
    let use_sliding = cfg.opt_bool("use_sliding_window")?.unwrap_or(false);
    let from = cfg.opt_usize("max_window_layers")?.unwrap_or(num_layers);
    Ok((0..num_layers)
        .map(|l| if use_sliding && l >= from { window } else { None })
        .collect())
}

/// Checks per-layer settings are sane, and every size the spec implies is
/// within `spec_limits`' bounds.
pub(crate) fn finish(cfg: &ConfigJson, mut spec: ModelSpec, layers: Vec<LayerSpec>) -> Result<ModelSpec, ModelError> {
    if layers.is_empty() {
        return Err(cfg.err("num_hidden_layers", "must be positive"));
    }
    if layers.iter().any(|l| l.sliding_window == Some(0)) {
        return Err(cfg.err("sliding_window", "must be positive"));
    }
    spec.layers = layers;
    crate::spec_limits::check(cfg, &spec)?;
    Ok(spec)
}
