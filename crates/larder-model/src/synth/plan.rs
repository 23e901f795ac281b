//! The tensors of a synthetic checkpoint. Names, shapes and the dtypes
//! allowed are not declared here: they are learned from a [`Recorder`] run of
//! the architecture's own loader ([`DecoderModel::load`]) over the synth's
//! config.json, so a tensor is declared once, where the model reads it. This
//! module owns only how each value is drawn ([`Init`], by role and name) and
//! the dtype picked among those allowed (bf16, except what transformers keeps
//! in f32 when it saves a bf16 Kimi Linear: `A_log`, `dt_bias`, the router
//! and its correction bias; Kimi K3 also ships its KDA conv taps and
//! `o_norm` in f32, and `A_log` padded with zeros to a multiple of 64
//! heads). See the module doc of [`super`] for the scales.
//!
//! 4-bit experts: codes are uniform random bytes (every nibble equally
//! likely); scales are set so the dequantized weights have the std the bf16
//! experts would have. INT4 codes q = u - 8 in [-8, 7] have rms
//! sqrt(21.5) = 4.64, so the bf16 scale is std / 4.64 (times 2^U(-0.5, 0.5)
//! per group, so groups differ); e2m1 codes have rms sqrt(8.5625) = 2.93,
//! so the e8m0 exponent is round(log2(std / 2.93)) plus a per-block step of
//! -1, 0 or +1.
//!
//! Shard 0 holds every tensor outside `model.layers.N.` (embeddings, final
//! norm, LM head), shard `N + 1` layer `N`'s, each in the order the loader
//! reads them; values are seeded by the tensor's name (see [`name_seed`]).
//! Kimi K3 names the text model's tensors under `language_model.` and adds
//! a last shard: the vision tower's ([`super::kimi_k3::vision_tensors`]).

use std::path::Path;

use super::{ExpertsFormat, SynthSpec};
use crate::arch::spec_from_config;
use crate::assemble::PartKind;
use crate::config::ConfigJson;
use crate::error::ModelError;
use crate::source::{RecordedRole, RecordedTensor};
use crate::{DecoderModel, Recorder};

/// One tensor to generate.
pub(super) struct TensorPlan {
    pub name: String,
    pub shape: Vec<usize>,
    pub kind: Init,
    pub dtype: Dtype,
    /// Seeds the tensor's values: a hash of its name, so values do not
    /// depend on where the loader happens to read it.
    pub seed: u64,
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug)]
pub(super) enum Init {
    /// Uniform with this std, seeded by the tensor's position.
    Uniform(f32),
    Ones,
    Zeros,
    /// Every element this value.
    Const(f32),
    /// Post-attention norm weights of layer `.1` drifting by `.0`
    /// (`--routing-drift`, see `write::drift_row`), 0 on the key columns
    /// (`--routing-locality`: routers do not see the key).
    NormSpread(f32, usize),
    Embedding,
    LmHead,
    Router,
    /// Uniform random bytes: 4-bit codes (INT4 words or e2m1 pairs).
    Codes,
    /// bf16 INT4 group scales for dequantized weights of this std.
    Int4Scale(f32),
    /// e8m0 scale bytes for dequantized e2m1 weights of this std.
    E8m0(f32),
    /// The i32 pair `[rows, cols]` (`weight_shape`).
    Shape(usize, usize),
}

/// The stored element type.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Dtype {
    Bf16,
    F32,
    I32,
    U8,
}

impl Dtype {
    pub(super) fn size(self) -> usize {
        match self {
            Dtype::U8 => 1,
            Dtype::Bf16 => 2,
            Dtype::F32 | Dtype::I32 => 4,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "BF16",
            Dtype::F32 => "F32",
            Dtype::I32 => "I32",
            Dtype::U8 => "U8",
        }
    }

    fn parse(name: &str) -> Option<Dtype> {
        [Dtype::Bf16, Dtype::F32, Dtype::I32, Dtype::U8]
            .into_iter()
            .find(|d| d.name() == name)
    }
}

impl TensorPlan {
    pub(super) fn bytes(&self) -> u64 {
        (self.shape.iter().product::<usize>() * self.dtype.size()) as u64
    }
}

/// Output projections: small, so the residual stays dominated by the current token.
pub(super) const SMALL: f32 = 0.002;
/// Input projections.
pub(super) const PROJ: f32 = 0.02;

/// Every tensor the synth writes, by shard (see the module doc), learned by
/// recording the architecture's loader over `spec`'s config.json. `out` is
/// where that config.json will be (errors name it).
pub(super) fn shards(spec: &SynthSpec, out: &Path) -> Result<Vec<Vec<TensorPlan>>, ModelError> {
    let mut shards: Vec<Vec<TensorPlan>> = (0..=spec.layers).map(|_| Vec::new()).collect();
    for t in record(spec, out)? {
        let mut plan = plan_tensor(spec, &t)?;
        if spec.k3.is_some() {
            plan.name = format!("{WRAPPED}{}", plan.name);
            plan.seed = name_seed(&plan.name);
        }
        let shard = layer_of(&t.name).map_or(0, |l| l + 1);
        let slot = shards
            .get_mut(shard)
            .ok_or_else(|| ModelError::Source(format!("recorded tensor `{}` is past the {} layers", t.name, spec.layers)))?;
        slot.push(plan);
    }
    if spec.k3.is_some() {
        let bf16 = |name: String, shape: Vec<usize>| TensorPlan {
            kind: if name.ends_with("norm.weight") {
                Init::Ones
            } else {
                Init::Uniform(PROJ)
            },
            dtype: Dtype::Bf16,
            seed: name_seed(&name),
            name,
            shape,
        };
        // Layer 0's attention residual ships but is never read (its input
        // has no block to mix yet), so the loader does not ask for it.
        if let Some(layer0) = shards.get_mut(1) {
            for (part, shape) in [("norm", vec![spec.hidden]), ("proj", vec![1, spec.hidden])] {
                layer0.push(bf16(format!("{WRAPPED}model.layers.0.self_attention_res_{part}.weight"), shape));
            }
        }
        let vision = super::kimi_k3::vision_tensors(spec);
        shards.push(vision.into_iter().map(|(name, shape)| bf16(name.to_string(), shape)).collect());
    }
    Ok(shards)
}

/// The prefix of a Kimi K3 checkpoint's text-model tensors.
const WRAPPED: &str = "language_model.";

/// Every tensor the loader of `spec`'s architecture reads, in order.
fn record(spec: &SynthSpec, out: &Path) -> Result<Vec<RecordedTensor>, ModelError> {
    let cfg = ConfigJson {
        path: out.join("config.json"),
        value: spec.config(),
    };
    let model = spec_from_config(&cfg)?;
    // The optional tensors a checkpoint made from this config ships.
    let recorder = Recorder::for_config();
    DecoderModel::load(model, &recorder, None)?;
    Ok(recorder.tensors())
}

/// `N` of a `model.layers.N.` name.
fn layer_of(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("model.layers.")?;
    rest.split('.').next()?.parse().ok()
}

/// The dtype, shape and values of recorded tensor `t`.
fn plan_tensor(spec: &SynthSpec, t: &RecordedTensor) -> Result<TensorPlan, ModelError> {
    let name = t.name.as_str();
    let kind = init(spec, t);
    let k3 = spec.k3.is_some();
    let wants_f32 = spec.kda.is_some()
        && (name.ends_with(".A_log")
            || name.ends_with(".dt_bias")
            || name.ends_with(".gate.e_score_correction_bias")
            || (t.role == RecordedRole::Param && name.ends_with(".gate.weight"))
            || (k3 && (name.contains("_conv1d.") || name.ends_with(".o_norm.weight"))));
    let pick = if wants_f32 { "F32" } else { "BF16" };
    let dtype = match t.dtypes.contains(&pick) {
        true => Some(pick),
        false => t.dtypes.first().copied(),
    }
    .and_then(Dtype::parse)
    .ok_or_else(|| ModelError::Source(format!("tensor `{name}`: no dtype synth writes among {:?}", t.dtypes)))?;
    let mut shape = t
        .shapes
        .first()
        .ok_or_else(|| ModelError::Source(format!("tensor `{name}` recorded without a shape")))?
        .clone();
    if let Some(k) = spec.kda.as_ref().filter(|_| k3 && name.ends_with(".A_log")) {
        // As released: one value per head, zero-padded (written as zeros, see `init`).
        shape = vec![super::kimi_k3::a_log_len(k.heads)];
    }
    Ok(TensorPlan {
        name: t.name.clone(),
        shape,
        kind,
        dtype,
        seed: name_seed(name),
    })
}

/// FNV-1a of `name`: a seed stable under any reordering of the tensors.
fn name_seed(name: &str) -> u64 {
    name.bytes()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// How recorded tensor `t`'s values are drawn.
fn init(spec: &SynthSpec, t: &RecordedTensor) -> Init {
    let name = t.name.as_str();
    let drift = spec.knobs().drift as f32;
    let std = std_of(name);
    match name {
        "model.embed_tokens.weight" => return Init::Embedding,
        "lm_head.weight" => return Init::LmHead,
        _ => {}
    }
    if let RecordedRole::Linear { part, rows, cols, .. } = t.role {
        return match (part, spec.experts_format) {
            (PartKind::Codes, _) if name.ends_with(".weight_packed") => Init::Codes,
            (PartKind::Codes, _) => Init::Uniform(std),
            (PartKind::Scales, ExpertsFormat::Mxfp4) => Init::E8m0(std),
            (PartKind::Scales, _) => Init::Int4Scale(std),
            (PartKind::Shape, _) => Init::Shape(rows, cols),
        };
    }
    match name {
        _ if t.role == RecordedRole::Param => Init::Router,
        _ if (drift > 0.0 || spec.knobs().locality > 0.0) && name.ends_with(".post_attention_layernorm.weight") => {
            Init::NormSpread(drift, layer_of(name).unwrap_or(0))
        }
        _ if name.ends_with("norm.weight") => Init::Ones,
        _ if name.ends_with(".A_log") || name.ends_with(".e_score_correction_bias") => Init::Zeros,
        _ if name.ends_with(".mlp.router.bias") => Init::Zeros,
        // `A_log` = 0 and `dt_bias` = -2 give every KDA channel a decay of
        // exp(-softplus(-2)) = 0.88 per token (plus the small low-rank term),
        // so the state remembers a few tokens.
        _ if name.ends_with(".dt_bias") => Init::Const(-2.0),
        // Conv taps and gpt-oss's per-head sink logits, spread around 0.
        _ if name.contains("_conv1d.") || name.ends_with(".sinks") => Init::Uniform(0.5),
        _ if name.ends_with("_blocks") => Init::Codes,
        _ if name.ends_with("_scales") => Init::E8m0(std),
        _ => Init::Uniform(std),
    }
}

/// [`SMALL`] for output projections (attention `o_proj`, every `down_proj`,
/// Kimi experts' `w2`, K3's latent `routed_expert_up_proj`, which follows
/// the latent norm), their biases and scales; [`PROJ`] for the rest.
fn std_of(name: &str) -> f32 {
    let output =
        name.contains(".o_proj.") || name.contains(".down_proj") || name.contains(".w2.") || name.contains(".routed_expert_up_proj.");
    if output {
        SMALL
    } else {
        PROJ
    }
}
