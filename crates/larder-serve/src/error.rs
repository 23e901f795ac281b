//! The error a request is answered with ([`ApiError`]: status, message,
//! OpenAI's `type`, `param` and `code`, and the full detail for the server
//! log), below every module that refuses a request.

use serde_json::{json, Value};

/// An error answered to the client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// The full error, for the server log only (it may name server paths).
    pub detail: Option<String>,
    /// Seconds to send as `Retry-After` with a 429 or 503 (default 1).
    pub retry_after_s: Option<u32>,
}

impl ApiError {
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: None,
            detail: None,
            retry_after_s: None,
        }
    }

    /// A 500 for a server-side failure while `doing` something: the client
    /// gets no paths or internals; [`log`](Self::log) records `error` in full.
    pub fn internal(doing: &str, error: &dyn std::error::Error) -> Self {
        let mut detail = error.to_string();
        let mut source = error.source();
        while let Some(s) = source {
            let text = s.to_string();
            if !detail.contains(&text) {
                detail.push_str(&format!(": {text}"));
            }
            source = s.source();
        }
        ApiError {
            detail: Some(format!("{doing}: {detail}")),
            ..ApiError::plain(
                500,
                "server_error",
                None,
                format!("internal error while {doing}; the server log has the details"),
            )
        }
    }

    /// The error of a request that failed while generating: a 503 with
    /// `Retry-After` when it needs an expert a lazy cache cannot fetch now
    /// (its source is down; requests needing only cached experts are still
    /// served), a 500 otherwise.
    pub fn generating(error: &larder_engine::EngineError) -> Self {
        let Some(wait) = error.retry_after_s() else {
            return ApiError::internal("generating", error);
        };
        ApiError {
            detail: Some(format!("generating: {error}")),
            retry_after_s: Some(u32::try_from(wait).unwrap_or(u32::MAX)),
            ..ApiError::plain(
                503,
                "server_error",
                Some("source_unavailable"),
                format!(
                    "an expert this request needs is not cached and the model's source cannot be reached now; \
                     requests that need only cached experts are still served: retry after {wait} s"
                ),
            )
        }
    }

    /// Logs a server-side (5xx) error with its full detail.
    pub fn log(&self) {
        if self.status >= 500 {
            let detail = self.detail.as_deref().unwrap_or(&self.message);
            tracing::error!(status = self.status, "{detail}");
        }
    }

    pub fn plain(status: u16, kind: &'static str, code: Option<&'static str>, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code,
            detail: None,
            retry_after_s: None,
        }
    }

    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}
