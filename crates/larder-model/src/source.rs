//! Where loaders get weights: the [`WeightSource`] trait. Every loader
//! ([`DecoderModel::load`](crate::DecoderModel::load) and the blocks it
//! calls) asks for each tensor once, by name and shape, through one required
//! method ([`WeightSource::load`]) answering a [`WeightRequest`]; the provided
//! methods (`matrix`, `param_matrix`, `vector`, ...) are the convenient API
//! the loaders use, the way `AsyncReadExt` sits on `AsyncRead`.
//!
//! Implementations: the [`Checkpoint`] (safetensors files, answered by its
//! existing methods, no behaviour change) and the [`Recorder`] (no bytes:
//! learns which tensors an architecture reads, with their shipped names,
//! dtypes, shapes and roles), and the [`RandomSource`] (deterministic random
//! weights: a model from a spec alone). So tensor names and shapes are
//! declared once, in the loaders, which see a source through a
//! prefix-scoped [`WeightView`] (`view.pp("self_attn").linear("q_proj", ..)`)
//! and never format a full tensor name.

pub(crate) mod random;
pub(crate) mod recorder;
pub(crate) mod view;

use std::path::PathBuf;

use larder_tensor::{SharedBytes, WeightMatrix};

use crate::checkpoint::Checkpoint;
use crate::error::ModelError;
use crate::spec::ModelSpec;

pub use random::RandomSource;
pub use recorder::{RecordedRole, RecordedTensor, Recorder};
pub use view::{TensorPath, WeightView};

/// What a loader asks a [`WeightSource`] for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightRequest<'a> {
    /// A linear layer's `[rows, cols]` weight `name` (`X.weight`) in the
    /// format the checkpoint ships it (dense, fp8, compressed-tensors packed;
    /// see [`crate::assemble`]).
    Linear { name: &'a str, rows: usize, cols: usize },
    /// A 2-D parameter that is not a linear layer's weight (embedding, MoE
    /// router), in its shipped float dtype; never packed.
    Param { name: &'a str, rows: usize, cols: usize },
    /// A small tensor widened to f32, stored in one of `shapes` (norm
    /// weights, biases, conv taps, gate parameters).
    F32 { name: &'a str, shapes: &'a [&'a [usize]] },
    /// Whether tensor `name` ships (optional tensors).
    Present { name: &'a str },
    /// The stored shape of tensor `name`, where the source knows it (for
    /// errors that blame a config field before a weight is taken).
    Shape { name: &'a str },
    /// A whole tensor as shipped, with its dtype and shape (gpt-oss fused
    /// experts, sliced by the caller). `dtypes` and `shape` are what the
    /// caller accepts: it checks the answer itself; a source that has no
    /// tensors (the recorder) answers with them.
    Raw {
        name: &'a str,
        dtypes: &'a [&'static str],
        shape: &'a [usize],
    },
}

impl WeightRequest<'_> {
    /// The tensor (or weight) name asked for.
    pub fn name(&self) -> &str {
        match self {
            WeightRequest::Linear { name, .. }
            | WeightRequest::Param { name, .. }
            | WeightRequest::F32 { name, .. }
            | WeightRequest::Present { name }
            | WeightRequest::Shape { name }
            | WeightRequest::Raw { name, .. } => name,
        }
    }
}

/// Which routed expert the tensors a loader asks for next belong to (see
/// [`WeightSource::tag_expert`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertTag {
    pub layer: usize,
    /// The expert; `None` for a fused per-layer tensor holding every
    /// expert of the layer (gpt-oss), whose slice `[e]` is expert `e`'s.
    pub expert: Option<usize>,
    /// The projection or fused part the tensors are (`gate`, `up`, `down`;
    /// gpt-oss: `gate_up`, `gate_up.scale`, `down.bias`, ...): the role of
    /// their codes in a store record.
    pub role: &'static str,
}

/// Runs `load` with the requests it makes tagged `tag` (routed-expert
/// tensors), untagging afterwards whatever `load` returns.
pub(crate) fn with_expert_tag<T>(weights: &dyn WeightSource, tag: ExpertTag, load: impl FnOnce() -> T) -> T {
    weights.tag_expert(Some(tag));
    let out = load();
    weights.tag_expert(None);
    out
}

/// A whole shipped tensor: its safetensors dtype, shape and bytes.
#[derive(Debug, Clone)]
pub struct RawTensor {
    pub dtype: String,
    pub shape: Vec<usize>,
    pub bytes: SharedBytes,
}

/// The answer to a [`WeightRequest`], variant for variant.
#[derive(Debug)]
pub enum Weight {
    /// For `Linear` and `Param`.
    Matrix(WeightMatrix),
    /// For `F32`: the values and which of the accepted shapes they have.
    F32 { values: Vec<f32>, shape: usize },
    /// For `Present`.
    Present(bool),
    /// For `Shape`: `None` when the source does not know (absent, or a
    /// source without stored tensors).
    Shape(Option<Vec<usize>>),
    /// For `Raw`.
    Raw(RawTensor),
}

/// Where weights come from. One required method, [`load`](Self::load);
/// the rest is provided on top of it.
pub trait WeightSource {
    /// Answers `request` with the matching [`Weight`] variant.
    fn load(&self, request: &WeightRequest<'_>) -> Result<Weight, ModelError>;

    /// Told the model's spec before anything is asked (a checkpoint takes
    /// its fp8 block size and compressed-tensors scheme from it).
    fn configure(&self, _spec: &ModelSpec) {}

    /// Whether every answer is a zero-filled placeholder (the [`Recorder`]):
    /// a loader may then skip rearranging bytes (a transpose of zeros is the
    /// same zeros), so a recorded load holds no weight-sized buffers.
    fn zero_placeholders(&self) -> bool {
        false
    }

    /// Told that the requests that follow read routed expert `tag` (until
    /// told `None`): the [`Recorder`] tags what it records, so pack and
    /// direct streaming learn which tensors are routed experts from the
    /// loaders. Use `with_expert_tag`. Default: ignored.
    fn tag_expert(&self, _tag: Option<ExpertTag>) {}

    /// The config.json that errors about a config field point at.
    fn config_path(&self) -> PathBuf {
        PathBuf::from("config.json")
    }

    /// A linear layer's `[rows, cols]` weight in its shipped format.
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<WeightMatrix, ModelError> {
        expect_matrix(self.load(&WeightRequest::Linear { name, rows, cols })?, name)
    }

    /// A 2-D parameter that is not a linear layer's weight (embedding, router).
    fn param_matrix(&self, name: &str, rows: usize, cols: usize) -> Result<WeightMatrix, ModelError> {
        expect_matrix(self.load(&WeightRequest::Param { name, rows, cols })?, name)
    }

    /// A tensor of exactly `shape`, widened to f32 in row-major order.
    fn tensor_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        Ok(self.tensor_f32_any(name, &[shape])?.0)
    }

    /// A tensor stored in one of `shapes`, widened to f32, with the index
    /// of the shape it has; otherwise [`ModelError::TensorShape`] against
    /// the first.
    fn tensor_f32_any(&self, name: &str, shapes: &[&[usize]]) -> Result<(Vec<f32>, usize), ModelError> {
        match self.load(&WeightRequest::F32 { name, shapes })? {
            Weight::F32 { values, shape } => Ok((values, shape)),
            other => Err(wrong_answer(name, "f32 values", &other)),
        }
    }

    /// A 1-D tensor of length `len`, widened to f32 (norm weights, biases).
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        self.tensor_f32(name, &[len])
    }

    /// Whether a tensor of this name ships.
    fn has(&self, name: &str) -> Result<bool, ModelError> {
        match self.load(&WeightRequest::Present { name })? {
            Weight::Present(p) => Ok(p),
            other => Err(wrong_answer(name, "presence", &other)),
        }
    }

    /// An optional 1-D tensor: `None` when absent, an error when present but wrong.
    fn optional_vector(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>, ModelError> {
        match self.has(name)? {
            true => self.vector(name, len).map(Some),
            false => Ok(None),
        }
    }

    /// The stored shape of `name`, where the source knows it.
    fn stored_shape(&self, name: &str) -> Result<Option<Vec<usize>>, ModelError> {
        match self.load(&WeightRequest::Shape { name })? {
            Weight::Shape(s) => Ok(s),
            other => Err(wrong_answer(name, "a shape", &other)),
        }
    }

    /// A whole tensor as shipped (the caller checks dtype and shape against
    /// `dtypes` and `shape`).
    fn raw_tensor(&self, name: &str, dtypes: &[&'static str], shape: &[usize]) -> Result<RawTensor, ModelError> {
        match self.load(&WeightRequest::Raw { name, dtypes, shape })? {
            Weight::Raw(t) => Ok(t),
            other => Err(wrong_answer(name, "a raw tensor", &other)),
        }
    }
}

fn expect_matrix(answer: Weight, name: &str) -> Result<WeightMatrix, ModelError> {
    match answer {
        Weight::Matrix(m) => Ok(m),
        other => Err(wrong_answer(name, "a matrix", &other)),
    }
}

/// A source that answered a request with the wrong variant (a bug in it).
fn wrong_answer(name: &str, wanted: &str, got: &Weight) -> ModelError {
    let kind = match got {
        Weight::Matrix(_) => "a matrix",
        Weight::F32 { .. } => "f32 values",
        Weight::Present(_) => "presence",
        Weight::Shape(_) => "a shape",
        Weight::Raw(_) => "a raw tensor",
    };
    ModelError::Source(format!("asked for {wanted} of `{name}`, answered {kind}"))
}

impl WeightSource for Checkpoint {
    fn load(&self, request: &WeightRequest<'_>) -> Result<Weight, ModelError> {
        Ok(match *request {
            WeightRequest::Linear { name, rows, cols } => Weight::Matrix(Checkpoint::matrix(self, name, rows, cols)?),
            WeightRequest::Param { name, rows, cols } => Weight::Matrix(Checkpoint::param_matrix(self, name, rows, cols)?),
            WeightRequest::F32 { name, shapes } => {
                let stored = self.shape(name)?;
                let (index, shape) = match shapes.iter().position(|s| *s == stored) {
                    Some(i) => (i, shapes[i]),
                    // The first shape, so the error names what was wanted.
                    None => (0, shapes.first().copied().unwrap_or(&[])),
                };
                Weight::F32 {
                    values: Checkpoint::tensor_f32(self, name, shape)?,
                    shape: index,
                }
            }
            WeightRequest::Present { name } => Weight::Present(Checkpoint::has(self, name)),
            WeightRequest::Shape { name } => Weight::Shape(
                Checkpoint::has(self, name)
                    .then(|| self.shape(name).map(<[usize]>::to_vec))
                    .transpose()?,
            ),
            WeightRequest::Raw { name, .. } => {
                let info = self.tensor_info(name)?;
                Weight::Raw(RawTensor {
                    bytes: self.shared_tensor(name)?,
                    dtype: info.dtype,
                    shape: info.shape,
                })
            }
        })
    }

    fn configure(&self, spec: &ModelSpec) {
        Checkpoint::configure(self, spec)
    }

    fn config_path(&self) -> PathBuf {
        self.config_json_path()
    }
}
