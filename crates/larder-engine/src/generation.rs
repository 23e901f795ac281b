//! `generation_config.json`: which token ids end generation.

use std::path::Path;

use serde_json::Value;

use crate::error::EngineError;

/// The parts of a checkpoint's generation config larder honours.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    /// Generation stops after producing any of these (the id is kept in the output, as transformers does).
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
}

impl GenerationConfig {
    /// Reads `generation_config.json`, falling back to `config.json`'s ids.
    pub fn from_dir(dir: &Path) -> Result<Self, EngineError> {
        for name in ["generation_config.json", "config.json"] {
            let path = dir.join(name);
            if !path.exists() {
                continue;
            }
            let text = std::fs::read_to_string(&path).map_err(|source| EngineError::Io {
                path: path.clone(),
                source,
            })?;
            let json: Value = serde_json::from_str(&text).map_err(|e| EngineError::File {
                path: path.clone(),
                message: format!("not valid JSON: {e}"),
            })?;
            if json.get("eos_token_id").is_some_and(|v| !v.is_null()) || name == "config.json" {
                return Ok(GenerationConfig {
                    eos_token_ids: id_list(&path, "eos_token_id", json.get("eos_token_id"))?,
                    bos_token_id: id_list(&path, "bos_token_id", json.get("bos_token_id"))?.first().copied(),
                });
            }
        }
        Ok(GenerationConfig::default())
    }
}

fn id_list(path: &Path, field: &str, v: Option<&Value>) -> Result<Vec<u32>, EngineError> {
    let bad = || EngineError::File {
        path: path.to_path_buf(),
        message: format!("field `{field}` must be a token id or a list of ids"),
    };
    let one = |v: &Value| v.as_u64().and_then(|u| u32::try_from(u).ok()).ok_or_else(bad);
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items.iter().map(one).collect(),
        Some(v) => Ok(vec![one(v)?]),
    }
}
