//! [`RemoteError`]: every way reading a remote or local checkpoint source
//! fails, each naming the source argument, URL or file, the HTTP status
//! where there is one, and what to do.

use std::path::PathBuf;

/// Why a checkpoint source could not be parsed, listed or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    #[error("checkpoint source `{arg}`: {reason}")]
    BadSource { arg: String, reason: String },

    #[error("HTTP {status} from {url}: {hint}")]
    Unauthorized { url: String, status: u16, hint: String },

    #[error("HTTP 404 from {url}: {what} not found (check the repo id, revision and file name)")]
    NotFound { url: String, what: String },

    #[error("HTTP 416 from {url}: range {range} not satisfiable (the file is shorter than its index says)")]
    RangeNotSatisfiable { url: String, range: String },

    #[error("HTTP {status} from {url}: unexpected status")]
    Status { url: String, status: u16 },

    #[error("{url}: {reason}")]
    Transport { url: String, reason: String },

    #[error("{url}: gave up after {attempts} attempts; last failure: {last}")]
    GaveUp { url: String, attempts: u32, last: String },

    #[error(
        "{url}: file `{file}` changed on the server while being read (ETag {pinned} became {got}); \
         start again from a fixed revision"
    )]
    FileChanged {
        url: String,
        file: String,
        pinned: String,
        got: String,
    },

    #[error("{url}: server ignored the Range request (HTTP 200 with the whole file); it must support byte ranges")]
    RangeIgnored { url: String },

    #[error("{url}: bad response for range {range}: {reason}")]
    BadRange { url: String, range: String, reason: String },

    #[error("{url}: file `{file}` has sha256 {got}, the source says {expected}; its bytes are not the published ones")]
    Sha256Mismatch {
        url: String,
        file: String,
        expected: String,
        got: String,
    },

    #[error("{url}: the source disagrees with its file listing for `{file}`: {reason}")]
    ListingMismatch { url: String, file: String, reason: String },

    #[error("{url}: bad file listing: {reason}")]
    BadListing { url: String, reason: String },

    #[error("{}: {source}", path.display())]
    Local {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("writing `{file}` failed after {offset} bytes: {source}")]
    Sink {
        file: String,
        offset: u64,
        #[source]
        source: std::io::Error,
    },
}

impl RemoteError {
    /// Whether the source could not be reached or kept failing (connect
    /// errors, timeouts, resets, 5xx after every retry): it may answer
    /// later, unlike a refusal, a missing file or bad bytes.
    pub(crate) fn is_unreachable(&self) -> bool {
        matches!(self, RemoteError::Transport { .. } | RemoteError::GaveUp { .. })
    }

    /// As a store error: [`StoreError::SourceUnavailable`](crate::StoreError)
    /// when the source is unreachable (the caller sets the retry time),
    /// otherwise an error with this one's message.
    pub(crate) fn into_store(self) -> crate::StoreError {
        if self.is_unreachable() {
            crate::StoreError::SourceUnavailable {
                message: self.to_string(),
                retry_after_s: 0,
            }
        } else {
            crate::StoreError::Invalid(self.to_string())
        }
    }
}

/// Hint for a 401/403: hub repos that do not exist or are private answer
/// 401 to anonymous requests, gated ones name themselves.
pub(crate) fn auth_hint(error_code: Option<&str>, token_sent: bool) -> String {
    let token = if token_sent {
        "the token in HF_TOKEN was refused (wrong, expired or without access to this repo): set HF_TOKEN to a token with read access"
    } else {
        "token missing or wrong: set HF_TOKEN to a token with read access (or check that the repo exists)"
    };
    match error_code {
        Some("GatedRepo") => format!("gated repo: accept its terms on the hub; {token}"),
        Some("RepoNotFound") => format!("repository not found or private; {token}"),
        _ => token.to_string(),
    }
}

/// What a 404 is about, from the hub's `X-Error-Code` header.
pub(crate) fn not_found_what(error_code: Option<&str>) -> &'static str {
    match error_code {
        Some("RepoNotFound") => "repository",
        Some("RevisionNotFound") => "revision",
        Some("EntryNotFound") => "file",
        _ => "file, revision or repository",
    }
}
