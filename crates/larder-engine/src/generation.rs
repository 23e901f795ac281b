//! `generation_config.json`: which token ids end generation, and the
//! sampling defaults the model's authors ship (temperature, top_p, top_k,
//! do_sample), which the server applies when a request omits them.

use std::path::Path;

use serde_json::Value;

use crate::error::EngineError;
use crate::sampling::SamplingParams;

/// The parts of a checkpoint's generation config larder honours.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct GenerationConfig {
    /// Generation stops after producing any of these (the id is kept in the output, as transformers does).
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    /// `do_sample` (transformers' default when absent: false, i.e. greedy).
    pub do_sample: Option<bool>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
}

impl GenerationConfig {
    /// Reads `generation_config.json`, falling back to `config.json`'s ids.
    pub fn from_dir(dir: &Path) -> Result<Self, EngineError> {
        let mut out = GenerationConfig::default();
        let mut found_ids = false;
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
            if name == "generation_config.json" {
                read_sampling(&path, &json, &mut out)?;
            }
            let has_eos = json.get("eos_token_id").is_some_and(|v| !v.is_null());
            if !found_ids && (has_eos || name == "config.json") {
                out.eos_token_ids = id_list(&path, "eos_token_id", json.get("eos_token_id"))?;
                out.bos_token_id = id_list(&path, "bos_token_id", json.get("bos_token_id"))?.first().copied();
                found_ids = true;
            }
        }
        Ok(out)
    }

    /// The sampling a request gets for the fields it omits, as vLLM
    /// serves it: each of temperature, top_p, top_k the file gives, else
    /// OpenAI's defaults (temperature 1, top_p 1, top_k off); `do_sample` is
    /// read but not consulted. The seed is left at 0.
    pub fn sampling_defaults(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature.unwrap_or(1.0),
            top_p: self.top_p.unwrap_or(1.0),
            top_k: self.top_k.unwrap_or(0),
            seed: 0,
        }
    }
}

/// Reads do_sample / temperature / top_p / top_k, range-checked.
fn read_sampling(path: &Path, json: &Value, out: &mut GenerationConfig) -> Result<(), EngineError> {
    let bad = |field: &str, want: &str| EngineError::File {
        path: path.to_path_buf(),
        message: format!("field `{field}` must be {want}; fix or remove it"),
    };
    let present = |k: &str| json.get(k).filter(|v| !v.is_null());
    out.do_sample = match present("do_sample") {
        None => None,
        Some(v) => Some(v.as_bool().ok_or_else(|| bad("do_sample", "true or false"))?),
    };
    let float = |k: &str, lo: f64, hi: f64| -> Result<Option<f32>, EngineError> {
        match present(k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite() && (lo..=hi).contains(x))
                .map(|x| Some(x as f32))
                .ok_or_else(|| bad(k, &format!("a number in {lo}..={hi}"))),
        }
    };
    out.temperature = float("temperature", 0.0, 100.0)?;
    out.top_p = float("top_p", f64::MIN_POSITIVE, 1.0)?;
    out.top_k = match present("top_k") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .and_then(|k| usize::try_from(k).ok())
                .ok_or_else(|| bad("top_k", "a non-negative integer"))?,
        ),
    };
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn read(json: &str) -> Result<GenerationConfig, EngineError> {
        let dir = std::env::temp_dir().join(format!("larder-genconf-{}-{}", std::process::id(), json.len()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("generation_config.json"), json).unwrap();
        let r = GenerationConfig::from_dir(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        r
    }

    #[test]
    fn sampling_defaults_follow_vllm() {
        let g = read(r#"{"eos_token_id": 2, "do_sample": true, "temperature": 0.6, "top_p": 0.95, "top_k": 20}"#).unwrap();
        assert_eq!(g.eos_token_ids, vec![2]);
        let s = g.sampling_defaults();
        assert_eq!((s.temperature, s.top_p, s.top_k), (0.6, 0.95, 20));
        // As vLLM: the file's temperature whatever do_sample says; OpenAI's 1.0 when it gives none.
        for (j, t) in [
            (r#"{"do_sample": false, "temperature": 0.7}"#, 0.7),
            (r#"{"temperature": 0.0}"#, 0.0),
            (r#"{"do_sample": true}"#, 1.0),
        ] {
            assert_eq!(read(j).unwrap().sampling_defaults().temperature, t, "{j}");
        }
        let openai = read("{}").unwrap().sampling_defaults();
        assert_eq!((openai.temperature, openai.top_p, openai.top_k), (1.0, 1.0, 0));
        for j in [
            r#"{"top_p": 0}"#,
            r#"{"temperature": -1}"#,
            r#"{"top_k": 1.5}"#,
            r#"{"do_sample": "yes"}"#,
        ] {
            let e = read(j).unwrap_err().to_string();
            assert!(e.contains("generation_config.json") && e.contains("field"), "{j}: {e}");
        }
    }
}
