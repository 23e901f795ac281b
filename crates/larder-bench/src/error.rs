//! The bench harness's error type: each variant names the option, manifest
//! key, file or step at fault.
//!
//! As in the inference crates, messages are whole on their own (`{}` prints
//! the wrapped error too) while `source()` still hands out the wrapped error;
//! the CLI's printer skips a cause whose text the message already holds.

/// An error a caller's model loader returns (the CLI's, with its own context).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// An option or manifest value that cannot be used; the message names it and the fix.
    #[error("{0}")]
    Invalid(String),
    /// A file or folder the bench reads or writes.
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
        source: Box<BenchError>,
    },
    /// A measurement or run that went wrong (a child process, a client, a chart).
    #[error("{0}")]
    Failed(String),
    /// The caller's model loader failed (its message and causes, unchanged).
    #[error(transparent)]
    Load(BoxError),
    #[error(transparent)]
    Store(#[from] larder_store::StoreError),
    #[error(transparent)]
    Remote(#[from] larder_store::remote::RemoteError),
    #[error(transparent)]
    Engine(#[from] larder_engine::EngineError),
    #[error(transparent)]
    Model(#[from] larder_model::ModelError),
    #[error(transparent)]
    Output(#[from] larder_engine::OutputError),
    #[error(transparent)]
    Trace(#[from] larder_router::TraceError),
    #[error(transparent)]
    Serve(#[from] larder_serve::ServeError),
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
}

impl BenchError {
    /// An I/O error while doing `what` (which names the file or folder).
    pub fn io(what: impl Into<String>, source: std::io::Error) -> BenchError {
        BenchError::Io { what: what.into(), source }
    }

    /// This error as the cause of `what` (a step that names its subject).
    pub fn during(self, what: impl Into<String>) -> BenchError {
        BenchError::Step {
            what: what.into(),
            source: Box::new(self),
        }
    }
}

/// `Result` with [`BenchError`].
pub type Result<T, E = BenchError> = std::result::Result<T, E>;
