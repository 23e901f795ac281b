//! Engine errors, each naming the file or parameter at fault.
//!
//! Messages are whole on their own (`{}` prints the I/O error too: the server
//! and logs print errors that way), while `source()` still hands out the
//! wrapped error; printers of the chain (the CLI's, the server's 500s) skip a
//! cause whose text the message already holds, so nothing is said twice.

use std::path::PathBuf;

use larder_model::ModelError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A remote checkpoint source failed (names URL, status and file).
    #[cfg(feature = "remote")]
    #[error(transparent)]
    Remote(#[from] larder_store::remote::RemoteError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("{dir}: no tokenizer (tokenizer.json, or tiktoken.model with tokenizer_config.json), so text prompts cannot be tokenized (pass --ids instead)")]
    NoTokenizer { dir: PathBuf },
    #[error(
        "{dir}: tokenizer_config.json has no chat_template (and the checkpoint is not in Kimi K3's form, whose chat \
         larder builds itself), so --chat cannot be used"
    )]
    NoChatTemplate { dir: PathBuf },
    #[error("chat template: {0}")]
    Template(String),
    /// The checkpoint's chat template could not be read or compiled at load
    /// (the message names the file); only chats need it.
    #[error("{0}")]
    ChatTemplate(String),
    #[error("draft model {dir}: {message}")]
    Draft { dir: PathBuf, message: String },
    #[error("invalid {field}: {message}")]
    Invalid { field: &'static str, message: String },
    /// A request whose worst case (prompt plus `max_new` positions of
    /// sequence state) cannot fit in the KV budget even alone; refused before
    /// anything is generated. `needed` and `budget` are bytes.
    #[error(
        "invalid max_tokens: the prompt's {prompt_tokens} tokens plus max_tokens {max_new} need up to {} of sequence \
         state, over the KV budget of {}; lower max_tokens, shorten the prompt or raise --kv-budget",
        larder_store::format_size(*needed as u64),
        larder_store::format_size(*budget as u64)
    )]
    KvBudget {
        needed: usize,
        budget: usize,
        prompt_tokens: usize,
        max_new: usize,
    },
    /// The request's [`TokenConstraint`](crate::TokenConstraint) cannot go
    /// on (it failed, or allows no token); the request fails with it.
    #[error("constraint: {0}")]
    Constraint(#[from] crate::constraint::ConstraintError),
    /// An [`EngineHandle`](crate::EngineHandle)'s engine thread is not
    /// running: it stopped, could not start, or panicked (the message says).
    #[error("the engine thread {0}")]
    EngineThread(String),
}

/// A store error as an engine error (kept whole: the server and
/// [`EngineError::retry_after_s`] look inside it).
pub(crate) fn store_err(e: larder_store::StoreError) -> EngineError {
    EngineError::Model(ModelError::Provider(Box::new(e)))
}

impl EngineError {
    /// When a lazy store's source cannot be reached now, the seconds until
    /// it is asked again (a server answers 503 with `Retry-After`); `None`
    /// for every other error.
    pub fn retry_after_s(&self) -> Option<u64> {
        let EngineError::Model(ModelError::Provider(e)) = self else {
            return None;
        };
        match e.downcast_ref::<larder_store::StoreError>() {
            Some(larder_store::StoreError::SourceUnavailable { retry_after_s, .. }) => Some(*retry_after_s),
            _ => None,
        }
    }
}
