//! Kimi K3 (`model_type: kimi_k3`, `KimiK3ForConditionalGeneration`): the
//! release wraps a `kimi_linear` text model (`text_config`, read by
//! `kimi_linear.rs` with Moonshot's defaults and K3's fields, `k3_fields.rs`)
//! beside a vision tower larder never reads (`vision_config`, tensors outside
//! `language_model.`; docs/kimi_k3_reference.md).

use serde_json::Value;

use crate::config::{ConfigJson, ConfigKeys};
use crate::error::ModelError;
use crate::spec::ModelSpec;

/// `model_type: kimi_k3`'s top-level keys (besides the bookkeeping ones).
pub(crate) const KEYS: ConfigKeys = ConfigKeys {
    docs: "Kimi K3",
    read: &[&[
        "model_type",
        "text_config",
        "vision_config",
        "quantization_config",
        "tie_word_embeddings",
        "media_placeholder_token_id",
        "image_placeholder",
        "ignore_index",
    ]],
    refused: &[],
};

/// `model_type: kimi_k3`: the text model of `text_config`, its fields named
/// `text_config.*` in errors, with `quantization_config` from the text
/// config or the top level (both must agree).
pub(crate) fn spec(cfg: &ConfigJson) -> Result<ModelSpec, ModelError> {
    let text = match cfg.raw("text_config") {
        Some(Value::Object(m)) => m.clone(),
        Some(v) => return Err(cfg.err("text_config", format!("expected an object (the text model's config), found {v}"))),
        None => {
            return Err(cfg.err(
                "text_config",
                "missing: a kimi_k3 config.json holds its text model's config under text_config (the release does); \
                 larder does not guess one",
            ))
        }
    };
    match cfg.raw("vision_config") {
        None | Some(Value::Object(_)) => {}
        Some(v) => return Err(cfg.err("vision_config", format!("expected an object, found {v}"))),
    }
    let mut value = Value::Object(text);
    match (
        cfg.raw("quantization_config"),
        value.get("quantization_config").filter(|v| !v.is_null()),
    ) {
        (Some(top), Some(inner)) if top != inner => {
            return Err(cfg.err(
                "quantization_config",
                "disagrees with text_config.quantization_config; give one of them",
            ))
        }
        (Some(top), None) => value["quantization_config"] = top.clone(),
        _ => {}
    }
    if let Some(t) = value.get("model_type").and_then(Value::as_str).filter(|t| *t != "kimi_linear") {
        return Err(cfg.err("text_config.model_type", format!("{t:?}: a kimi_k3 text model is kimi_linear")));
    }
    if cfg.opt_bool("tie_word_embeddings")? == Some(true) {
        return Err(cfg.err("tie_word_embeddings", "true is not supported: K3's lm_head is its own tensor"));
    }
    value["model_type"] = Value::from("kimi_linear");
    let text_cfg = ConfigJson {
        path: cfg.path.clone(),
        value,
    };
    let scoped = |e: ModelError| e.scoped("text_config.");
    text_cfg.check_keys("kimi_linear", &super::kimi_linear::KEYS).map_err(scoped)?;
    let mut spec = super::kimi_linear::spec_moonshot(&text_cfg).map_err(scoped)?;
    spec.model_type = "kimi_k3".into();
    spec.wrapped_text_model = true;
    spec.config_prefix = "text_config.";
    Ok(spec)
}
