//! Kimi K3's fields of a `kimi_linear` config (K3's `text_config`, or a
//! top-level `kimi_linear`), as Moonshot's `modeling_kimi_linear.py` reads
//! them (docs/kimi_k3_reference.md): SiTU-GLU (`hidden_act: situ`,
//! `activation_situ_beta`, `activation_situ_linear_beta`), latent experts
//! (`routed_expert_hidden_size`, `latent_moe_use_norm`), attention
//! residuals (`attn_res_block_size`) and the gates below.
//!
//! The gates, read under every spelling public code uses:
//!
//! - the lower-bounded KDA forget gate `g = bound · sigmoid(exp(A_log) · u)`:
//!   `linear_attn_config.gate_lower_bound` (transformers 5.24.0 glm5_next;
//!   top-level `linear_lower_bound` is the attribute it derives from it),
//!   `linear_attn_config.lower_bound` (fla's `KimiDeltaAttention`, whose
//!   `safe_gate` only lets a kernel assume the bound and requires one), and
//!   `kda_safe_gate` / `kda_lower_bound` (bailing_hybrid: safe gate on by
//!   default, bound −5.0 by default). Every spelling present must agree;
//! - the MLA output gate: `mla_use_output_gate` (tensor
//!   `self_attn.g_proj.weight` `[heads · v_head_dim, hidden]`, element-wise);
//! - the full-rank KDA output gate: `linear_attn_config.use_full_rank_gate`
//!   (tensor `self_attn.g_proj.weight` `[H·D, hidden]` in place of
//!   `g_a_proj` / `g_b_proj`, bailing_hybrid's KDA).
//!
//! The two output gates are switched by the config, and the loaders refuse a
//! checkpoint whose `g_proj` tensors disagree with the switch, so a weight is
//! never silently ignored.

use larder_tensor::GluActivation;
use serde_json::Value;

use crate::config::ConfigJson;
use crate::error::ModelError;
use crate::spec::{KdaOutputGate, LatentSpec};

/// How the feed-forward units combine gate and up: `hidden_act` `silu` (or
/// `swish`), or `situ` with its betas (Moonshot's
/// `_get_situ_activation_params`: `beta or 1.0`, so 0 and null are 1.0; the
/// up clip only when `activation_situ_linear_beta` is set).
pub(super) fn ffn_activation(cfg: &ConfigJson) -> Result<GluActivation, ModelError> {
    const BETA: &str = "activation_situ_beta";
    const LINEAR_BETA: &str = "activation_situ_linear_beta";
    match cfg.opt_str("hidden_act")?.unwrap_or("silu") {
        "silu" | "swish" => {
            for field in [BETA, LINEAR_BETA] {
                if cfg.raw(field).is_some_and(|v| !v.is_null()) {
                    return Err(cfg.err(field, "is set but hidden_act is not \"situ\": it would be ignored; remove it"));
                }
            }
            Ok(GluActivation::Silu)
        }
        "situ" => {
            let beta = match cfg.opt_f64(BETA)? {
                None => 1.0,
                Some(0.0) => 1.0,
                Some(b) if b.is_finite() && (b as f32).is_normal() => b as f32,
                Some(b) => return Err(cfg.err(BETA, format!("{b} is not a finite non-zero number"))),
            };
            let linear_beta = match cfg.opt_f64(LINEAR_BETA)? {
                None => None,
                Some(b) if b.is_finite() && (b as f32).is_normal() => Some(b as f32),
                Some(b) => return Err(cfg.err(LINEAR_BETA, format!("{b} is not a finite non-zero number (null: no clip)"))),
            };
            Ok(GluActivation::Situ { beta, linear_beta })
        }
        other => Err(cfg.err("hidden_act", format!("{other:?} is not supported (silu or situ)"))),
    }
}

/// `routed_expert_hidden_size` and `latent_moe_use_norm`: latent-space
/// experts, or `None` (experts at `hidden_size`).
pub(super) fn latent(cfg: &ConfigJson) -> Result<Option<LatentSpec>, ModelError> {
    const SIZE: &str = "routed_expert_hidden_size";
    let norm = cfg.opt_bool("latent_moe_use_norm")?.unwrap_or(false);
    match cfg.opt_usize(SIZE)? {
        Some(0) => Err(cfg.err(
            SIZE,
            "0 is not a width (a positive latent size, or null for experts at hidden_size)",
        )),
        Some(w) => Ok(Some(LatentSpec::new(w, norm))),
        None if norm => Err(cfg.err(
            "latent_moe_use_norm",
            "true needs latent experts (routed_expert_hidden_size): there is no latent sum to normalise",
        )),
        None => Ok(None),
    }
}

/// `attn_res_block_size`: layers per attention-residual block, or `None`.
pub(super) fn attn_res_block(cfg: &ConfigJson) -> Result<Option<usize>, ModelError> {
    match cfg.opt_usize("attn_res_block_size")? {
        Some(0) => Err(cfg.err(
            "attn_res_block_size",
            "0 is not supported: at least 1 layer per attention-residual block, or null for plain residuals",
        )),
        n => Ok(n),
    }
}

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
