//! Kimi Linear (`model_type: kimi_linear`, `KimiLinearForCausalLM`), as
//! transformers 5.24.0 reads its config (docs/kimi_linear.md), and Kimi K3's
//! text model (`kimi_k3.rs` hands it `text_config`), as Moonshot's
//! `modeling_kimi_linear.py` reads it: per layer a
//! KDA mixer (`linear_attn_config.kda_layers`, 1-based) or MLA without RoPE
//! (`full_attn_layers`); dense MLPs (`mlp.`) in the first
//! `first_k_dense_replace` layers, DeepSeek-style MoE (`block_sparse_moe.`,
//! experts `w1`/`w3`/`w2`, sigmoid routing with a selection-only correction
//! bias, groups, `routed_scaling_factor`, `num_shared_experts` shared
//! experts) in the others. Defaults ([`Defaults`]) are transformers' for a
//! top-level `kimi_linear` and Moonshot's for K3's text config (they differ
//! where a field is absent). The K3 fields (`k3_fields.rs`): SiTU-GLU, latent
//! experts, block attention residuals (`attn_residual.rs`) and the gates.
//!
//! Keys follow the one policy (`crate::config::ConfigKeys`): every
//! config.json key is read here (`KEYS`, with transformers' aliases and
//! derived fields, and the keys of `linear_attn_config`) or is bookkeeping;
//! any other key is refused as unknown. Fields transformers ignores are accepted only with
//! the value it computes (`mla_use_nope: true`, `moe_layer_freq: 1`,
//! `moe_router_activation_func: sigmoid`, `topk_method: noaux_tc`, ...): no
//! reference exists for others. The lists are in docs/architectures.md.

use serde_json::Value;

use super::k3_fields;

use crate::config::{ConfigJson, ConfigKeys, MAX_CONFIG_INT};
use crate::error::ModelError;
use crate::spec::{FfnSpec, KdaSpec, LayerSpec, MixerSpec, MlaSpec, ModelSpec, MoeNames, MoeSpec, Scoring, SharedExpertSpec};

/// Kimi Linear's MoE tensor names.
const NAMES: MoeNames = MoeNames {
    block: "block_sparse_moe",
    expert_proj: ["w1", "w3", "w2"],
    ..MoeNames::DEEPSEEK
};

/// `model_type: kimi_linear`'s config.json keys.
pub(crate) const KEYS: ConfigKeys = ConfigKeys {
    docs: "Kimi Linear",
    read: &[IMPLEMENTED],
    refused: &[],
};

/// Where a field is absent: transformers 5.24.0's `KimiLinearConfig`
/// defaults (top-level `kimi_linear`), or Moonshot's
/// `configuration_kimi_k3.py` / `modeling_kimi_linear.py` (K3's text
/// config; docs/kimi_k3_reference.md §1.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Defaults {
    Transformers,
    Moonshot,
}

/// Fields this file reads (each value is checked where it is read), with
/// transformers' aliases (`attribute_map`) and the derived fields a
/// transformers-saved config carries.
const IMPLEMENTED: &[&str] = &[
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_act",
    "rms_norm_eps",
    "attention_bias",
    "tie_word_embeddings",
    "model_max_length",
    "max_position_embeddings",
    "quantization_config",
    "linear_attn_config",
    "linear_num_heads",
    "linear_head_dim",
    "linear_conv_kernel_dim",
    "layer_types",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "head_dim",
    "qk_head_dim",
    "mla_use_nope",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "intermediate_size",
    "first_k_dense_replace",
    "mlp_layer_types",
    "moe_layer_freq",
    "moe_intermediate_size",
    "num_experts",
    "num_local_experts",
    "num_experts_per_token",
    "num_experts_per_tok",
    "num_shared_experts",
    "n_shared_experts",
    "moe_renormalize",
    "norm_topk_prob",
    "num_expert_group",
    "n_group",
    "topk_group",
    "routed_scaling_factor",
    "moe_router_activation_func",
    "use_grouped_topk",
    "topk_method",
    "num_nextn_predict_layers",
    // K3 fields (k3_fields.rs)
    "activation_situ_beta",
    "activation_situ_linear_beta",
    "attn_res_block_size",
    "routed_expert_hidden_size",
    "latent_moe_use_norm",
    "linear_lower_bound",
    "kda_lower_bound",
    "kda_safe_gate",
    "mla_use_output_gate",
];

/// `linear_attn_config` keys larder reads.
const LINEAR_KEYS: &[&str] = &[
    "kda_layers",
    "full_attn_layers",
    "num_heads",
    "head_dim",
    "short_conv_kernel_size",
    // K3 gates (k3_fields.rs)
    "gate_lower_bound",
    "lower_bound",
    "safe_gate",
    "use_full_rank_gate",
];

/// Refuses every `linear_attn_config` key larder does not read, naming it
/// (top-level keys: [`KEYS`], checked before this reader runs).
fn check_linear_keys(cfg: &ConfigJson) -> Result<(), ModelError> {
    let Some(Value::Object(m)) = cfg.value.get("linear_attn_config") else {
        return Ok(());
    };
    match m.keys().find(|k| !LINEAR_KEYS.contains(&k.as_str())) {
        Some(key) => Err(cfg.unknown_key(&format!("linear_attn_config.{key}"), "kimi_linear", KEYS.docs)),
        None => Ok(()),
    }
}

/// `model_type: kimi_linear`, with transformers' defaults.
pub(crate) fn spec(cfg: &ConfigJson) -> Result<ModelSpec, ModelError> {
    read(cfg, Defaults::Transformers)
}

/// Kimi K3's text config, with Moonshot's defaults.
pub(crate) fn spec_moonshot(cfg: &ConfigJson) -> Result<ModelSpec, ModelError> {
    read(cfg, Defaults::Moonshot)
}

fn read(cfg: &ConfigJson, defaults: Defaults) -> Result<ModelSpec, ModelError> {
    check_linear_keys(cfg)?;
    refuse_unsupported(cfg, defaults)?;
    refuse_unsupported_routing(cfg)?;
    refuse_rope(cfg)?;
    let hidden = cfg.usize("hidden_size")?;
    let mla = mla_spec(cfg)?;
    // `rope` stays the default: never applied (no layer rotates), it only
    // sizes the unused table.
    let spec = ModelSpec {
        model_type: "kimi_linear".into(),
        hidden_size: hidden,
        vocab_size: cfg.usize("vocab_size")?,
        num_heads: cfg.usize("num_attention_heads")?,
        num_kv_heads: cfg.usize("num_attention_heads")?,
        head_dim: mla.qk_rope_head_dim,
        rms_norm_eps: rms_norm_eps(cfg, defaults)?,
        max_position_embeddings: cfg
            .opt_usize(aliased(cfg, "model_max_length", "max_position_embeddings")?)?
            .unwrap_or(1 << 20),
        moe_names: NAMES,
        fp8_block: crate::quant::fp8_block(cfg)?,
        compressed: crate::quant::compressed_tensors(cfg)?,
        attn_res_block: k3_fields::attn_res_block(cfg)?,
        ffn_activation: k3_fields::ffn_activation(cfg)?,
        ..ModelSpec::default()
    };
    let kda = MixerSpec::Kda(kda_spec(cfg)?);
    let mla = MixerSpec::Mla(mla);
    let ffns = ffn_plan(cfg, defaults)?;
    let layers = mixer_plan(cfg)?
        .into_iter()
        .zip(ffns)
        .map(|(is_kda, ffn)| LayerSpec::new(if is_kda { kda.clone() } else { mla.clone() }, ffn))
        .collect();
    super::finish(cfg, spec, layers)
}

/// Which of a field's two spellings config.json uses: the Hub name or
/// transformers' alias (`attribute_map`); both with different values is an
/// error naming both.
fn aliased<'a>(cfg: &ConfigJson, hub: &'a str, alias: &'a str) -> Result<&'a str, ModelError> {
    match (cfg.raw(hub), cfg.raw(alias)) {
        (Some(a), Some(b)) if a != b => Err(cfg.err(hub, format!("{a} disagrees with its alias {alias} ({b}); give one of them"))),
        (None, Some(_)) => Ok(alias),
        _ => Ok(hub),
    }
}

/// Router settings Moonshot's config spells that transformers ignores:
/// only the values transformers computes are accepted.
fn refuse_unsupported_routing(cfg: &ConfigJson) -> Result<(), ModelError> {
    let groups = cfg.opt_usize(aliased(cfg, "num_expert_group", "n_group")?)?.unwrap_or(1);
    if cfg.opt_bool("use_grouped_topk")? == Some(false) && groups != 1 {
        return Err(cfg.err(
            "use_grouped_topk",
            format!("false with num_expert_group {groups} is not supported (transformers always routes group-limited)"),
        ));
    }
    match cfg.opt_str("topk_method")? {
        None | Some("noaux_tc") => {}
        Some(other) => {
            return Err(cfg.err(
                "topk_method",
                format!("{other:?} is not supported (only noaux_tc: sigmoid scores, correction bias for selection)"),
            ))
        }
    }
    match cfg.opt_usize("num_nextn_predict_layers")? {
        None | Some(0) => Ok(()),
        Some(n) => Err(cfg.err(
            "num_nextn_predict_layers",
            format!("{n} is not supported (only 0: multi-token-prediction layers are not implemented)"),
        )),
    }
}

/// Kimi Linear's MLA applies no RoPE: `rope_theta` has no effect and is
/// accepted; a RoPE scaling is refused rather than silently ignored.
fn refuse_rope(cfg: &ConfigJson) -> Result<(), ModelError> {
    if let Some(theta) = cfg.opt_f64("rope_theta")? {
        if !(theta.is_finite() && theta > 0.0) {
            return Err(cfg.err("rope_theta", format!("{theta} is not a positive number")));
        }
    }
    if let Some(v) = cfg.raw("rope_scaling") {
        return Err(cfg.err(
            "rope_scaling",
            format!("{v} is not supported: kimi_linear's MLA applies no RoPE (only null)"),
        ));
    }
    match cfg.raw("rope_parameters") {
        None => Ok(()),
        Some(Value::Object(m))
            if m.get("rope_type").and_then(Value::as_str).is_none_or(|t| t == "default")
                && m.keys().all(|k| k == "rope_type" || k == "rope_theta") =>
        {
            Ok(())
        }
        Some(v) => Err(cfg.err(
            "rope_parameters",
            format!("{v} is not supported: kimi_linear's MLA applies no RoPE (only rope_type default)"),
        )),
    }
}

/// Fields whose other values the reference cannot run.
fn refuse_unsupported(cfg: &ConfigJson, defaults: Defaults) -> Result<(), ModelError> {
    if cfg.opt_bool("attention_bias")?.unwrap_or(false) {
        return Err(cfg.err("attention_bias", "true (biases on MLA's projections) is not supported"));
    }
    if cfg.opt_bool("tie_word_embeddings")?.unwrap_or(false) {
        return Err(cfg.err(
            "tie_word_embeddings",
            "true is not supported: transformers 5.24.0 never ties kimi_linear's lm_head to the embedding",
        ));
    }
    // Moonshot's model asserts mla_use_nope (its default is false).
    if !cfg.opt_bool("mla_use_nope")?.unwrap_or(defaults == Defaults::Transformers) {
        return Err(cfg.err(
            "mla_use_nope",
            "false (or absent under Moonshot's defaults) is not supported: it must be true (RoPE in Kimi Linear's MLA: \
             no reference implementation computes it)",
        ));
    }
    if let (Defaults::Transformers, Some(freq)) = (defaults, cfg.opt_usize("moe_layer_freq")?) {
        if freq != 1 {
            return Err(cfg.err(
                "moe_layer_freq",
                format!("{freq} is not supported (only 1: transformers makes every layer from first_k_dense_replace on MoE)"),
            ));
        }
    }
    match cfg.opt_str("moe_router_activation_func")?.unwrap_or("sigmoid") {
        "sigmoid" => Ok(()),
        other => Err(cfg.err("moe_router_activation_func", format!("{other:?} is not supported (only sigmoid)"))),
    }
}

/// `rms_norm_eps`: default 1e-5 (transformers), 1e-6 (Moonshot).
fn rms_norm_eps(cfg: &ConfigJson, defaults: Defaults) -> Result<f32, ModelError> {
    let default = match defaults {
        Defaults::Transformers => 1e-5,
        Defaults::Moonshot => 1e-6,
    };
    let eps = cfg.opt_f64("rms_norm_eps")?.unwrap_or(default);
    if !(eps > 0.0 && eps < 1.0) {
        return Err(cfg.err("rms_norm_eps", format!("{eps} out of range (0, 1)")));
    }
    Ok(eps as f32)
}

/// MLA without RoPE: scale `(nope + rope)^-0.5`, latent norms at eps 1e-6.
fn mla_spec(cfg: &ConfigJson) -> Result<MlaSpec, ModelError> {
    cfg.equal_heads(cfg.usize("num_attention_heads")?)?;
    let q_lora_rank = match cfg.raw("q_lora_rank") {
        None => None,
        Some(_) => Some(cfg.usize("q_lora_rank")?),
    };
    let field = |name: &str, default: usize| -> Result<usize, ModelError> {
        match cfg.opt_usize(name)? {
            Some(0) => Err(cfg.err(name, "must be positive")),
            Some(v) => Ok(v),
            None => Ok(default),
        }
    };
    let (nope, rope) = (field("qk_nope_head_dim", 128)?, field("qk_rope_head_dim", 64)?);
    // `head_dim` has no effect: transformers overwrites it with qk_rope_head_dim
    // (Kimi-Linear-48B's config.json says 72 = hidden / heads). Only its type is checked.
    cfg.opt_usize("head_dim")?;
    cfg.derived("qk_head_dim", nope + rope, "qk_nope_head_dim + qk_rope_head_dim")?;
    let (kv_lora_rank, v_head_dim) = (field("kv_lora_rank", 512)?, field("v_head_dim", 128)?);
    Ok(MlaSpec {
        q_lora_rank,
        rotary: false,
        output_gate: k3_fields::mla_output_gate(cfg)?,
        ..MlaSpec::new(kv_lora_rank, nope, rope, v_head_dim)
    })
}

/// `linear_attn_config` as an object (absent: every default).
fn linear_config(cfg: &ConfigJson) -> Result<Option<&serde_json::Map<String, Value>>, ModelError> {
    match cfg.raw("linear_attn_config") {
        None => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(v) => Err(cfg.err("linear_attn_config", format!("expected an object, found {v}"))),
    }
}

/// `linear_attn_config.{key}` as an integer in `0..=MAX_CONFIG_INT`.
fn linear_int(cfg: &ConfigJson, value: &Value, key: &str) -> Result<usize, ModelError> {
    match value.as_u64() {
        Some(u) if u <= MAX_CONFIG_INT => Ok(u as usize),
        _ => Err(cfg.err(
            &format!("linear_attn_config.{key}"),
            format!("expected an integer from 0 to {MAX_CONFIG_INT}, found {value}"),
        )),
    }
}

/// KDA dimensions from `linear_attn_config` (transformers' defaults 32, 128, 4).
fn kda_spec(cfg: &ConfigJson) -> Result<KdaSpec, ModelError> {
    let lin = linear_config(cfg)?;
    // transformers: `linear_attn_config.{key}`, else the top-level field, else the default.
    let positive = |key: &str, top: &str, default: usize| -> Result<usize, ModelError> {
        let (v, field) = match lin.and_then(|m| m.get(key)).filter(|v| !v.is_null()) {
            Some(v) => (linear_int(cfg, v, key)?, format!("linear_attn_config.{key}")),
            None => (cfg.opt_usize(top)?.unwrap_or(default), top.to_string()),
        };
        if v == 0 {
            return Err(cfg.err(&field, "must be positive"));
        }
        Ok(v)
    };
    let num_heads = positive("num_heads", "linear_num_heads", 32)?;
    let head_dim = positive("head_dim", "linear_head_dim", 128)?;
    let conv_kernel = positive("short_conv_kernel_size", "linear_conv_kernel_dim", 4)?;
    Ok(KdaSpec {
        gate_lower_bound: k3_fields::gate_lower_bound(cfg)?,
        output_gate: k3_fields::kda_output_gate(cfg)?,
        ..KdaSpec::new(num_heads, head_dim, conv_kernel)
    })
}

/// Per layer (0-based), whether it is KDA (else MLA): an explicit
/// `layer_types`, else both 1-based lists of `linear_attn_config`, else
/// transformers' default (MLA at `i > 0 && i % 4 == 0`).
fn mixer_plan(cfg: &ConfigJson) -> Result<Vec<bool>, ModelError> {
    let n = cfg.num_layers()?;
    if let Some(types) = cfg.raw("layer_types") {
        let types = types
            .as_array()
            .filter(|t| t.len() == n)
            .ok_or_else(|| cfg.err("layer_types", format!("expected a list of {n} entries (one per layer)")))?;
        return types
            .iter()
            .map(|t| match t.as_str() {
                Some("linear_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(cfg.err(
                    "layer_types",
                    format!("unsupported layer type {t} (linear_attention or full_attention)"),
                )),
            })
            .collect();
    }
    let lin = linear_config(cfg)?;
    let list = |key: &str| -> Result<Option<Vec<usize>>, ModelError> {
        let field = format!("linear_attn_config.{key}");
        match lin.and_then(|m| m.get(key)).filter(|v| !v.is_null()) {
            None => Ok(None),
            Some(Value::Array(items)) => {
                let layers = items.iter().map(|v| linear_int(cfg, v, key)).collect::<Result<Vec<_>, _>>()?;
                match layers.iter().find(|&&l| l == 0 || l > n) {
                    Some(bad) => Err(cfg.err(&field, format!("layer {bad} is not in 1..={n} (layers are 1-based)"))),
                    None => Ok(Some(layers)),
                }
            }
            Some(v) => Err(cfg.err(&field, format!("expected a list of layer numbers, found {v}"))),
        }
    };
    let (Some(kda), Some(full)) = (list("kda_layers")?, list("full_attn_layers")?) else {
        return Ok((0..n).map(|i| !(i > 0 && i % 4 == 0)).collect());
    };
    (1..=n)
        .map(|l| match (kda.contains(&l), full.contains(&l)) {
            (true, false) => Ok(true),
            (false, true) => Ok(false),
            (true, true) => Err(cfg.err(
                "linear_attn_config.kda_layers",
                format!("layer {l} is also in full_attn_layers; each layer is either KDA or MLA"),
            )),
            (false, false) => Err(cfg.err(
                "linear_attn_config.kda_layers",
                format!("layer {l} is in neither kda_layers nor full_attn_layers"),
            )),
        })
        .collect()
}

/// Dense or MoE per layer: an explicit `mlp_layer_types`, else dense below
/// `first_k_dense_replace` (default 1; Moonshot's 0) and (Moonshot's model)
/// where `layer % moe_layer_freq != 0`, MoE elsewhere.
fn ffn_plan(cfg: &ConfigJson, defaults: Defaults) -> Result<Vec<FfnSpec>, ModelError> {
    let n = cfg.num_layers()?;
    let intermediate = cfg.opt_usize("intermediate_size")?.unwrap_or(9216);
    if intermediate == 0 {
        return Err(cfg.err("intermediate_size", "must be positive"));
    }
    let dense = FfnSpec::Dense { intermediate };
    let moe = FfnSpec::Moe(moe_spec(cfg, defaults)?);
    if let Some(types) = cfg.raw("mlp_layer_types") {
        let types = types
            .as_array()
            .filter(|t| t.len() == n)
            .ok_or_else(|| cfg.err("mlp_layer_types", format!("expected a list of {n} entries (one per layer)")))?;
        return types
            .iter()
            .map(|t| match t.as_str() {
                Some("dense") => Ok(dense.clone()),
                Some("sparse") => Ok(moe.clone()),
                _ => Err(cfg.err("mlp_layer_types", format!("unsupported entry {t} (dense or sparse)"))),
            })
            .collect();
    }
    let first_moe = cfg
        .opt_usize("first_k_dense_replace")?
        .unwrap_or(if defaults == Defaults::Moonshot { 0 } else { 1 });
    let freq = match defaults {
        Defaults::Transformers => 1,
        Defaults::Moonshot => cfg.opt_usize("moe_layer_freq")?.unwrap_or(1),
    };
    if freq == 0 {
        return Err(cfg.err("moe_layer_freq", "must be positive"));
    }
    let is_moe = |l: usize| l >= first_moe && l.is_multiple_of(freq);
    Ok((0..n).map(|l| if is_moe(l) { moe.clone() } else { dense.clone() }).collect())
}

/// The MoE block: sigmoid routing, groups, renormalisation, scaling, shared experts.
fn moe_spec(cfg: &ConfigJson, defaults: Defaults) -> Result<MoeSpec, ModelError> {
    let moonshot = defaults == Defaults::Moonshot;
    let experts_field = aliased(cfg, "num_experts", "num_local_experts")?;
    let top_k_field = aliased(cfg, "num_experts_per_token", "num_experts_per_tok")?;
    let num_experts = cfg.opt_usize(experts_field)?.unwrap_or(256);
    let top_k = cfg.opt_usize(top_k_field)?.unwrap_or(8);
    if num_experts == 0 {
        return Err(cfg.err(experts_field, "must be positive"));
    }
    if top_k == 0 || top_k > num_experts {
        return Err(cfg.err(top_k_field, format!("{top_k} must be between 1 and num_experts ({num_experts})")));
    }
    let group_field = aliased(cfg, "num_expert_group", "n_group")?;
    let n_group = cfg.opt_usize(group_field)?.unwrap_or(1);
    if n_group == 0 || !num_experts.is_multiple_of(n_group) || (n_group > 1 && num_experts / n_group < 2) {
        return Err(cfg.err(
            group_field,
            format!("{n_group} must divide num_experts ({num_experts}) into groups of at least 2 experts"),
        ));
    }
    let topk_group = cfg.opt_usize("topk_group")?.unwrap_or(1);
    if topk_group == 0 || topk_group > n_group {
        return Err(cfg.err(
            "topk_group",
            format!("{topk_group} must be between 1 and num_expert_group ({n_group})"),
        ));
    }
    let intermediate = cfg.opt_usize("moe_intermediate_size")?.unwrap_or(1024);
    if intermediate == 0 {
        return Err(cfg.err("moe_intermediate_size", "must be positive"));
    }
    let shared_default = if moonshot { 0 } else { 1 };
    let shared_expert = match cfg
        .opt_usize(aliased(cfg, "num_shared_experts", "n_shared_experts")?)?
        .unwrap_or(shared_default)
    {
        0 => None,
        k => Some(SharedExpertSpec::new(intermediate * k)),
    };
    let scaling = cfg.opt_f64("routed_scaling_factor")?.unwrap_or(if moonshot { 1.0 } else { 2.446 });
    if !scaling.is_finite() {
        return Err(cfg.err("routed_scaling_factor", format!("{scaling} is not a finite number")));
    }
    Ok(MoeSpec {
        // Moonshot's gate renormalises only when more than one expert is chosen.
        renormalize: cfg.opt_bool(aliased(cfg, "moe_renormalize", "norm_topk_prob")?)?.unwrap_or(true) && (!moonshot || top_k > 1),
        latent: k3_fields::latent(cfg)?,
        shared_expert,
        scoring: Scoring::SigmoidGroups {
            n_group,
            topk_group,
            scaling: scaling as f32,
        },
        ..MoeSpec::new(num_experts, top_k, intermediate)
    })
}
