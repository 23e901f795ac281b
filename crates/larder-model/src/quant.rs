//! `quantization_config`: DeepSeek's fp8 block scales ([`fp8_block`]),
//! compressed-tensors (Kimi-K2-Thinking's INT4 `pack-quantized`, the K3
//! release's `mxfp4-pack-quantized`; [`compressed_tensors`]: which modules
//! ship 4-bit packed weights and in what format) and gpt-oss's MXFP4
//! experts ([`gpt_oss_mxfp4`]).
//!
//! Read fail-closed: every field that changes what the weights mean is
//! checked, anything not implemented (asymmetric zero points, activation
//! quantization, group sizes the kernels do not run, other formats, unknown
//! keys) is refused naming the field. Weights stay packed: the scheme only
//! tells the checkpoint how to view the shipped bytes (see
//! [`crate::assemble`]).

use regex::Regex;
use serde_json::Value;

use crate::config::ConfigJson;
use crate::error::ModelError;

/// The 4-bit weight format of a compressed-tensors checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackedFormat {
    /// `pack-quantized`: symmetric signed int4, 8 per i32 word (stored
    /// offset by 8, lowest nibble first), one scale per `group` columns.
    Int4 { group: usize },
    /// `mxfp4-pack-quantized`: e2m1 codes, two per byte (low nibble = even
    /// column), one e8m0 scale byte per 32 columns.
    Mxfp4,
}

/// One `ignore` entry: a module name, or a `re:` pattern matched at the
/// start of the module name (as compressed-tensors matches it).
#[derive(Debug, Clone)]
enum IgnoreRule {
    Name(String),
    Pattern(String, Regex),
}

impl IgnoreRule {
    fn matches(&self, module: &str) -> bool {
        match self {
            IgnoreRule::Name(n) => module == n,
            IgnoreRule::Pattern(_, re) => re.is_match(module),
        }
    }

    fn text(&self) -> &str {
        match self {
            IgnoreRule::Name(n) => n,
            IgnoreRule::Pattern(p, _) => p,
        }
    }
}

/// A checked compressed-tensors scheme.
#[derive(Debug, Clone)]
pub struct CompressedTensors {
    pub format: PackedFormat,
    /// `config_groups.<group>.targets`: `Linear` (every linear layer) or
    /// module names / `re:` patterns.
    targets: Vec<IgnoreRule>,
    targets_linear: bool,
    ignore: Vec<IgnoreRule>,
    /// `quantization_config.config_groups.<group>` (for error messages).
    group_field: String,
}

/// How a linear module must ship under a scheme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleRule {
    /// Packed in the scheme's format.
    Packed(PackedFormat),
    /// Unquantized: `field` is the config field that says so (`ignore`, or
    /// the group's `targets` that do not name it).
    Plain { field: String, reason: String },
}

impl CompressedTensors {
    /// How linear module `module` (e.g. `model.layers.1.mlp.experts.0.gate_proj`) must ship.
    pub fn rule(&self, module: &str) -> ModuleRule {
        if let Some(r) = self.ignore.iter().find(|r| r.matches(module)) {
            return ModuleRule::Plain {
                field: "quantization_config.ignore".into(),
                reason: format!("it matches the entry {:?}", r.text()),
            };
        }
        if self.targets_linear || self.targets.iter().any(|r| r.matches(module)) {
            ModuleRule::Packed(self.format)
        } else {
            ModuleRule::Plain {
                field: format!("{}.targets", self.group_field),
                reason: "no target names it".into(),
            }
        }
    }

    /// The config field that sets packing (for error messages).
    pub fn field(&self) -> &str {
        &self.group_field
    }
}

const TOP_KEYS: &[&str] = &[
    "config_groups",
    "format",
    "ignore",
    "kv_cache_scheme",
    "quant_method",
    "quantization_status",
    "global_compression_ratio",
    "sparsity_config",
    "transform_config",
    "version",
];
const GROUP_KEYS: &[&str] = &["targets", "weights", "input_activations", "output_activations", "format"];
const WEIGHT_KEYS: &[&str] = &[
    "num_bits",
    "type",
    "symmetric",
    "group_size",
    "strategy",
    "dynamic",
    "actorder",
    "block_structure",
    "observer",
    "observer_kwargs",
    "scale_dtype",
    "zp_dtype",
];

/// Keys of an fp8 `quantization_config`.
const FP8_KEYS: &[&str] = &[
    "quant_method",
    "fmt",
    "weight_block_size",
    "activation_scheme",
    "modules_to_not_convert",
];

/// `quantization_config` of an fp8 checkpoint (DeepSeek-V3, Kimi-K2): its
/// block size; `None` without one or for compressed-tensors (read by
/// [`compressed_tensors`]). Weights are fp8 where they ship as fp8 with
/// their `weight_scale_inv` (so `modules_to_not_convert` is whatever ships
/// unquantized); activations stay f32, so only `activation_scheme: dynamic`
/// (no activation scales shipped) is read; any other key is refused.
pub(crate) fn fp8_block(cfg: &ConfigJson) -> Result<Option<(usize, usize)>, ModelError> {
    let Some(q) = cfg.raw("quantization_config") else { return Ok(None) };
    let field = "quantization_config";
    let method = q.get("quant_method").and_then(|m| m.as_str()).unwrap_or("");
    if method == "compressed-tensors" {
        return Ok(None);
    }
    if method != "fp8" {
        return Err(cfg.err(
            &format!("{field}.quant_method"),
            format!("{method:?} is not supported (supported: fp8 with block scales, compressed-tensors)"),
        ));
    }
    let obj = q.as_object().ok_or_else(|| cfg.err(field, "not an object"))?;
    refuse_unknown(cfg, field, obj, FP8_KEYS)?;
    if let Some(fmt) = str_field(q, "fmt") {
        if fmt != "e4m3" {
            return Err(cfg.err(&format!("{field}.fmt"), format!("{fmt:?} is not supported (supported: e4m3)")));
        }
    }
    match q.get("activation_scheme") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "dynamic" => {}
        Some(v) => {
            return Err(cfg.err(
                &format!("{field}.activation_scheme"),
                format!("{v} is not supported (only dynamic: larder keeps activations in f32 and reads no activation scales)"),
            ))
        }
    }
    let block: Vec<usize> = q
        .get("weight_block_size")
        .and_then(|b| b.as_array())
        .map(|a| a.iter().filter_map(|v| v.as_u64().map(|x| x as usize)).collect())
        .unwrap_or_default();
    match block.as_slice() {
        [r, c] if *r > 0 && *c > 0 => Ok(Some((*r, *c))),
        _ => Err(cfg.err(&format!("{field}.weight_block_size"), "expected two positive integers")),
    }
}

/// Reads `quantization_config` when its `quant_method` is
/// `compressed-tensors`; `None` without one or for another method.
pub(crate) fn compressed_tensors(cfg: &ConfigJson) -> Result<Option<CompressedTensors>, ModelError> {
    let Some(q) = cfg.raw("quantization_config") else { return Ok(None) };
    if q.get("quant_method").and_then(Value::as_str) != Some("compressed-tensors") {
        return Ok(None);
    }
    let f = "quantization_config";
    let obj = q.as_object().ok_or_else(|| cfg.err(f, "not an object"))?;
    refuse_unknown(cfg, f, obj, TOP_KEYS)?;
    let format = match str_field(q, "format") {
        Some("pack-quantized") => "pack-quantized",
        Some("mxfp4-pack-quantized") => "mxfp4-pack-quantized",
        other => {
            return Err(cfg.err(
                &format!("{f}.format"),
                format!(
                    "{} is not supported (supported: pack-quantized, mxfp4-pack-quantized)",
                    other.map_or("missing".to_string(), |f| format!("{f:?}"))
                ),
            ))
        }
    };
    match str_field(q, "quantization_status") {
        Some("compressed") | None => {}
        Some(s) => {
            return Err(cfg.err(
                &format!("{f}.quantization_status"),
                format!("{s:?}: only compressed checkpoints are read"),
            ))
        }
    }
    for key in ["kv_cache_scheme", "sparsity_config", "transform_config"] {
        if q.get(key).is_some_and(|v| !v.is_null()) {
            return Err(cfg.err(&format!("{f}.{key}"), "is set; not supported (must be null)"));
        }
    }
    let groups = q
        .get("config_groups")
        .and_then(Value::as_object)
        .ok_or_else(|| cfg.err(&format!("{f}.config_groups"), "missing or not an object"))?;
    let [(gname, group)] = groups.iter().collect::<Vec<_>>()[..] else {
        return Err(cfg.err(
            &format!("{f}.config_groups"),
            format!("{} groups; exactly one is supported", groups.len()),
        ));
    };
    let gf = format!("{f}.config_groups.{gname}");
    let packed = group_format(cfg, &gf, group, format)?;
    let (targets, targets_linear) = targets(cfg, &gf, group)?;
    let ignore = match q.get("ignore") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.iter().map(|v| rule(cfg, &format!("{f}.ignore"), v)).collect::<Result<_, _>>()?,
        Some(_) => return Err(cfg.err(&format!("{f}.ignore"), "not a list")),
    };
    Ok(Some(CompressedTensors {
        format: packed,
        targets,
        targets_linear,
        ignore,
        group_field: gf,
    }))
}

/// Checks one config group's weight scheme against `format`.
fn group_format(cfg: &ConfigJson, gf: &str, group: &Value, format: &str) -> Result<PackedFormat, ModelError> {
    let obj = group.as_object().ok_or_else(|| cfg.err(gf, "not an object"))?;
    refuse_unknown(cfg, gf, obj, GROUP_KEYS)?;
    if let Some(g) = str_field(group, "format") {
        if g != format {
            return Err(cfg.err(
                &format!("{gf}.format"),
                format!("{g:?} differs from quantization_config.format {format:?}"),
            ));
        }
    }
    for key in ["input_activations", "output_activations"] {
        if group.get(key).is_some_and(|v| !v.is_null()) {
            return Err(cfg.err(&format!("{gf}.{key}"), "activation quantization is not supported (must be null)"));
        }
    }
    let wf = format!("{gf}.weights");
    let w = group
        .get("weights")
        .filter(|w| w.is_object())
        .ok_or_else(|| cfg.err(&wf, "missing or not an object"))?;
    refuse_unknown(cfg, &wf, w.as_object().into_iter().flatten(), WEIGHT_KEYS)?;
    let want = |key: &str, ok: bool, msg: &str| {
        if ok {
            Ok(())
        } else {
            Err(cfg.err(&format!("{wf}.{key}"), format!("{}: {msg}", w.get(key).unwrap_or(&Value::Null))))
        }
    };
    want(
        "num_bits",
        w.get("num_bits").and_then(Value::as_u64) == Some(4),
        "only 4-bit weights are supported",
    )?;
    want(
        "symmetric",
        w.get("symmetric").and_then(Value::as_bool) == Some(true),
        "asymmetric weights (zero points) are not supported",
    )?;
    want(
        "zp_dtype",
        w.get("zp_dtype").is_none_or(Value::is_null),
        "zero points are not supported",
    )?;
    want(
        "strategy",
        str_field(w, "strategy") == Some("group"),
        "only the group strategy is supported",
    )?;
    want(
        "dynamic",
        w.get("dynamic").is_none_or(|d| d.as_bool() == Some(false)),
        "dynamic quantization is not supported",
    )?;
    for key in ["actorder", "block_structure"] {
        want(key, w.get(key).is_none_or(Value::is_null), "not supported (must be null)")?;
    }
    let group_size = w.get("group_size").and_then(Value::as_u64).unwrap_or(0) as usize;
    let scale_dtype = str_field(w, "scale_dtype");
    if format == "mxfp4-pack-quantized" {
        want(
            "type",
            str_field(w, "type") == Some("float"),
            "mxfp4-pack-quantized needs type float",
        )?;
        want("group_size", group_size == 32, "mxfp4 needs groups of 32")?;
        want(
            "scale_dtype",
            scale_dtype.is_none_or(|s| s == "torch.uint8"),
            "mxfp4 scales are e8m0 bytes (torch.uint8)",
        )?;
        Ok(PackedFormat::Mxfp4)
    } else {
        want("type", str_field(w, "type") == Some("int"), "pack-quantized needs type int")?;
        want(
            "group_size",
            group_size > 0 && group_size.is_multiple_of(8),
            "int4 groups must be a positive multiple of 8",
        )?;
        let floats = ["torch.bfloat16", "torch.float16", "torch.float32"];
        want(
            "scale_dtype",
            scale_dtype.is_none_or(|s| floats.contains(&s)),
            "int4 scales must be bf16, f16 or f32",
        )?;
        Ok(PackedFormat::Int4 { group: group_size })
    }
}

fn targets(cfg: &ConfigJson, gf: &str, group: &Value) -> Result<(Vec<IgnoreRule>, bool), ModelError> {
    let tf = format!("{gf}.targets");
    let list = group
        .get("targets")
        .and_then(Value::as_array)
        .ok_or_else(|| cfg.err(&tf, "missing or not a list"))?;
    let mut rules = Vec::new();
    let mut linear = false;
    for t in list {
        if t.as_str() == Some("Linear") {
            linear = true;
        } else {
            rules.push(rule(cfg, &tf, t)?);
        }
    }
    Ok((rules, linear))
}

fn rule(cfg: &ConfigJson, field: &str, v: &Value) -> Result<IgnoreRule, ModelError> {
    let s = v.as_str().ok_or_else(|| cfg.err(field, format!("entry {v} is not a string")))?;
    match s.strip_prefix("re:") {
        Some(p) => Regex::new(&format!("^(?:{p})"))
            .map(|re| IgnoreRule::Pattern(s.to_string(), re))
            .map_err(|e| cfg.err(field, format!("entry {s:?}: {e}"))),
        None => Ok(IgnoreRule::Name(s.to_string())),
    }
}

fn str_field<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn refuse_unknown<'a>(
    cfg: &ConfigJson,
    field: &str,
    keys: impl IntoIterator<Item = (&'a String, &'a Value)>,
    known: &[&str],
) -> Result<(), ModelError> {
    for (k, _) in keys {
        if !known.contains(&k.as_str()) {
            return Err(cfg.err(
                &format!("{field}.{k}"),
                "unknown field; refusing a scheme larder does not understand",
            ));
        }
    }
    Ok(())
}

/// gpt-oss's own `quantization_config` (`quant_method: mxfp4`, as
/// openai/gpt-oss-20b ships it): every MoE layer's experts
/// (`model.layers.N.mlp.experts`) ship MXFP4 (`*_blocks` + `*_scales`)
/// unless `modules_to_not_convert` names them; nothing else is ever
/// converted (transformers 5.24.0 `replace_with_mxfp4_linear` replaces
/// only `GptOssMLP` experts).
#[derive(Debug, Clone)]
pub struct Mxfp4Experts {
    /// `modules_to_not_convert` entries, each compiled to match a whole candidate.
    not_convert: Vec<(String, Regex)>,
}

const MXFP4_FIELD: &str = "quantization_config.modules_to_not_convert";

impl Mxfp4Experts {
    /// How experts module `module` (`model.layers.N.mlp.experts`) must ship.
    /// An entry matches as transformers' `should_convert_module` matches it:
    /// as a regex (so `*` after `.` matches any run) from the start of the
    /// name up to a module boundary (just before or just after a `.`, or
    /// the end), or as a literal suffix.
    pub fn rule(&self, module: &str) -> ModuleRule {
        let mut candidates: Vec<&str> = vec![module];
        for (i, _) in module.match_indices('.') {
            candidates.push(&module[..i]);
            candidates.push(&module[..=i]);
        }
        let hit = self
            .not_convert
            .iter()
            .find(|(text, re)| module.ends_with(text.as_str()) || candidates.iter().any(|c| re.is_match(c)));
        match hit {
            Some((text, _)) => ModuleRule::Plain {
                field: MXFP4_FIELD.into(),
                reason: format!("it matches the entry {text:?}"),
            },
            None => ModuleRule::Packed(PackedFormat::Mxfp4),
        }
    }
}

/// Reads gpt-oss's `quantization_config`: `None` without one; `quant_method`
/// must be `mxfp4` and the only other key `modules_to_not_convert` (a list
/// of strings); anything else is refused naming the field.
pub(crate) fn gpt_oss_mxfp4(cfg: &ConfigJson) -> Result<Option<Mxfp4Experts>, ModelError> {
    let Some(q) = cfg.raw("quantization_config") else { return Ok(None) };
    let f = "quantization_config";
    let obj = q.as_object().ok_or_else(|| cfg.err(f, "not an object"))?;
    refuse_unknown(cfg, f, obj, &["quant_method", "modules_to_not_convert"])?;
    match str_field(q, "quant_method") {
        Some("mxfp4") => {}
        other => {
            return Err(cfg.err(
                &format!("{f}.quant_method"),
                format!(
                    "{} is not supported for gpt_oss (supported: mxfp4, or no quantization_config)",
                    other.map_or("missing".to_string(), |m| format!("{m:?}"))
                ),
            ))
        }
    }
    let not_convert = match q.get("modules_to_not_convert") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                let s = v
                    .as_str()
                    .ok_or_else(|| cfg.err(MXFP4_FIELD, format!("entry {v} is not a string")))?;
                Regex::new(&format!("^(?:{s})$"))
                    .map(|re| (s.to_string(), re))
                    .map_err(|e| cfg.err(MXFP4_FIELD, format!("entry {s:?}: {e}")))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(cfg.err(MXFP4_FIELD, "not a list")),
    };
    Ok(Some(Mxfp4Experts { not_convert }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn experts_rule(not_convert: &[&str], module: &str) -> bool {
        let q = Mxfp4Experts {
            not_convert: not_convert
                .iter()
                .map(|s| (s.to_string(), Regex::new(&format!("^(?:{s})$")).unwrap()))
                .collect(),
        };
        matches!(q.rule(module), ModuleRule::Packed(PackedFormat::Mxfp4))
    }

    /// `modules_to_not_convert` matches as transformers 5.24.0's
    /// `should_convert_module`: regex up to a module boundary, or suffix.
    #[test]
    fn modules_to_not_convert_matches_as_transformers() {
        let m = "model.layers.11.mlp.experts";
        let hub = [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ];
        assert!(experts_rule(&hub, m));
        assert!(experts_rule(&[], m));
        for skip in [
            "model.layers.*.mlp.experts",
            "model.layers.11",
            "model.layers.",
            "mlp.experts",
            "model.layers.*",
        ] {
            assert!(!experts_rule(&[skip], m), "{skip}");
        }
        for keep in [
            "model.layers.1",
            "model.layers.11.mlp.exp",
            "experts.0",
            "model.layers.1.mlp.experts",
        ] {
            assert!(experts_rule(&[keep], m), "{keep}");
        }
    }
}
