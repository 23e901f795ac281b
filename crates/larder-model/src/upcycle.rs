//! Upcycling a dense checkpoint into a mixture-of-experts one (a demo and
//! test model, not a trained MoE): every routed expert of layer `l` is a
//! byte-for-byte copy of the dense MLP of layer `l`, and the router is random
//! (seeded, std `1/sqrt(hidden)`), so routing varies from token to token while
//! the output stays the dense model's: the top-k routing weights are
//! renormalised to sum to one, and a weighted sum of identical experts is the
//! dense MLP up to f32 rounding.
//!
//! Every other tensor (embeddings, attention, norms, LM head) is copied
//! byte-for-byte in its dtype, and the output config states every attention,
//! RoPE, norm and vocabulary setting explicitly (the MoE architectures'
//! defaults differ from Llama's, e.g. Mixtral's `rope_theta`). Before writing,
//! the output config is read back as a load reads it (its keys checked, then
//! the target architecture's reader) and its attention settings compared
//! with the source's.
//!
//! Layouts: [`UpcycleLayout::Mixtral`] from `llama` or `mistral` sources;
//! [`UpcycleLayout::Qwen3Moe`] from dense `qwen3` (its attention has the
//! per-head q/k norms a Llama lacks).
//!
//! Tensors stream one at a time (a layer's MLP is read once and written once
//! per expert); shards are written under `.partial` names and renamed when
//! complete, and `config.json` is written last, so an interrupted upcycle is
//! not loadable.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use larder_tensor::safetensors_write::{Header, KeyOrder, SafetensorsWriter, TensorHeader};
use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::checkpoint::Checkpoint;
use crate::config::ConfigJson;
use crate::error::ModelError;
use crate::spec::ModelSpec;

/// The MoE architecture an upcycled checkpoint takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum UpcycleLayout {
    /// `mixtral` (`block_sparse_moe`, experts `w1`/`w3`/`w2`), from llama or mistral.
    Mixtral,
    /// `qwen3_moe` (`mlp.experts.E.{gate,up,down}_proj`), from dense qwen3.
    Qwen3Moe,
}

impl UpcycleLayout {
    /// The `model_type` written.
    pub fn name(self) -> &'static str {
        match self {
            UpcycleLayout::Mixtral => "mixtral",
            UpcycleLayout::Qwen3Moe => "qwen3_moe",
        }
    }

    /// `mixtral` or `qwen3_moe`.
    pub fn parse(s: &str) -> Option<UpcycleLayout> {
        match s {
            "mixtral" => Some(UpcycleLayout::Mixtral),
            "qwen3_moe" => Some(UpcycleLayout::Qwen3Moe),
            _ => None,
        }
    }

    /// The layout a dense `model_type` upcycles to (`None`: not upcyclable).
    pub fn for_source(model_type: &str) -> Option<UpcycleLayout> {
        match model_type {
            "llama" | "mistral" => Some(UpcycleLayout::Mixtral),
            "qwen3" => Some(UpcycleLayout::Qwen3Moe),
            _ => None,
        }
    }
}

/// What to upcycle, and into what.
#[derive(Debug, Clone, Serialize)]
pub struct UpcycleSpec {
    /// A dense Hugging Face checkpoint folder.
    pub source: PathBuf,
    /// The output folder (must not hold a checkpoint yet).
    pub out: PathBuf,
    /// Routed experts per layer, at least 1.
    pub experts: usize,
    /// Experts chosen per token, 1 to `experts`.
    pub top_k: usize,
    pub layout: UpcycleLayout,
    /// Seed of the random routers.
    pub seed: u64,
}

/// What was written.
#[derive(Debug, Clone, Serialize)]
pub struct UpcycleReport {
    pub layers: usize,
    pub experts: usize,
    pub top_k: usize,
    /// Bytes of one routed expert (gate, up and down projections).
    pub expert_bytes: u64,
    /// Bytes of all routed experts.
    pub bank_bytes: u64,
    /// Bytes of every safetensors file written.
    pub total_bytes: u64,
    pub layout: &'static str,
    pub source_model_type: String,
}

/// Shards are closed once they reach this many bytes (one tensor is never split).
const SHARD_BYTES: u64 = 3 << 29;

/// Files copied from the source when present.
const AUX_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
];

/// The most routed experts per layer.
pub(crate) const MAX_EXPERTS: usize = 1 << 16;

/// Where an output tensor's bytes come from.
#[derive(Debug, Clone)]
enum Source {
    /// The source tensor of this name, byte for byte.
    Copy(String),
    /// The random router of this layer.
    Router(usize),
}

/// One tensor of the output.
#[derive(Debug, Clone)]
struct OutTensor {
    name: String,
    dtype: String,
    shape: Vec<usize>,
    bytes: u64,
    src: Source,
}

/// One output shard: its header and its tensors.
struct Shard {
    header: Header,
    tensors: Vec<OutTensor>,
}

impl Shard {
    fn file_bytes(&self) -> u64 {
        self.header.file_len()
    }
}

/// The dense MLP of every layer, as found in the source.
struct DenseMlp {
    layers: usize,
    hidden: usize,
    intermediate: usize,
    /// The MLP dtype (also the router's).
    dtype: String,
}

/// Upcycles `spec.source` into `spec.out`; `progress(done, total)` as bytes are written.
pub fn upcycle(spec: &UpcycleSpec, progress: &mut dyn FnMut(u64, u64)) -> Result<UpcycleReport, ModelError> {
    check_counts(spec)?;
    let cfg = ConfigJson::read(&spec.source)?;
    let model_type = check_source(&cfg, spec.layout)?;
    let ckpt = Checkpoint::open(&spec.source)?;
    let mlp = dense_mlp(&cfg, &ckpt, spec.layout)?;
    let out_cfg = output_config(&cfg, spec, &mlp)?;
    if spec.out.join("config.json").exists() {
        return Err(ModelError::config(
            &spec.out.join("config.json"),
            "out",
            "the output folder already holds a checkpoint; choose another output folder (--out)",
        ));
    }
    let plan = plan_tensors(&ckpt, spec, &mlp)?;
    let shards = shard(plan)?;
    let total: u64 = shards.iter().map(Shard::file_bytes).sum();
    let io = |p: &Path, e: std::io::Error| ModelError::Io {
        path: p.to_path_buf(),
        source: e,
    };
    std::fs::create_dir_all(&spec.out).map_err(|e| io(&spec.out, e))?;
    let n = shards.len();
    let mut weight_map = Map::new();
    let mut done = 0u64;
    let mut data_bytes = 0u64;
    for (i, s) in shards.iter().enumerate() {
        let name = format!("model-{:05}-of-{:05}.safetensors", i + 1, n);
        let path = spec.out.join(&name);
        let mut report = |b: u64| {
            done += b;
            progress(done, total);
        };
        write_shard(&path, s, &ckpt, spec, &mut report)?;
        for t in &s.tensors {
            weight_map.insert(t.name.clone(), Value::String(name.clone()));
            data_bytes += t.bytes;
        }
    }
    let index = json!({"metadata": {"total_size": data_bytes}, "weight_map": weight_map});
    write_atomic(&spec.out, "model.safetensors.index.json", &pretty(&index)?)?;
    for f in AUX_FILES {
        let from = spec.source.join(f);
        if from.is_file() {
            let bytes = std::fs::read(&from).map_err(|e| io(&from, e))?;
            write_atomic(&spec.out, f, &bytes)?;
        }
    }
    write_atomic(&spec.out, "config.json", &pretty(&out_cfg)?)?;
    let expert_bytes = 3 * (mlp.hidden * mlp.intermediate) as u64 * dtype_size(&mlp.dtype);
    Ok(UpcycleReport {
        layers: mlp.layers,
        experts: spec.experts,
        top_k: spec.top_k,
        expert_bytes,
        bank_bytes: expert_bytes * (mlp.layers * spec.experts) as u64,
        total_bytes: total,
        layout: spec.layout.name(),
        source_model_type: model_type,
    })
}

/// `experts` and `top_k` in range.
fn check_counts(spec: &UpcycleSpec) -> Result<(), ModelError> {
    let bad = |field: &str, message: String| ModelError::config(&spec.out, field, format!("cannot upcycle: {message}"));
    if spec.experts == 0 || spec.experts > MAX_EXPERTS {
        return Err(bad(
            "experts",
            format!("{} experts: use 1 to {MAX_EXPERTS} (--experts)", spec.experts),
        ));
    }
    if spec.top_k == 0 || spec.top_k > spec.experts {
        return Err(bad(
            "top_k",
            format!(
                "top_k {} must be between 1 and the number of experts ({}) (--top-k)",
                spec.top_k, spec.experts
            ),
        ));
    }
    Ok(())
}

/// Refuses sources whose upcycle would not compute the dense model exactly;
/// returns the source `model_type`.
fn check_source(cfg: &ConfigJson, layout: UpcycleLayout) -> Result<String, ModelError> {
    let model_type = cfg.opt_str("model_type")?.unwrap_or_default().to_string();
    let refuse = |field: &str, message: String| Err(cfg.err(field, format!("cannot upcycle: {message}")));
    match layout {
        UpcycleLayout::Mixtral if !matches!(model_type.as_str(), "llama" | "mistral") => {
            let hint = if model_type == "qwen3" {
                " (a dense qwen3 upcycles to the qwen3_moe layout)"
            } else {
                ""
            };
            return refuse(
                "model_type",
                format!("config.json model_type {model_type:?} is not a Llama-family dense model (llama, mistral){hint}"),
            );
        }
        UpcycleLayout::Qwen3Moe if matches!(model_type.as_str(), "llama" | "mistral") => {
            return refuse(
                "model_type",
                format!(
                    "a {model_type} model cannot take the qwen3_moe layout: qwen3_moe attention has q_norm/k_norm \
                     that a Llama model lacks, so the result would not be exact; use the mixtral layout"
                ),
            );
        }
        UpcycleLayout::Qwen3Moe if model_type != "qwen3" => {
            return refuse(
                "model_type",
                format!("config.json model_type {model_type:?} is not a dense Qwen3 model (qwen3)"),
            );
        }
        _ => {}
    }
    let act = cfg.opt_str("hidden_act")?.unwrap_or("silu");
    if act != "silu" && act != "swish" {
        return refuse(
            "hidden_act",
            format!("{act:?}: the experts are SwiGLU (silu) MLPs, so only a silu MLP can be copied into them"),
        );
    }
    if cfg.opt_bool("mlp_bias")?.unwrap_or(false) {
        return refuse(
            "mlp_bias",
            "true: MoE experts have no biases, so a dense MLP with biases cannot be copied into them".into(),
        );
    }
    if layout == UpcycleLayout::Mixtral && cfg.opt_bool("attention_bias")?.unwrap_or(false) {
        return refuse(
            "attention_bias",
            "true: Mixtral attention has no q/k/v/o biases, so the upcycled model would not compute the same attention".into(),
        );
    }
    if cfg.raw("num_experts").is_some() || cfg.raw("num_local_experts").is_some() {
        return refuse(
            "num_experts",
            "the source already has experts; upcycling needs a dense model".into(),
        );
    }
    Ok(model_type)
}

fn mlp_names(l: usize) -> [String; 3] {
    ["gate_proj", "up_proj", "down_proj"].map(|p| format!("model.layers.{l}.mlp.{p}.weight"))
}

/// Finds and checks every layer's dense MLP (shapes, one float dtype).
fn dense_mlp(cfg: &ConfigJson, ckpt: &Checkpoint, layout: UpcycleLayout) -> Result<DenseMlp, ModelError> {
    let layers = cfg.num_layers()?;
    let (hidden, ..) = cfg.attention_dims()?;
    let intermediate = cfg.usize("intermediate_size")?;
    if layout == UpcycleLayout::Qwen3Moe && !ckpt.has("model.layers.0.self_attn.q_norm.weight") {
        return Err(cfg.err(
            "model_type",
            "cannot upcycle: tensor `model.layers.0.self_attn.q_norm.weight` is missing; not a Qwen3 checkpoint",
        ));
    }
    let mut dtype = String::new();
    for l in 0..layers {
        let names = mlp_names(l);
        let shapes = [[intermediate, hidden], [intermediate, hidden], [hidden, intermediate]];
        for (name, want) in names.iter().zip(shapes) {
            let info = ckpt.tensor_info(name)?;
            if info.shape != want {
                return Err(ModelError::TensorShape {
                    name: name.clone(),
                    path: ckpt.file_paths()[info.file].clone(),
                    got: info.shape,
                    expected: want.to_vec(),
                });
            }
            if dtype.is_empty() {
                dtype = info.dtype.clone();
            }
            if info.dtype != dtype || !matches!(info.dtype.as_str(), "F32" | "F16" | "BF16") {
                return Err(ModelError::TensorDType {
                    name: name.clone(),
                    path: ckpt.file_paths()[info.file].clone(),
                    dtype: format!("{} (the MLP weights must share one of F32, F16, BF16)", info.dtype),
                });
            }
        }
        let prefix = format!("model.layers.{l}.mlp.");
        if let Some(extra) = ckpt
            .names()
            .into_iter()
            .find(|n| n.starts_with(&prefix) && !names.iter().any(|m| m == n))
        {
            return Err(cfg.err(
                "mlp_bias",
                format!("cannot upcycle: tensor `{extra}` is not part of a SwiGLU MLP (gate/up/down weights only)"),
            ));
        }
    }
    Ok(DenseMlp {
        layers,
        hidden,
        intermediate,
        dtype,
    })
}

/// The output config.json: the source's, every attention setting explicit,
/// the MoE fields of the layout added; checked against the source by reading
/// both back.
fn output_config(cfg: &ConfigJson, spec: &UpcycleSpec, mlp: &DenseMlp) -> Result<Value, ModelError> {
    let Value::Object(src) = &cfg.value else {
        return Err(cfg.err("config.json", "top level is not an object"));
    };
    let mut out = src.clone();
    let (_, heads, kv_heads, head_dim) = cfg.attention_dims()?;
    let source_type = cfg.opt_str("model_type")?.unwrap_or_default();
    if source_type == "qwen3" && cfg.opt_usize("head_dim")?.is_none() {
        return Err(cfg.err(
            "head_dim",
            "cannot upcycle: missing, and Qwen3's default differs from hidden_size / num_attention_heads; state it",
        ));
    }
    let theta_in_params = cfg
        .raw("rope_parameters")
        .and_then(|p| p.get("rope_theta"))
        .is_some_and(Value::is_number);
    let (default_theta, default_max_pos) = if source_type == "qwen3" {
        (10000.0, 32768)
    } else {
        (10000.0, 2048)
    };
    if !theta_in_params {
        out.insert("rope_theta".into(), json!(cfg.opt_f64("rope_theta")?.unwrap_or(default_theta)));
    }
    let max_pos = cfg.opt_usize("max_position_embeddings")?.unwrap_or(default_max_pos);
    let explicit = [
        ("max_position_embeddings", json!(max_pos)),
        ("num_attention_heads", json!(heads)),
        ("num_key_value_heads", json!(kv_heads)),
        ("head_dim", json!(head_dim)),
        ("rms_norm_eps", json!(cfg.opt_f64("rms_norm_eps")?.unwrap_or(1e-6))),
        ("tie_word_embeddings", json!(cfg.opt_bool("tie_word_embeddings")?.unwrap_or(false))),
        ("attention_bias", json!(cfg.opt_bool("attention_bias")?.unwrap_or(false))),
        ("hidden_act", json!("silu")),
        ("num_experts_per_tok", json!(spec.top_k)),
        ("intermediate_size", json!(mlp.intermediate)),
    ];
    for (k, v) in explicit {
        out.insert(k.into(), v);
    }
    out.remove("mlp_bias");
    let arch = match spec.layout {
        UpcycleLayout::Mixtral => {
            if source_type == "llama" {
                out.insert("sliding_window".into(), Value::Null);
            }
            out.insert("num_local_experts".into(), json!(spec.experts));
            "MixtralForCausalLM"
        }
        UpcycleLayout::Qwen3Moe => {
            for (k, v) in [
                ("num_experts", json!(spec.experts)),
                ("moe_intermediate_size", json!(mlp.intermediate)),
                ("norm_topk_prob", json!(true)),
                ("decoder_sparse_step", json!(1)),
                ("mlp_only_layers", json!([])),
            ] {
                out.insert(k.into(), v);
            }
            "Qwen3MoeForCausalLM"
        }
    };
    out.insert("model_type".into(), json!(spec.layout.name()));
    out.insert("architectures".into(), json!([arch]));
    out.insert(
        "larder_upcycle".into(),
        json!({"source_model_type": source_type, "seed": spec.seed, "experts": spec.experts,
               "top_k": spec.top_k, "experts_are": "copies of the dense MLP"}),
    );
    let out = Value::Object(out);
    check_same_attention(cfg, &out)?;
    Ok(out)
}

/// Reads the output config with the target's reader and compares every
/// attention setting with the source's (read as a dense model would be).
fn check_same_attention(cfg: &ConfigJson, out: &Value) -> Result<(), ModelError> {
    let out_cfg = ConfigJson {
        path: cfg.path.clone(),
        value: out.clone(),
    };
    // Read as a load would read it: every key checked (docs/architectures.md).
    let got = crate::arch::spec_from_config(&out_cfg)?;
    let want = match cfg.opt_str("model_type")? {
        Some("llama") => crate::arch::llama::spec(cfg)?,
        Some("mistral") => crate::arch::llama::spec_mistral(cfg)?,
        // larder reads no dense qwen3; its reading is qwen3_moe's without experts.
        _ => {
            let mut dense = cfg.value.clone();
            dense["model_type"] = json!("qwen3_moe");
            crate::arch::qwen3_moe::spec(&ConfigJson {
                path: cfg.path.clone(),
                value: dense,
            })?
        }
    };
    let key = |s: &ModelSpec| {
        let windows: Vec<Option<usize>> = s.layers.iter().map(|l| l.sliding_window).collect();
        format!(
            "{} {} {} {} {} {} {:?} {} {} {} {} {:?}",
            s.hidden_size,
            s.vocab_size,
            s.num_heads,
            s.num_kv_heads,
            s.head_dim,
            s.rms_norm_eps,
            s.rope,
            s.max_position_embeddings,
            s.tie_word_embeddings,
            s.qkv_bias,
            s.o_bias,
            windows
        )
    };
    if key(&got) != key(&want) {
        return Err(cfg.err(
            "model_type",
            format!(
                "cannot upcycle: the {} config would not reproduce the source's attention \
                 (source: {}, upcycled: {}); please report this",
                got.model_type,
                key(&want),
                key(&got)
            ),
        ));
    }
    Ok(())
}

/// Every output tensor, in file order: non-layer tensors, then per layer its
/// non-MLP tensors, the router and the experts.
fn plan_tensors(ckpt: &Checkpoint, spec: &UpcycleSpec, mlp: &DenseMlp) -> Result<Vec<OutTensor>, ModelError> {
    let mut by_layer: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
    let mut top = Vec::new();
    for name in ckpt.names() {
        let layer = name
            .strip_prefix("model.layers.")
            .and_then(|r| r.split('.').next())
            .and_then(|l| l.parse::<usize>().ok());
        match layer {
            Some(l) if l < mlp.layers => by_layer.entry(l).or_default().push(name),
            Some(l) => {
                return Err(ModelError::config(
                    &spec.source.join("config.json"),
                    "num_hidden_layers",
                    format!("cannot upcycle: tensor `{name}` is in layer {l}, beyond the {} layers", mlp.layers),
                ))
            }
            None => top.push(name),
        }
    }
    let copy = |name: &str, out_name: String| -> Result<OutTensor, ModelError> {
        let info = ckpt.tensor_info(name)?;
        Ok(OutTensor {
            name: out_name,
            dtype: info.dtype,
            shape: info.shape,
            bytes: info.len,
            src: Source::Copy(name.to_string()),
        })
    };
    let mut plan = Vec::new();
    for name in top {
        plan.push(copy(name, name.to_string())?);
    }
    let (block, router, proj) = match spec.layout {
        UpcycleLayout::Mixtral => ("block_sparse_moe", "gate", ["w1", "w3", "w2"]),
        UpcycleLayout::Qwen3Moe => ("mlp", "gate", ["gate_proj", "up_proj", "down_proj"]),
    };
    let size = dtype_size(&mlp.dtype);
    for (l, names) in by_layer {
        let dense = mlp_names(l);
        for name in names.iter().filter(|n| !dense.iter().any(|d| d == *n)) {
            plan.push(copy(name, name.to_string())?);
        }
        let b = format!("model.layers.{l}.{block}");
        plan.push(OutTensor {
            name: format!("{b}.{router}.weight"),
            dtype: mlp.dtype.clone(),
            shape: vec![spec.experts, mlp.hidden],
            bytes: (spec.experts * mlp.hidden) as u64 * size,
            src: Source::Router(l),
        });
        for e in 0..spec.experts {
            for (p, src) in proj.iter().zip(&dense) {
                plan.push(copy(src, format!("{b}.experts.{e}.{p}.weight"))?);
            }
        }
    }
    Ok(plan)
}

/// Splits the plan into shards of about [`SHARD_BYTES`] and builds their headers.
fn shard(plan: Vec<OutTensor>) -> Result<Vec<Shard>, ModelError> {
    let mut groups: Vec<Vec<OutTensor>> = vec![Vec::new()];
    let mut size = 0u64;
    for t in plan {
        if size > 0 && size + t.bytes > SHARD_BYTES {
            groups.push(Vec::new());
            size = 0;
        }
        size += t.bytes;
        groups.last_mut().expect("one group at least").push(t);
    }
    groups
        .into_iter()
        .map(|tensors| {
            let list: Vec<TensorHeader> = tensors
                .iter()
                .map(|t| TensorHeader {
                    name: t.name.clone(),
                    dtype: t.dtype.clone(),
                    shape: t.shape.clone(),
                    len: t.bytes,
                })
                .collect();
            let header = Header::new(&list, &[("format", "pt")], KeyOrder::Sorted)?;
            Ok(Shard { header, tensors })
        })
        .collect()
}

/// Writes one shard at `path` (via `path.partial`); a layer's MLP tensors
/// are read once for all its experts.
fn write_shard(path: &Path, shard: &Shard, ckpt: &Checkpoint, spec: &UpcycleSpec, progress: &mut dyn FnMut(u64)) -> Result<(), ModelError> {
    let mut f = SafetensorsWriter::create(path, &shard.header)?;
    progress(shard.header.data_start());
    // The source tensors last read: a layer's three MLP weights stay here while
    // its experts are written.
    let mut recent: Vec<(String, Vec<u8>)> = Vec::new();
    for t in &shard.tensors {
        let bytes = match &t.src {
            Source::Router(l) => router_bytes(spec.seed, *l, t.shape[0], t.shape[1], &t.dtype),
            Source::Copy(name) => {
                if let Some((_, b)) = recent.iter().find(|(n, _)| n == name) {
                    f.write(b)?;
                    progress(b.len() as u64);
                    continue;
                }
                let b = ckpt.tensor_bytes(name)?;
                if name.contains(".mlp.") {
                    if recent.len() == 3 {
                        recent.remove(0);
                    }
                    recent.push((name.clone(), b));
                    let b = &recent.last().expect("just pushed").1;
                    f.write(b)?;
                    progress(b.len() as u64);
                    continue;
                }
                b
            }
        };
        if bytes.len() as u64 != t.bytes {
            return Err(ModelError::Experts(format!(
                "tensor `{}`: {} bytes, expected {} (the source changed while upcycling?)",
                t.name,
                bytes.len(),
                t.bytes
            )));
        }
        f.write(&bytes)?;
        progress(bytes.len() as u64);
    }
    f.finish()?.commit()?;
    Ok(())
}

/// The router of layer `l`: `[experts, hidden]`, uniform with std
/// `1/sqrt(hidden)`, seeded by `(seed, l)`, encoded in `dtype`.
fn router_bytes(seed: u64, l: usize, experts: usize, hidden: usize, dtype: &str) -> Vec<u8> {
    let mut s = seed ^ (l as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let scale = 1.0 / (hidden as f32).sqrt();
    let mut out = Vec::with_capacity(experts * hidden * dtype_size(dtype) as usize);
    for _ in 0..experts * hidden {
        let v = crate::synth::unit(&mut s) * scale;
        match dtype {
            "BF16" => out.extend_from_slice(&bf16_bits(v).to_le_bytes()),
            "F16" => out.extend_from_slice(&f16_bits(v).to_le_bytes()),
            _ => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
    out
}

/// Bytes per element of the float dtypes the MLP may have.
fn dtype_size(dtype: &str) -> u64 {
    if dtype == "F32" {
        4
    } else {
        2
    }
}

/// f32 to bf16, rounding to nearest even (finite inputs).
fn bf16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// f32 to f16, rounding to nearest even, for the router's small finite values
/// (subnormal results flush to zero; nothing here overflows).
fn f16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    if exp <= 0 {
        return sign;
    }
    if exp >= 31 {
        return sign | 0x7c00;
    }
    let mant = b & 0x7f_ffff;
    let half = ((exp as u32) << 10) | (mant >> 13);
    let rest = mant & 0x1fff;
    let round = u32::from(rest > 0x1000 || (rest == 0x1000 && half & 1 == 1));
    sign | (half + round) as u16
}

fn pretty(v: &Value) -> Result<Vec<u8>, ModelError> {
    serde_json::to_vec_pretty(v).map_err(|e| ModelError::Experts(e.to_string()))
}

/// Writes `dir/name` under a temporary name, then renames it.
fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), ModelError> {
    let (path, tmp) = (dir.join(name), dir.join(format!("{name}.partial")));
    let io = |p: &Path, e: std::io::Error| ModelError::Io {
        path: p.to_path_buf(),
        source: e,
    };
    let mut f = std::fs::File::create(&tmp).map_err(|e| io(&tmp, e))?;
    f.write_all(bytes).and_then(|_| f.sync_all()).map_err(|e| io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_precision_encodings_round_to_nearest() {
        assert_eq!(bf16_bits(1.0), 0x3f80);
        assert_eq!(f16_bits(1.0), 0x3c00);
        assert_eq!(f16_bits(-0.5), 0xb800);
        assert_eq!(f16_bits(0.1), 0x2e66);
        assert_eq!(bf16_bits(0.1), 0x3dcd);
    }

    #[test]
    fn routers_are_seeded() {
        assert_eq!(router_bytes(7, 0, 4, 8, "F32"), router_bytes(7, 0, 4, 8, "F32"));
        assert_ne!(router_bytes(7, 0, 4, 8, "F32"), router_bytes(7, 1, 4, 8, "F32"));
        assert_ne!(router_bytes(7, 0, 4, 8, "F32"), router_bytes(8, 0, 4, 8, "F32"));
        assert_eq!(router_bytes(7, 0, 4, 8, "BF16").len(), 64);
    }
}
