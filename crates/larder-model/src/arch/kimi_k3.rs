//! The K3 gate extensions of a `kimi_linear` config.json that larder
//! implements, read under the names of the public reference models that
//! define them (docs/kimi_linear.md, "K3 extensions"):
//!
//! - the lower-bounded KDA forget gate `g = bound · sigmoid(exp(A_log) · u)`:
//!   `linear_attn_config.gate_lower_bound` (transformers 5.24.0 glm5_next;
//!   top-level `linear_lower_bound` is the attribute it derives from it),
//!   `linear_attn_config.lower_bound` (fla's `KimiDeltaAttention`, whose
//!   `safe_gate` only lets a kernel assume the bound and requires one), and
//!   `kda_safe_gate` / `kda_lower_bound` (bailing_hybrid: safe gate on by
//!   default, bound −5.0 by default). Every spelling present must agree;
//! - the MLA head-wise output gate: `mla_use_output_gate` (tensor
//!   `self_attn.g_proj.weight` `[heads, hidden]`, bailing_hybrid's MLA);
//! - the full-rank KDA output gate: `linear_attn_config.use_full_rank_gate`
//!   (tensor `self_attn.g_proj.weight` `[H·D, hidden]` in place of
//!   `g_a_proj` / `g_b_proj`, bailing_hybrid's KDA).
//!
//! The two output gates are switched by the config, and the loaders refuse a
//! checkpoint whose `g_proj` tensors disagree with the switch, so a weight is
//! never silently ignored.

use serde_json::Value;

use crate::config::ConfigJson;
use crate::error::ModelError;
use crate::spec::KdaOutputGate;

/// bailing_hybrid's default `kda_lower_bound`.
const BAILING_DEFAULT_BOUND: f64 = -5.0;

/// The forget gate's lower bound from every spelling config.json uses
/// (module doc); `None`: Kimi Linear's unbounded softplus gate.
pub(super) fn gate_lower_bound(cfg: &ConfigJson) -> Result<Option<f32>, ModelError> {
    let mut found: Vec<(String, Option<f64>)> = Vec::new();
    for (field, nested) in [
        ("linear_attn_config.gate_lower_bound", true),
        ("linear_attn_config.lower_bound", true),
        ("linear_lower_bound", false),
    ] {
        let value = if nested { linear_value(cfg, field) } else { cfg.raw(field) };
        if let Some(v) = value {
            found.push((field.to_string(), number_or_null(cfg, field, v)?));
        }
    }
    let safe_gate = cfg.opt_bool("kda_safe_gate")?;
    let bailing_bound = cfg.opt_f64("kda_lower_bound")?;
    if safe_gate.is_some() || bailing_bound.is_some() {
        let field = if safe_gate.is_some() { "kda_safe_gate" } else { "kda_lower_bound" };
        let bound = safe_gate.unwrap_or(true).then(|| bailing_bound.unwrap_or(BAILING_DEFAULT_BOUND));
        found.push((field.to_string(), bound));
    }
    if let Some((first, bound)) = found.first() {
        if let Some((other, b)) = found.iter().find(|(_, b)| b != bound) {
            return Err(cfg.err(
                first,
                format!(
                    "gives the KDA forget gate's lower bound as {}, but {other} gives {}; give one of them",
                    show(*bound),
                    show(*b)
                ),
            ));
        }
    }
    let bound = found.first().and_then(|(field, b)| b.map(|b| (field.clone(), b)));
    let fla_safe_gate = linear_value(cfg, "linear_attn_config.safe_gate");
    match fla_safe_gate {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) if bound.is_some() => {}
        Some(Value::Bool(true)) => {
            return Err(cfg.err(
                "linear_attn_config.safe_gate",
                "true requires a lower bound (linear_attn_config.lower_bound or gate_lower_bound), as fla's KDA does",
            ))
        }
        Some(v) => return Err(cfg.err("linear_attn_config.safe_gate", format!("expected true or false, found {v}"))),
    }
    match bound {
        None => Ok(None),
        Some((_, b)) if b.is_finite() && b < 0.0 && b >= f32::MIN as f64 => Ok(Some(b as f32)),
        Some((field, b)) => Err(cfg.err(
            &field,
            format!("{b} is not a negative number: the gate's log decay is bounded to [bound, 0)"),
        )),
    }
}

/// `mla_use_output_gate`: MLA layers gate each head's output.
pub(super) fn mla_output_gate(cfg: &ConfigJson) -> Result<bool, ModelError> {
    Ok(cfg.opt_bool("mla_use_output_gate")?.unwrap_or(false))
}

/// `linear_attn_config.use_full_rank_gate`: KDA layers project the output
/// norm's gate with one full-rank `g_proj`.
pub(super) fn kda_output_gate(cfg: &ConfigJson) -> Result<KdaOutputGate, ModelError> {
    const FIELD: &str = "linear_attn_config.use_full_rank_gate";
    match linear_value(cfg, FIELD) {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(KdaOutputGate::LowRank),
        Some(Value::Bool(true)) => Ok(KdaOutputGate::FullRank),
        Some(v) => Err(cfg.err(FIELD, format!("expected true or false, found {v}"))),
    }
}

/// The value of `linear_attn_config.{key}` (`field` spelled with the prefix).
fn linear_value<'a>(cfg: &'a ConfigJson, field: &str) -> Option<&'a Value> {
    let key = field.strip_prefix("linear_attn_config.")?;
    cfg.raw("linear_attn_config")?.get(key)
}

fn number_or_null(cfg: &ConfigJson, field: &str, v: &Value) -> Result<Option<f64>, ModelError> {
    match v {
        Value::Null => Ok(None),
        v => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| cfg.err(field, format!("expected a number or null, found {v}"))),
    }
}

fn show(bound: Option<f64>) -> String {
    bound.map_or("none (the unbounded gate)".to_string(), |b| b.to_string())
}
