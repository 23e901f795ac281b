//! The tools' error type: each variant names the option, file or step at
//! fault. As in the inference crates, messages are whole on their own (`{}`
//! prints the wrapped error too) while `source()` still hands it out.

use crate::smollm2::ConvertError;

#[derive(Debug, thiserror::Error)]
pub enum ToolsError {
    /// An option value that cannot be used; the message names it and the fix.
    #[error("{0}")]
    Invalid(String),
    /// A file or folder the tool reads or writes.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A step that failed, and what it was doing (the cause's text included).
    #[error("{what}: {source}")]
    Step {
        what: String,
        #[source]
        source: Box<ToolsError>,
    },
    /// The demo's fallback fixture could not be written anywhere.
    #[error("{reason}; and the built-in fixture could not be written to {dir} ({source}) to fall back to")]
    Fixture {
        reason: String,
        dir: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Convert(#[from] ConvertError),
    #[error(transparent)]
    Model(#[from] larder_model::ModelError),
    #[error(transparent)]
    Store(#[from] larder_store::StoreError),
    #[error(transparent)]
    Engine(#[from] larder_engine::EngineError),
    #[error(transparent)]
    Bench(#[from] larder_bench::BenchError),
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
}

impl ToolsError {
    /// An I/O error while doing `what` (which names the file or folder).
    pub fn io(what: impl Into<String>, source: std::io::Error) -> ToolsError {
        ToolsError::Io { what: what.into(), source }
    }

    /// This error as the cause of `what` (a step that names its subject).
    pub fn during(self, what: impl Into<String>) -> ToolsError {
        ToolsError::Step {
            what: what.into(),
            source: Box::new(self),
        }
    }
}

/// `Result` with [`ToolsError`].
pub type Result<T, E = ToolsError> = std::result::Result<T, E>;
