//! Supported architectures: each file turns its `config.json` into a
//! [`ModelSpec`], stating only what differs from the spec defaults
//! (`crate::spec`) and listing every config.json key it reads
//! ([`ConfigKeys`]); [`ARCHITECTURES`] picks the file by `model_type`, and
//! [`spec_from_config`] refuses every key the architecture does not read
//! before the file's reader runs (the one policy, docs/architectures.md).
//! [`ModelLoad`] loads a checkpoint folder with it.

pub(crate) mod deepseek_v3;
pub(crate) mod gpt_oss;
mod k3_fields;
mod kimi_k3;
pub(crate) mod kimi_linear;
pub(crate) mod llama;
pub(crate) mod mixtral;
pub(crate) mod qwen2_moe;
pub(crate) mod qwen3_moe;

use std::path::Path;
use std::sync::Arc;

use crate::checkpoint::Checkpoint;
use crate::config::{ConfigJson, ConfigKeys};
use crate::decoder::DecoderModel;
use crate::error::ModelError;
use crate::expert::ExpertProvider;
use crate::rope::RopeSpec;
use crate::spec::{LayerSpec, MlaCache, ModelSpec, MoeNames};

/// Reads one architecture's config.json into a [`ModelSpec`].
type SpecReader = fn(&ConfigJson) -> Result<ModelSpec, ModelError>;

/// One `model_type` larder loads: the config.json keys it accepts and the
/// function that reads them.
pub struct Architecture {
    pub model_type: &'static str,
    pub keys: ConfigKeys,
    read: SpecReader,
}

/// Every `model_type` larder can load.
pub const ARCHITECTURES: &[Architecture] = &[
    Architecture {
        model_type: "llama",
        keys: llama::LLAMA_KEYS,
        read: llama::spec,
    },
    Architecture {
        model_type: "mistral",
        keys: llama::MISTRAL_KEYS,
        read: llama::spec_mistral,
    },
    Architecture {
        model_type: "qwen3_moe",
        keys: qwen3_moe::KEYS,
        read: qwen3_moe::spec,
    },
    Architecture {
        model_type: "qwen2_moe",
        keys: qwen2_moe::KEYS,
        read: qwen2_moe::spec,
    },
    Architecture {
        model_type: "mixtral",
        keys: mixtral::KEYS,
        read: mixtral::spec,
    },
    Architecture {
        model_type: "deepseek_v3",
        keys: deepseek_v3::KEYS,
        read: deepseek_v3::spec,
    },
    Architecture {
        model_type: "kimi_k2",
        keys: deepseek_v3::KEYS,
        read: deepseek_v3::spec,
    },
    Architecture {
        model_type: "kimi_linear",
        keys: kimi_linear::KEYS,
        read: kimi_linear::spec,
    },
    Architecture {
        model_type: "kimi_k3",
        keys: kimi_k3::KEYS,
        read: kimi_k3::spec,
    },
    Architecture {
        model_type: "gpt_oss",
        keys: gpt_oss::KEYS,
        read: gpt_oss::spec,
    },
];

/// The keys `base_spec` (and the RoPE reader it calls) reads: every GQA
/// architecture's shared fields.
pub(crate) const SHARED_KEYS: &[&str] = &[
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "rms_norm_eps",
    "max_position_embeddings",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "rope_interleaved",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
];

/// Names of the supported `model_type`s.
pub fn supported() -> Vec<&'static str> {
    ARCHITECTURES.iter().map(|a| a.model_type).collect()
}

/// Reads `dir/config.json` into a [`ModelSpec`].
pub fn read_spec(dir: &Path) -> Result<ModelSpec, ModelError> {
    spec_from_config(&ConfigJson::read(dir)?)
}

/// A parsed config.json into a [`ModelSpec`] (errors name `cfg.path`):
/// the architecture its `model_type` names, after every key is checked
/// against those it reads ([`ConfigJson::check_keys`]).
pub fn spec_from_config(cfg: &ConfigJson) -> Result<ModelSpec, ModelError> {
    let model_type = cfg
        .opt_str("model_type")?
        .ok_or_else(|| cfg.err("model_type", "missing; cannot tell the architecture"))?;
    let arch = ARCHITECTURES
        .iter()
        .find(|a| a.model_type == model_type)
        .ok_or_else(|| ModelError::UnknownArch {
            path: cfg.path.clone(),
            model_type: model_type.to_string(),
            supported: supported().join(", "),
        })?;
    cfg.check_keys(arch.model_type, &arch.keys)?;
    (arch.read)(cfg)
}

/// How to load a checkpoint folder ([`ModelLoad::load`]): where routed
/// experts come from (in RAM unless a provider is given) and what MLA
/// layers cache. A builder: `ModelLoad::new().mla_cache(MlaCache::Expanded).load(dir)`.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct ModelLoad {
    /// Routed experts from this provider; `None`: every expert loaded into RAM.
    pub experts: Option<Arc<dyn ExpertProvider>>,
    /// What MLA layers cache per position ([`ModelSpec::mla_cache`]).
    pub mla_cache: MlaCache,
}

impl ModelLoad {
    /// Experts in RAM, the compact MLA cache.
    pub fn new() -> Self {
        ModelLoad::default()
    }

    /// Routed experts from `provider` instead of RAM.
    pub fn experts(mut self, provider: Arc<dyn ExpertProvider>) -> Self {
        self.experts = Some(provider);
        self
    }

    /// MLA layers cache as `cache` says.
    pub fn mla_cache(mut self, cache: MlaCache) -> Self {
        self.mla_cache = cache;
        self
    }

    /// Loads `dir`: config, then every weight.
    pub fn load(&self, dir: &Path) -> Result<DecoderModel, ModelError> {
        let mut spec = read_spec(dir)?;
        spec.mla_cache = self.mla_cache;
        let ckpt = Checkpoint::open(dir)?;
        DecoderModel::load(spec, &ckpt, self.experts.clone())
    }
}

/// Loads a checkpoint folder: config, then every weight (experts from
/// `experts` when given, else into RAM). [`ModelLoad`] for more choices.
pub fn load_model(dir: &Path, experts: Option<Arc<dyn ExpertProvider>>) -> Result<DecoderModel, ModelError> {
    ModelLoad {
        experts,
        ..ModelLoad::default()
    }
    .load(dir)
}

/// The fields every GQA architecture shares ([`SHARED_KEYS`]), read with
/// its own defaults; everything else at [`ModelSpec::default`]. `layers` is
/// left empty for the caller to fill.
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
    if cfg.opt_bool("rope_interleaved")?.unwrap_or(false) {
        return Err(cfg.err(
            "rope_interleaved",
            "true (RoPE on interleaved pairs) is not supported: transformers rotates halves for this architecture (only false)",
        ));
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
        moe_names,
        ..ModelSpec::default()
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use serde_json::json;

    use super::*;
    use crate::config::BOOKKEEPING_KEYS;
    use crate::rope::{ROPE_COMMON_KEYS, ROPE_TYPES};

    const DOCS: &str = include_str!("../../../../docs/architectures.md");

    /// The `## {heading}...` section of docs/architectures.md.
    fn section(heading: &str) -> &'static str {
        let start = DOCS
            .find(&format!("\n## {heading}"))
            .unwrap_or_else(|| panic!("docs/architectures.md has no `## {heading}` section"));
        let rest = &DOCS[start + 1..];
        &rest[..rest.find("\n## ").unwrap_or(rest.len())]
    }

    fn assert_names(heading: &str, keys: &[&str]) {
        let text = section(heading);
        for key in keys {
            assert!(
                text.contains(&format!("`{key}`")),
                "docs/architectures.md ({heading}) does not name `{key}`"
            );
        }
    }

    /// The policy is true as documented: docs/architectures.md names every
    /// key every architecture accepts or refuses, in its section.
    #[test]
    fn the_docs_name_every_key() {
        assert_names("Config keys", BOOKKEEPING_KEYS);
        assert_names("Shared fields", SHARED_KEYS);
        assert_names("Shared fields", ROPE_COMMON_KEYS);
        for (_, keys) in ROPE_TYPES {
            assert_names("Shared fields", keys);
        }
        for arch in ARCHITECTURES {
            for list in arch.keys.read.iter().filter(|list| **list != SHARED_KEYS) {
                assert_names(arch.keys.docs, list);
            }
            let refused: Vec<&str> = arch.keys.refused.iter().map(|(key, _)| *key).collect();
            assert_names(arch.keys.docs, &refused);
        }
    }

    /// Every architecture refuses, by name, a key it does not read, before
    /// reading anything, and accepts every bookkeeping key.
    #[test]
    fn every_architecture_refuses_a_key_it_does_not_read() {
        for arch in ARCHITECTURES {
            let mut value = json!({"model_type": arch.model_type, "larder_no_such_field": null});
            let cfg = ConfigJson {
                path: PathBuf::from("config.json"),
                value: value.clone(),
            };
            let err = spec_from_config(&cfg).unwrap_err().to_string();
            let want = format!("`larder_no_such_field`: is not a {} field larder implements", arch.model_type);
            assert!(err.contains(&want), "{}: {err}", arch.model_type);
            value.as_object_mut().unwrap().remove("larder_no_such_field");
            for key in BOOKKEEPING_KEYS {
                value[*key] = json!(1);
            }
            let cfg = ConfigJson {
                path: PathBuf::from("config.json"),
                value,
            };
            // Now the reader runs (and misses a required field).
            let err = spec_from_config(&cfg).map(|_| ()).unwrap_err().to_string();
            assert!(!err.contains("larder implements"), "{}: {err}", arch.model_type);
        }
    }

    /// Every config.json under fixtures/ loads.
    #[test]
    fn every_fixture_config_loads() {
        let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
        let mut read = 0;
        for entry in std::fs::read_dir(&fixtures).unwrap() {
            let dir = entry.unwrap().path();
            if dir.join("config.json").is_file() {
                read_spec(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
                read += 1;
            }
        }
        assert!(read >= 19, "only {read} fixtures");
    }
}
