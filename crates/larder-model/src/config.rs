//! Reading a checkpoint's `config.json`: [`ConfigJson`], whose accessors
//! check each value and name the field in every error; the bounds a field
//! may hold ([`MAX_CONFIG_INT`] and the limits after it); and the one
//! config-key policy every architecture follows ([`ConfigKeys`],
//! [`ConfigJson::check_keys`]): each key is read by the architecture,
//! bookkeeping (`BOOKKEEPING_KEYS`), or refused naming it.
//!
//! What an architecture reads a config into, [`ModelSpec`] and the specs it
//! holds, is `crate::spec`'s; re-exported here for the paths other crates
//! use (`larder_model::config::ModelSpec`).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::ModelError;

pub use crate::spec::{
    ExpertKind, FfnSpec, KdaOutputGate, KdaSpec, LayerSpec, MixerSpec, MlaCache, MlaSpec, ModelSpec, MoeNames, MoeSpec, Scoring,
    SharedExpertSpec,
};

/// The largest integer any config.json field may hold: far above every real
/// size, count or id, and small enough that products of a few never overflow
/// (found by `fuzz/`'s `config` target: `num_hidden_layers: 2^62` aborted).
pub const MAX_CONFIG_INT: u64 = 1 << 31;

/// The most decoder layers a model may have.
pub const MAX_LAYERS: usize = 4096;

/// The most elements one tensor a config.json implies may have (2^48: 512
/// TiB at bf16), counting derived sizes such as `num_heads x head_dim`. The
/// largest tensors released checkpoints ship are near 2^31 (gpt-oss-120b's
/// fused experts `[128, 2880, 5760]`, DeepSeek-V3's embedding
/// `[129280, 7168]`), so this refuses only the absurd (`doctor` still
/// estimates a 128 TiB embedding, to say it does not fit); it keeps every
/// element and byte count of a model within a u64, the KV-cache bytes per
/// token of 4096 layers included (at most 2^63). Checked by `read_spec`
/// (`spec_limits`).
pub const MAX_TENSOR_ELEMENTS: u64 = 1 << 48;

/// The widest attention head (`head_dim`, MLA's per-head dims, KDA's
/// `head_dim`) a config.json may declare: 2^16, 256 times the widest head of
/// any released model (256). Per-head buffers (the RoPE frequencies, a
/// query's scratch rows) are sized by it without a tensor to check it
/// against (Kimi Linear's unused RoPE table).
pub(crate) const MAX_HEAD_DIM: usize = 1 << 16;

/// Keys any config.json may carry, with any value, because nothing larder or
/// transformers computes for these architectures reads them: Hugging Face
/// bookkeeping, generation defaults, switches of transformers' `forward`
/// outputs and task heads, training-only settings, and larder's own
/// provenance records (`larder_synth`, `larder_upcycle`). Every other key
/// must be one an architecture reads ([`ConfigKeys`]).
pub(crate) const BOOKKEEPING_KEYS: &[&str] = &[
    // Hugging Face bookkeeping
    "architectures",
    "auto_map",
    "_name_or_path",
    "transformers_version",
    "dtype",
    "torch_dtype",
    "tokenizer_class",
    "transformers.js_config",
    // generation defaults
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "use_cache",
    // transformers' forward outputs and task heads
    "output_attentions",
    "output_hidden_states",
    "output_router_logits",
    "return_dict",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
    "id2label",
    "label2id",
    "problem_type",
    // transformers' PretrainedConfig attributes every config may carry
    // (serialization, task heads, generate() defaults): none changes logits
    "use_return_dict",
    "torchscript",
    "tie_encoder_decoder",
    "is_decoder",
    "add_cross_attention",
    "cross_attention_hidden_size",
    "pruned_heads",
    "finetuning_task",
    "prefix",
    "task_specific_params",
    "tf_legacy_loss",
    "use_bfloat16",
    "sep_token_id",
    "decoder_start_token_id",
    "max_length",
    "min_length",
    "do_sample",
    "early_stopping",
    "num_beams",
    "num_beam_groups",
    "diversity_penalty",
    "temperature",
    "top_k",
    "top_p",
    "typical_p",
    "repetition_penalty",
    "length_penalty",
    "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size",
    "bad_words_ids",
    "num_return_sequences",
    "output_scores",
    "return_dict_in_generate",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "remove_invalid_values",
    "exponential_decay_length_penalty",
    "suppress_tokens",
    "begin_suppress_tokens",
    "_attn_implementation",
    "_attn_implementation_autoset",
    "_commit_hash",
    // training only
    "initializer_range",
    "attention_dropout",
    "router_aux_loss_coef",
    "pretraining_tp",
    // larder's own records
    "larder_synth",
    "larder_upcycle",
];

/// The config.json keys one architecture accepts besides `BOOKKEEPING_KEYS`
/// (checked by [`ConfigJson::check_keys`] before its reader runs).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ConfigKeys {
    /// The section of docs/architectures.md that lists the keys (named in refusals).
    pub docs: &'static str,
    /// Keys the architecture's reader reads, each value checked where it is
    /// read: its own fields, transformers' aliases and derived fields
    /// (accepted only with the value transformers derives), and fields known
    /// to have no effect on this architecture's logits. Several lists, so
    /// architectures share the fields their common reader reads.
    pub read: &'static [&'static [&'static str]],
    /// Keys of features larder knows of and does not implement, with what
    /// each is: refused naming the feature, unless null (the feature off).
    pub refused: &'static [(&'static str, &'static str)],
}

impl ConfigKeys {
    /// Whether the architecture reads `key` (or `key` is bookkeeping).
    pub fn accepts(&self, key: &str) -> bool {
        BOOKKEEPING_KEYS.contains(&key) || self.read.iter().any(|list| list.contains(&key))
    }
}

/// A parsed config.json with the path kept for error messages.
pub struct ConfigJson {
    pub path: PathBuf,
    pub value: Value,
}

impl ConfigJson {
    /// Reads `dir/config.json`.
    pub fn read(dir: &Path) -> Result<Self, ModelError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io {
            path: path.clone(),
            source,
        })?;
        let value: Value = serde_json::from_str(&text).map_err(|e| ModelError::Json {
            path: path.clone(),
            message: e.to_string(),
        })?;
        if !value.is_object() {
            return Err(ModelError::Json {
                path,
                message: "top level is not an object".into(),
            });
        }
        Ok(ConfigJson { path, value })
    }

    pub fn err(&self, field: &str, message: impl Into<String>) -> ModelError {
        ModelError::config(&self.path, field, message)
    }

    /// The one config-key policy: every top-level key of config.json is read
    /// by architecture `arch` or is bookkeeping (`keys`); a key of a feature
    /// larder does not implement is refused naming the feature, any other
    /// key (even null) as a field larder does not implement. A field that
    /// may change the computation is never ignored.
    pub fn check_keys(&self, arch: &str, keys: &ConfigKeys) -> Result<(), ModelError> {
        for (key, value) in self.value.as_object().into_iter().flatten() {
            if let Some((_, feature)) = keys.refused.iter().find(|(name, _)| name == key) {
                if value.is_null() {
                    continue;
                }
                return Err(self.err(
                    key,
                    format!("is {feature} larder does not implement; see docs/architectures.md ({})", keys.docs),
                ));
            }
            if !keys.accepts(key) {
                return Err(self.unknown_key(key, arch, keys.docs));
            }
        }
        Ok(())
    }

    /// The refusal of `field`, a key architecture `arch` does not read
    /// (nested keys spelled `parent.key`).
    pub(crate) fn unknown_key(&self, field: &str, arch: &str, docs: &str) -> ModelError {
        self.err(
            field,
            format!(
                "is not a {arch} field larder implements (a field larder cannot interpret may change the computation, so \
                 it is refused rather than ignored); see docs/architectures.md ({docs})"
            ),
        )
    }

    fn get(&self, field: &str) -> Option<&Value> {
        self.value.get(field).filter(|v| !v.is_null())
    }

    /// A required positive integer.
    pub fn usize(&self, field: &str) -> Result<usize, ModelError> {
        match self.opt_usize(field)? {
            Some(0) => Err(self.err(field, "must be positive")),
            Some(v) => Ok(v),
            None => Err(self.err(field, "missing")),
        }
    }

    /// An optional non-negative integer.
    pub(crate) fn opt_usize(&self, field: &str) -> Result<Option<usize>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => self.bounded(field, v).map(Some),
        }
    }

    /// `v` as an integer in `0..=MAX_CONFIG_INT`.
    fn bounded(&self, field: &str, v: &Value) -> Result<usize, ModelError> {
        match v.as_u64() {
            Some(u) if u <= MAX_CONFIG_INT => Ok(u as usize),
            Some(u) => Err(self.err(field, format!("{u} is too large (at most {MAX_CONFIG_INT})"))),
            None => Err(self.err(field, format!("expected a non-negative integer, found {v}"))),
        }
    }

    /// `num_hidden_layers`, in `1..=MAX_LAYERS`.
    pub fn num_layers(&self) -> Result<usize, ModelError> {
        let n = self.usize("num_hidden_layers")?;
        if n > MAX_LAYERS {
            return Err(self.err("num_hidden_layers", format!("{n} is too large (at most {MAX_LAYERS})")));
        }
        Ok(n)
    }

    /// An optional number.
    pub(crate) fn opt_f64(&self, field: &str) -> Result<Option<f64>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a number, found {v}"))),
        }
    }

    /// An optional boolean.
    pub(crate) fn opt_bool(&self, field: &str) -> Result<Option<bool>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected true or false, found {v}"))),
        }
    }

    /// An optional string.
    pub fn opt_str(&self, field: &str) -> Result<Option<&str>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a string, found {v}"))),
        }
    }

    /// An optional list of non-negative integers.
    pub(crate) fn opt_usize_list(&self, field: &str) -> Result<Vec<usize>, ModelError> {
        match self.get(field) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items.iter().map(|v| self.bounded(field, v)).collect(),
            Some(v) => Err(self.err(field, format!("expected a list, found {v}"))),
        }
    }

    /// The raw value of a field (for nested objects like `rope_scaling`).
    pub fn raw(&self, field: &str) -> Option<&Value> {
        self.get(field)
    }

    /// `hidden_act` must be SiLU for the SwiGLU blocks larder implements.
    pub(crate) fn require_silu(&self) -> Result<(), ModelError> {
        let act = self.opt_str("hidden_act")?.unwrap_or("silu");
        if act != "silu" && act != "swish" {
            return Err(self.err("hidden_act", format!("{act:?} is not supported (only silu)")));
        }
        Ok(())
    }

    /// The attention geometry shared by every architecture:
    /// `(hidden, heads, kv_heads, head_dim)`, validated.
    pub(crate) fn attention_dims(&self) -> Result<(usize, usize, usize, usize), ModelError> {
        let hidden = self.usize("hidden_size")?;
        let heads = self.usize("num_attention_heads")?;
        let kv_heads = self.opt_usize("num_key_value_heads")?.unwrap_or(heads);
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(self.err(
                "num_key_value_heads",
                format!("{kv_heads} must be positive and divide num_attention_heads ({heads})"),
            ));
        }
        let head_dim = match self.opt_usize("head_dim")? {
            Some(d) => d,
            None => {
                if hidden % heads != 0 {
                    return Err(self.err(
                        "num_attention_heads",
                        format!("{heads} does not divide hidden_size ({hidden}) and head_dim is not given"),
                    ));
                }
                hidden / heads
            }
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(self.err("head_dim", format!("{head_dim} must be positive and even (RoPE rotates pairs)")));
        }
        Ok((hidden, heads, kv_heads, head_dim))
    }

    /// MLA's `num_key_value_heads`: absent or equal to `heads`
    /// (`num_attention_heads`), since every head has its own key and value.
    pub(crate) fn equal_heads(&self, heads: usize) -> Result<(), ModelError> {
        let kv_heads = self.opt_usize("num_key_value_heads")?.unwrap_or(heads);
        if kv_heads != heads {
            return Err(self.err(
                "num_key_value_heads",
                format!("{kv_heads} must equal num_attention_heads ({heads}): MLA has one key and value per head"),
            ));
        }
        Ok(())
    }

    /// A field transformers derives from others (`qk_head_dim`): accepted
    /// only with the value `want` it derives (`from` says how).
    pub fn derived(&self, name: &str, want: usize, from: &str) -> Result<(), ModelError> {
        match self.opt_usize(name)? {
            Some(v) if v != want => Err(self.err(name, format!("{v} is not supported (must equal {from}, {want})"))),
            _ => Ok(()),
        }
    }

    /// `rms_norm_eps` (default 1e-6), validated.
    pub fn rms_norm_eps(&self) -> Result<f32, ModelError> {
        let eps = self.opt_f64("rms_norm_eps")?.unwrap_or(1e-6);
        if !(eps > 0.0 && eps < 1.0) {
            return Err(self.err("rms_norm_eps", format!("{eps} out of range (0, 1)")));
        }
        Ok(eps as f32)
    }
}

/// The MoE top-k settings every softmax-routed architecture shares, validated.
pub(crate) fn check_top_k(cfg: &ConfigJson, num_experts: usize, top_k: usize) -> Result<(), ModelError> {
    if top_k == 0 || top_k > num_experts {
        return Err(cfg.err(
            "num_experts_per_tok",
            format!("{top_k} must be between 1 and the number of experts ({num_experts})"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use serde_json::Value;

    /// The tiny Qwen3-MoE fixture's config with `field` set to `value`, in a fresh folder.
    fn patched(name: &str, field: &str, value: Value) -> PathBuf {
        let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen3_moe_tiny/config.json");
        let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
        cfg[field] = value;
        let dir = std::env::temp_dir().join(format!("larder-config-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
        dir
    }

    #[test]
    fn absurd_sizes_are_errors_not_aborts() {
        // Found by fuzz/ (config target): 2^62 layers was a capacity-overflow panic.
        for (field, value) in [
            ("num_hidden_layers", 1u64 << 62),
            ("num_hidden_layers", 5000),
            ("hidden_size", 1 << 40),
            ("num_experts", u64::MAX),
        ] {
            let dir = patched(field, field, value.into());
            let err = crate::arch::read_spec(&dir).unwrap_err().to_string();
            assert!(err.contains(field) && err.contains("too large"), "{field}={value}: {err}");
            std::fs::remove_dir_all(dir).unwrap();
        }
        let dir = patched("ok", "num_hidden_layers", 3.into());
        assert_eq!(crate::arch::read_spec(&dir).unwrap().layers.len(), 3);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
