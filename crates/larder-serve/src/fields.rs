//! Reading a request body's scalar fields, as every endpoint checks them
//! (chat completions and completions in [`crate::api`], the agent APIs in
//! [`crate::agent`]): a missing or `null` field is absent, a wrong type or a
//! value out of range is a 400 naming the field.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// A number field within `lo..=hi` (`None` when absent or null).
pub fn opt_number(obj: &Map<String, Value>, k: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
    match obj.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite() && (lo..=hi).contains(x))
            .map(|x| Some(x as f32))
            .ok_or_else(|| ApiError::invalid(k, format!("{k} must be a number between {lo} and {hi}"))),
    }
}

/// `v` as a positive integer (at most `u32::MAX`) for field `param`.
pub fn positive(v: &Value, param: &str) -> Result<usize, ApiError> {
    v.as_u64()
        .filter(|&n| n >= 1 && n <= u32::MAX as u64)
        .map(|n| n as usize)
        .ok_or_else(|| ApiError::invalid(param, format!("{param} must be a positive integer")))
}

/// A positive integer field (`None` when absent or null).
pub fn opt_positive(obj: &Map<String, Value>, k: &str) -> Result<Option<usize>, ApiError> {
    match obj.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => positive(v, k).map(Some),
    }
}

/// A boolean field (`false` when absent or null).
pub fn opt_flag(obj: &Map<String, Value>, k: &str) -> Result<bool, ApiError> {
    match obj.get(k) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::invalid(k, format!("{k} must be a boolean"))),
    }
}

/// `top_p`: in (0, 1] (`None` when absent or null).
pub fn top_p(obj: &Map<String, Value>) -> Result<Option<f32>, ApiError> {
    let top_p = opt_number(obj, "top_p", 0.0, 1.0)?;
    if top_p.is_some_and(|p| p <= 0.0) {
        return Err(ApiError::invalid("top_p", "top_p must be greater than 0"));
    }
    Ok(top_p)
}

/// `top_k`: a non-negative integer (`None` when absent or null).
pub fn top_k(obj: &Map<String, Value>) -> Result<Option<usize>, ApiError> {
    match obj.get("top_k") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => Ok(Some(
            v.as_u64()
                .filter(|&k| k <= u32::MAX as u64)
                .ok_or_else(|| ApiError::invalid("top_k", "top_k must be a non-negative integer"))? as usize,
        )),
    }
}
