//! Rotary position embeddings as transformers computes them: the inverse
//! frequencies (with `default`, `linear`, `llama3` or `yarn` scaling), the
//! attention scaling factor, and the rotate-half application to one head.

use serde_json::{Map, Value};

use crate::config::ConfigJson;
use crate::error::ModelError;

/// RoPE frequency scaling.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum RopeScaling {
    None,
    Linear {
        factor: f64,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        attention_factor: Option<f64>,
        mscale: Option<f64>,
        mscale_all_dim: Option<f64>,
        truncate: bool,
    },
}

/// RoPE settings of a model.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeSpec {
    pub theta: f64,
    pub scaling: RopeScaling,
}

impl Default for RopeSpec {
    /// theta 10000 (transformers' default), unscaled.
    fn default() -> Self {
        RopeSpec {
            theta: 10000.0,
            scaling: RopeScaling::None,
        }
    }
}

/// Keys of `rope_scaling` / `rope_parameters` every rope type reads.
pub(crate) const ROPE_COMMON_KEYS: &[&str] = &["rope_type", "type", "rope_theta"];

/// The rope types larder implements, with the keys each reads beyond
/// [`ROPE_COMMON_KEYS`]; any other key of its object is refused naming it.
pub(crate) const ROPE_TYPES: &[(&str, &[&str])] = &[
    ("default", &[]),
    ("linear", &["factor"]),
    (
        "llama3",
        &["factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"],
    ),
    (
        "yarn",
        &[
            "factor",
            "original_max_position_embeddings",
            "beta_fast",
            "beta_slow",
            "attention_factor",
            "mscale",
            "mscale_all_dim",
            "truncate",
        ],
    ),
];

impl RopeSpec {
    /// Reads `rope_theta` and `rope_scaling` (or transformers 5's
    /// `rope_parameters`, which holds both); either object's rope type must
    /// be one of `ROPE_TYPES` and its keys those the type reads.
    pub fn from_config(cfg: &ConfigJson, default_theta: f64) -> Result<Self, ModelError> {
        for field in ["rope_scaling", "rope_parameters"] {
            if let Some(obj) = cfg.raw(field).and_then(Value::as_object) {
                check_keys(cfg, field, obj)?;
            }
        }
        let params = cfg.raw("rope_parameters").filter(|v| v.is_object());
        let theta = match params.and_then(|p| p.get("rope_theta")).and_then(Value::as_f64) {
            Some(t) => t,
            None => cfg.opt_f64("rope_theta")?.unwrap_or(default_theta),
        };
        if theta.is_nan() || theta <= 1.0 {
            return Err(cfg.err("rope_theta", format!("{theta} must be greater than 1")));
        }
        let (field, scaling) = match cfg.raw("rope_scaling") {
            Some(s) => ("rope_scaling", Some(s)),
            None => ("rope_parameters", params),
        };
        let max_pos = cfg.opt_usize("max_position_embeddings")?.unwrap_or(2048) as f64;
        let scaling = match scaling {
            None => RopeScaling::None,
            Some(s) => parse_scaling(cfg, field, s, max_pos)?,
        };
        Ok(RopeSpec { theta, scaling })
    }
}

fn parse_scaling(cfg: &ConfigJson, field: &str, s: &Value, max_pos: f64) -> Result<RopeScaling, ModelError> {
    let obj = s.as_object().ok_or_else(|| cfg.err(field, "expected an object"))?;
    let kind = rope_kind(obj);
    let num = |key: &str| obj.get(key).and_then(Value::as_f64);
    let need = |key: &str| num(key).ok_or_else(|| cfg.err(&format!("{field}.{key}"), "missing or not a number"));
    let factor = || -> Result<f64, ModelError> {
        let f = need("factor")?;
        if f < 1.0 {
            return Err(cfg.err(&format!("{field}.factor"), format!("{f} must be >= 1")));
        }
        Ok(f)
    };
    Ok(match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: factor()? },
        "llama3" => RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: need("low_freq_factor")?,
            high_freq_factor: need("high_freq_factor")?,
            original_max_position_embeddings: need("original_max_position_embeddings")?,
        },
        "yarn" => RopeScaling::Yarn {
            factor: factor()?,
            original_max_position_embeddings: num("original_max_position_embeddings").unwrap_or(max_pos),
            beta_fast: num("beta_fast").unwrap_or(32.0),
            beta_slow: num("beta_slow").unwrap_or(1.0),
            attention_factor: num("attention_factor"),
            mscale: num("mscale"),
            mscale_all_dim: num("mscale_all_dim"),
            truncate: obj.get("truncate").and_then(Value::as_bool).unwrap_or(true),
        },
        other => return Err(unsupported_type(cfg, field, other)),
    })
}

/// The rope type of a `rope_scaling` / `rope_parameters` object (`default` when unnamed).
fn rope_kind(obj: &Map<String, Value>) -> &str {
    obj.get("rope_type")
        .or_else(|| obj.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default")
}

/// Refuses a rope type larder does not implement, or a key its type does not read.
fn check_keys(cfg: &ConfigJson, field: &str, obj: &Map<String, Value>) -> Result<(), ModelError> {
    let kind = rope_kind(obj);
    let (_, keys) = ROPE_TYPES
        .iter()
        .find(|(name, _)| *name == kind)
        .ok_or_else(|| unsupported_type(cfg, field, kind))?;
    match obj
        .keys()
        .find(|k| !ROPE_COMMON_KEYS.contains(&k.as_str()) && !keys.contains(&k.as_str()))
    {
        Some(key) => Err(cfg.err(
            &format!("{field}.{key}"),
            format!(
                "is not a RoPE parameter larder implements (rope type {kind:?} reads {})",
                keys.join(", ")
            ),
        )),
        None => Ok(()),
    }
}

fn unsupported_type(cfg: &ConfigJson, field: &str, kind: &str) -> ModelError {
    let supported: Vec<&str> = ROPE_TYPES.iter().map(|(name, _)| *name).collect();
    cfg.err(
        &format!("{field}.rope_type"),
        format!("{kind:?} is not supported (supported: {})", supported.join(", ")),
    )
}

/// Precomputed inverse frequencies for one head size.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    attention_scaling: f32,
}

impl Rope {
    /// Builds the frequencies for heads of `head_dim` (even).
    pub fn new(spec: &RopeSpec, head_dim: usize) -> Self {
        let half = head_dim / 2;
        let base: Vec<f64> = (0..half).map(|i| 1.0 / spec.theta.powf((2 * i) as f64 / head_dim as f64)).collect();
        let (inv, scaling) = match &spec.scaling {
            RopeScaling::None => (base, 1.0),
            RopeScaling::Linear { factor } => (base.iter().map(|f| f / factor).collect(), 1.0),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => {
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                let inv = base
                    .iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect();
                (inv, 1.0)
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: orig,
                beta_fast,
                beta_slow,
                attention_factor,
                mscale,
                mscale_all_dim,
                truncate,
            } => {
                let dim = head_dim as f64;
                let correction_dim = |rot: f64| (dim * (orig / (rot * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * spec.theta.ln());
                let (mut low, mut high) = (correction_dim(*beta_fast), correction_dim(*beta_slow));
                if *truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
                if low == high {
                    high += 0.001;
                }
                let inv = base
                    .iter()
                    .enumerate()
                    .map(|(i, &f)| {
                        let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        let extrapolation = 1.0 - ramp;
                        (f / factor) * (1.0 - extrapolation) + f * extrapolation
                    })
                    .collect();
                let get_mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
                let att = match (attention_factor, mscale, mscale_all_dim) {
                    (Some(a), _, _) => *a,
                    (None, Some(m), Some(ma)) if *m != 0.0 && *ma != 0.0 => get_mscale(*factor, *m) / get_mscale(*factor, *ma),
                    _ => get_mscale(*factor, 1.0),
                };
                (inv, att)
            }
        };
        Rope {
            inv_freq: inv.into_iter().map(|f| f as f32).collect(),
            attention_scaling: scaling as f32,
        }
    }

    /// The inverse frequency of each rotated pair.
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// The factor transformers multiplies cos and sin by (1 except for YaRN).
    pub fn attention_scaling(&self) -> f32 {
        self.attention_scaling
    }

    /// `(cos, sin)` of each frequency at `pos`, already scaled.
    pub(crate) fn cos_sin(&self, pos: usize) -> (Vec<f32>, Vec<f32>) {
        let p = pos as f32;
        let (mut cos, mut sin) = (Vec::with_capacity(self.inv_freq.len()), Vec::with_capacity(self.inv_freq.len()));
        for &f in &self.inv_freq {
            let angle = p * f;
            cos.push(angle.cos() * self.attention_scaling);
            sin.push(angle.sin() * self.attention_scaling);
        }
        (cos, sin)
    }

    /// Rotates one head in place (rotate-half layout: pairs are `i` and `i + d/2`).
    pub fn apply(head: &mut [f32], cos: &[f32], sin: &[f32]) {
        let half = head.len() / 2;
        for i in 0..half {
            let (x1, x2) = (head[i], head[i + half]);
            head[i] = x1 * cos[i] - x2 * sin[i];
            head[i + half] = x2 * cos[i] + x1 * sin[i];
        }
    }
}

impl Rope {
    /// DeepSeek's interleaved layout: pair `i` is `(x[2i], x[2i+1])`, rotated
    /// by frequency `i`. Like transformers' `apply_rotary_pos_emb_interleave`,
    /// the result is written de-interleaved: rotated first members, then
    /// rotated second members (queries and keys get the same permutation).
    pub(crate) fn apply_interleaved(head: &mut [f32], cos: &[f32], sin: &[f32], scratch: &mut Vec<f32>) {
        let half = head.len() / 2;
        scratch.clear();
        scratch.extend_from_slice(head);
        for i in 0..half {
            let (x1, x2) = (scratch[2 * i], scratch[2 * i + 1]);
            head[i] = x1 * cos[i] - x2 * sin[i];
            head[half + i] = x2 * cos[i] + x1 * sin[i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity() {
        let rope = Rope::new(
            &RopeSpec {
                theta: 10000.0,
                scaling: RopeScaling::None,
            },
            8,
        );
        let (c, s) = rope.cos_sin(0);
        let mut h = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        Rope::apply(&mut h, &c, &s);
        assert_eq!(h, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    }

    #[test]
    fn rotation_preserves_norm() {
        let rope = Rope::new(
            &RopeSpec {
                theta: 10000.0,
                scaling: RopeScaling::Linear { factor: 2.0 },
            },
            4,
        );
        let (c, s) = rope.cos_sin(7);
        let mut h = [1.0f32, 0.0, 0.0, 1.0];
        Rope::apply(&mut h, &c, &s);
        let n: f32 = h.iter().map(|v| v * v).sum();
        assert!((n - 2.0).abs() < 1e-6);
    }
}
