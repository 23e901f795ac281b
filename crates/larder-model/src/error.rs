//! Errors of model loading and forward passes. Every variant names the file,
//! field or tensor at fault.
//!
//! Messages are whole on their own (`{}` prints the I/O error too: the server
//! and logs print errors that way), while `source()` still hands out the
//! wrapped error; printers of the chain (the CLI's, the server's 500s) skip a
//! cause whose text the message already holds, so nothing is said twice.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not valid JSON: {message}")]
    Json { path: PathBuf, message: String },
    #[error("{path}: field `{field}`: {message}")]
    Config { path: PathBuf, field: String, message: String },
    #[error("{path}: unsupported architecture {model_type:?} (supported: {supported})")]
    UnknownArch {
        path: PathBuf,
        model_type: String,
        supported: String,
    },
    #[error("{path}: {message}")]
    Safetensors { path: PathBuf, message: String },
    #[error("tensor `{name}` not found in the checkpoint's safetensors files")]
    MissingTensor { name: String },
    #[error("tensor `{name}` in {path}: shape {got:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        path: PathBuf,
        got: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("tensor `{name}` in {path}: dtype {dtype} is not supported here (supported: F32, F16, BF16)")]
    TensorDType { name: String, path: PathBuf, dtype: String },
    #[error("token id {id} is out of the vocabulary (size {vocab})")]
    TokenOutOfVocab { id: u32, vocab: usize },
    #[error("empty input: at least one token id is needed")]
    EmptyInput,
    #[error("sequence of {len} positions exceeds the model's max_position_embeddings ({max})")]
    ContextOverflow { len: usize, max: usize },
    /// A [`crate::SequenceState`] asked to do what it cannot (roll forward,
    /// restore a dropped point, or run on a model other than its own).
    #[error("sequence state: {0}")]
    State(String),
    /// The error of one sequence of a batched forward (`index` in the batch).
    #[error("sequence {index} of the batch: {source}")]
    Sequence {
        index: usize,
        #[source]
        source: Box<ModelError>,
    },
    #[error("expert provider: {0}")]
    Experts(String),
    /// A [`crate::source::WeightSource`] that could not answer, or answered
    /// a request with the wrong kind of weight.
    #[error("weight source: {0}")]
    Source(String),
    #[error(transparent)]
    Weight(#[from] larder_tensor::WeightError),
    /// A streaming provider's own error (I/O, digest, ...), kept whole.
    #[error(transparent)]
    Provider(Box<dyn std::error::Error + Send + Sync>),
    #[error(
        "non-finite values (NaN or infinity) first appear in the output of {stage}, at position {position}: \
         its weights or its input are at fault (a corrupt or wrongly converted checkpoint, or values overflowing f32); \
         generation stopped. Check the checkpoint's tensors (`larder verify` for a packed store)"
    )]
    NonFinite { stage: Stage, position: usize },
}

/// A step of the forward pass, as [`ModelError::NonFinite`] names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Embeddings,
    /// Decoder layer `n` (its attention, feed-forward or experts).
    Layer(usize),
    FinalNorm,
    LmHead,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stage::Embeddings => f.write_str("the embeddings (model.embed_tokens)"),
            Stage::Layer(l) => write!(f, "layer {l} (model.layers.{l})"),
            Stage::FinalNorm => f.write_str("the final norm (model.norm)"),
            Stage::LmHead => f.write_str("the LM head (lm_head)"),
        }
    }
}

impl ModelError {
    pub(crate) fn config(path: &std::path::Path, field: &str, message: impl Into<String>) -> Self {
        ModelError::Config {
            path: path.to_path_buf(),
            field: field.to_string(),
            message: message.into(),
        }
    }

    /// This error with its config field named under `prefix` (a nested
    /// config's errors: Kimi K3's `text_config.`).
    pub(crate) fn scoped(self, prefix: &str) -> ModelError {
        match self {
            ModelError::Config { path, field, message } if !prefix.is_empty() && !field.starts_with(prefix) => ModelError::Config {
                path,
                field: format!("{prefix}{field}"),
                message,
            },
            e => e,
        }
    }

    /// This error naming its tensor as a wrapped checkpoint ships it
    /// (`language_model.model.*`, `language_model.lm_head.*`).
    pub(crate) fn named_as_wrapped(self) -> ModelError {
        let shipped = |name: String| match name.starts_with("model.") || name.starts_with("lm_head.") {
            true => format!("language_model.{name}"),
            false => name,
        };
        match self {
            ModelError::MissingTensor { name } => ModelError::MissingTensor { name: shipped(name) },
            ModelError::TensorShape { name, path, got, expected } => ModelError::TensorShape {
                name: shipped(name),
                path,
                got,
                expected,
            },
            ModelError::TensorDType { name, path, dtype } => ModelError::TensorDType {
                name: shipped(name),
                path,
                dtype,
            },
            e => e,
        }
    }
}

impl From<larder_tensor::safetensors_write::SafetensorsWriteError> for ModelError {
    fn from(e: larder_tensor::safetensors_write::SafetensorsWriteError) -> Self {
        use larder_tensor::safetensors_write::SafetensorsWriteError as W;
        match e {
            W::Io { path, source } => ModelError::Io { path, source },
            W::Data { path, name, message } => ModelError::Safetensors {
                path,
                message: format!("tensor `{name}`: {message}"),
            },
            W::Header(message) => ModelError::Experts(format!("safetensors header: {message}")),
        }
    }
}
