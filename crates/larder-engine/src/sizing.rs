//! A model's shape and byte sizes, as every command that sizes a model
//! (`doctor`, `plan`, `--ram-budget auto`, the memory check, `trace`) reads
//! them: exact from a checkpoint's safetensors headers or a store's
//! manifest; when config.json is all there is, estimated from the tensors
//! the architecture's loader reads, at config.json's dtype
//! ([`crate::tensor_sizes`]) ([`inspect`]). A remote checkpoint (a hub repo)
//! is sized exactly from its config.json and its shards' headers, read by
//! range without a byte of weights ([`inspect_remote`]).

use std::path::{Path, PathBuf};

use larder_model::checkpoint::Checkpoint;
use larder_model::config::MixerSpec;
use larder_model::{MlaCache, ModelSpec};
use larder_store::Manifest;
use serde_json::{json, Value};

use crate::error::EngineError;
use crate::plan::ModelSizes;
use crate::tensor_sizes::{config_float_dtype, estimate_sizes};

/// What a model path named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Kind {
    Checkpoint,
    Store,
    /// A config.json alone (or a folder with no weights): sizes estimated.
    Config,
    /// A remote checkpoint known by its config.json and shard headers.
    Remote,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Checkpoint => "checkpoint",
            Kind::Store => "store",
            Kind::Config => "config",
            Kind::Remote => "remote",
        }
    }
}

/// A model's shape and sizes.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ModelReport {
    pub path: PathBuf,
    pub kind: Kind,
    pub model_type: String,
    pub sizes: ModelSizes,
    /// KV-cache bytes per token of context, MLA layers compact (the default)
    /// and expanded (equal when the model has no MLA layers).
    pub kv_bytes_per_token: usize,
    pub kv_bytes_per_token_expanded: usize,
    /// Bytes of one sequence's recurrent (KDA) state, whatever its length
    /// ([`recurrent_state_bytes`]; 0 without recurrent layers).
    pub recurrent_state_bytes: u64,
    /// Bytes the checkpoint holds that the text model never reads (a
    /// wrapper's vision tower), counted in neither the spine nor the experts.
    pub skipped_bytes: u64,
    /// The folder holding it (the drive its experts are read from; a remote
    /// model's staging folder, gone once it is sized).
    pub folder: PathBuf,
    /// Its spec, as read from its config.json.
    pub spec: ModelSpec,
}

/// Reads the model at `path` (a checkpoint folder, a packed store or a
/// config.json); errors name the path and say what a model is.
pub fn inspect(path: &Path) -> Result<ModelReport, EngineError> {
    let not_model = "a checkpoint folder, a packed store, or a config.json file";
    let bad = |message: String| EngineError::File {
        path: path.to_path_buf(),
        message,
    };
    let meta = std::fs::metadata(path).map_err(|e| bad(format!("cannot read it ({e}); name {not_model}")))?;
    let (dir, only_config) = if meta.is_file() {
        if path.file_name().is_none_or(|n| n != "config.json") {
            return Err(bad(format!(
                "not a model; name {not_model} (a config file must be named config.json)"
            )));
        }
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        (dir.to_path_buf(), true)
    } else {
        if !path.join("config.json").is_file() {
            return Err(bad(format!("not a model: it has no config.json; name {not_model}")));
        }
        (path.to_path_buf(), !has_weights(path))
    };
    let spec = larder_model::arch::read_spec(&dir)?;
    let (kind, sizes) = if only_config {
        (Kind::Config, estimate_sizes(&spec, float_dtype(&dir)?)?)
    } else if Manifest::is_store(&dir) {
        (Kind::Store, store_sizes(&dir, &spec)?)
    } else {
        (Kind::Checkpoint, checkpoint_sizes(&dir, &spec)?)
    };
    Ok(ModelReport {
        path: path.to_path_buf(),
        kind,
        model_type: spec.model_type.clone(),
        sizes,
        kv_bytes_per_token: spec.kv_bytes_per_token(MlaCache::Compact),
        kv_bytes_per_token_expanded: spec.kv_bytes_per_token(MlaCache::Expanded),
        recurrent_state_bytes: recurrent_state_bytes(&spec),
        skipped_bytes: match kind {
            Kind::Checkpoint => Checkpoint::open(&dir)?.skipped().iter().map(|t| t.bytes).sum(),
            _ => 0,
        },
        folder: dir,
        spec,
    })
}

/// Sizes a remote checkpoint exactly from its config.json and its shards'
/// headers (fetched into `staging`, by range; checked as a load checks
/// them); `label` names it (the hub id).
#[cfg(feature = "remote")]
pub fn inspect_remote(remote: &dyn larder_store::remote::FileSource, staging: &Path, label: &str) -> Result<ModelReport, EngineError> {
    let described = crate::pull::describe_remote(remote, staging)?;
    let spec = larder_model::arch::read_spec(staging)?;
    Ok(ModelReport {
        path: PathBuf::from(label),
        kind: Kind::Remote,
        model_type: spec.model_type.clone(),
        sizes: header_sizes(&described.checkpoint, &spec)?,
        kv_bytes_per_token: spec.kv_bytes_per_token(MlaCache::Compact),
        kv_bytes_per_token_expanded: spec.kv_bytes_per_token(MlaCache::Expanded),
        recurrent_state_bytes: recurrent_state_bytes(&spec),
        skipped_bytes: described.skipped_bytes(),
        folder: staging.to_path_buf(),
        spec,
    })
}

/// Bytes of one sequence's committed recurrent state: per KDA layer the
/// `H × D × D` f32 state and the `(K − 1) × 3HD` f32 convolution window (a
/// running pass holds a second copy until it commits).
pub fn recurrent_state_bytes(spec: &ModelSpec) -> u64 {
    spec.layers
        .iter()
        .map(|l| match &l.mixer {
            MixerSpec::Kda(k) => {
                let hd = (k.num_heads * k.head_dim) as u64;
                4 * (hd * k.head_dim as u64 + (k.conv_kernel.saturating_sub(1) as u64) * 3 * hd)
            }
            _ => 0,
        })
        .sum()
}

/// Where the routed experts of the model at `dir` are: a packed store's
/// index (checked as a load checks it), or a checkpoint's own tensors.
pub fn expert_index(dir: &Path) -> Result<larder_store::ExpertIndex, EngineError> {
    if Manifest::is_store(dir) {
        return Ok(crate::integrity::packed_index(dir)?.1);
    }
    let spec = larder_model::arch::read_spec(dir)?;
    let ckpt = Checkpoint::open(dir)?;
    crate::experts::direct_index(&spec, &ckpt)
}

/// Whether `dir` holds weights: a store manifest or safetensors files.
fn has_weights(dir: &Path) -> bool {
    if Manifest::is_store(dir) {
        return true;
    }
    std::fs::read_dir(dir).is_ok_and(|entries| entries.flatten().any(|e| e.path().extension().is_some_and(|x| x == "safetensors")))
}

/// Exact sizes from a checkpoint's safetensors headers: the spine is every
/// tensor that is not a routed expert (what `larder pack` puts in a store's spine).
fn checkpoint_sizes(dir: &Path, spec: &ModelSpec) -> Result<ModelSizes, EngineError> {
    header_sizes(&Checkpoint::open(dir)?, spec)
}

/// Exact sizes from a checkpoint's headers (the text model's tensors only).
fn header_sizes(ckpt: &Checkpoint, spec: &ModelSpec) -> Result<ModelSizes, EngineError> {
    let index = crate::experts::direct_index(spec, ckpt)?;
    let mut total = 0u64;
    for name in ckpt.names() {
        total = total.saturating_add(ckpt.tensor_info(name)?.len);
    }
    let bank = index.total_bytes();
    Ok(ModelSizes::exact(spec, total.saturating_sub(bank), bank))
}

/// Exact sizes from a packed store's manifest (checked as a load checks it).
fn store_sizes(dir: &Path, spec: &ModelSpec) -> Result<ModelSizes, EngineError> {
    let (manifest, index) = crate::integrity::packed_index(dir)?;
    let spine = manifest.spine.iter().flat_map(|f| &f.tensors).map(|t| t.len).sum();
    Ok(ModelSizes::exact(spec, spine, index.total_bytes()))
}

/// The safetensors dtype of the float tensors config.json declares
/// (`torch_dtype` or `dtype`); fp8 and 4-bit weights (compressed-tensors,
/// gpt-oss MXFP4) are the spec's, which the recorded load follows.
fn float_dtype(dir: &Path) -> Result<&'static str, EngineError> {
    let cfg = larder_model::config::ConfigJson::read(dir)?;
    let dtype = match cfg.opt_str("torch_dtype")? {
        Some(d) => Some(d),
        None => cfg.opt_str("dtype")?,
    };
    config_float_dtype(dtype).map_err(|e| EngineError::File {
        path: cfg.path.clone(),
        message: e.to_string(),
    })
}

impl ModelReport {
    /// The `model` object of `--json`.
    pub fn to_json(&self) -> Value {
        let s = &self.sizes;
        json!({
            "path": self.path,
            "kind": self.kind.name(),
            "model_type": self.model_type,
            "layers": s.layers,
            "moe_layers": s.moe_layers,
            "experts_per_layer": s.experts_per_layer,
            "top_k": s.top_k,
            "sizes": if s.exact { "exact" } else { "estimated" },
            "spine_bytes": s.spine_bytes,
            "expert_bytes": s.expert_bytes,
            "expert_bank_bytes": s.bank_bytes,
            "expert_bytes_per_token": s.expert_bytes_per_token(),
            "active_bytes_per_token": s.active_bytes_per_token(),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_bytes_per_token_expanded": self.kv_bytes_per_token_expanded,
            "recurrent_state_bytes": self.recurrent_state_bytes,
            "skipped_bytes": self.skipped_bytes,
        })
    }
}
