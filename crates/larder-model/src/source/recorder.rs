//! [`Recorder`]: a [`WeightSource`] that holds no bytes and learns, by
//! letting [`DecoderModel::load`](crate::DecoderModel::load) run against it,
//! every tensor an architecture reads: its shipped name, the dtypes and
//! shapes it may ship in, and its role.
//!
//! A linear weight's shipped tensors come from [`assemble::part_layout`],
//! the code the [`Checkpoint`](crate::checkpoint::Checkpoint) checks them
//! with, in the format the spec's quantization config says: a module a
//! compressed-tensors scheme packs ships packed (`weight_packed`,
//! `weight_scale`, and for INT4 `weight_shape`); under an fp8 config
//! (`weight_block_size`) every linear weight but `lm_head` ships fp8 with
//! `weight_scale_inv` (transformers keeps the output embedding unconverted;
//! routers and embeddings are parameters, never linear weights); otherwise
//! one float tensor. A float tensor's dtype is the checkpoint's choice, not
//! the config's, so it is recorded as the set accepted (F32/F16/BF16).
//!
//! Every request is answered with a placeholder that costs no memory per
//! tensor: matrices are dense BF16 views of one shared zero-filled
//! anonymous mapping (grown to the largest request; pages never written
//! cost nothing), small tensors are zero vectors, and presence is told by
//! the rule the recorder is built with (for an existing checkpoint, its
//! names), since which optional tensors ship is the checkpoint's business.
//! A recorder made [`for a checkpoint`](Recorder::for_checkpoint) (what
//! `doctor`, `plan`, `pack` and streaming use) also checks each request
//! against the checkpoint's shapes before answering it, so what it
//! allocates is sized by the checkpoint's tensors, never by config.json
//! alone; to other recorders stored shapes are unknown
//! ([`WeightRequest::Shape`] answers `None`), and they allocate small
//! tensors fallibly (an error, not an abort, when config.json asks for
//! more than there is).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use larder_tensor::{SharedBytes, WeightDType, WeightMatrix};

use super::{ExpertTag, RawTensor, Weight, WeightRequest, WeightSource};
use crate::assemble::{self, PartKind, PartLayout, ShippedAs, FLOAT_DTYPES};
use crate::checkpoint::Checkpoint;
use crate::error::ModelError;
use crate::quant::{CompressedTensors, ModuleRule};
use crate::spec::ModelSpec;

/// What a recorded tensor is to the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordedRole {
    /// Part `part` of linear weight `weight` (`X.weight`), whose logical
    /// (unpacked) shape is `[rows, cols]`.
    Linear {
        weight: String,
        part: PartKind,
        rows: usize,
        cols: usize,
    },
    /// A 2-D parameter that is not a linear weight (embedding, router).
    Param,
    /// A small tensor widened to f32 (norms, biases, conv taps).
    SmallF32,
    /// A whole tensor taken as shipped (gpt-oss fused experts).
    FusedRaw,
}

/// One tensor a model reads, as the recorder learned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedTensor {
    /// The shipped (checkpoint) name.
    pub name: String,
    pub role: RecordedRole,
    /// The safetensors dtypes it may ship in.
    pub dtypes: Vec<&'static str>,
    /// The shapes it may have (one, except small tensors a loader accepts
    /// in several layouts, such as Kimi's `A_log`).
    pub shapes: Vec<Vec<usize>>,
    /// The routed expert it belongs to (`None`: the spine).
    pub expert: Option<ExpertTag>,
}

/// Whether a tensor ships (see [`Recorder::new`]).
pub(crate) type Presence = dyn Fn(&str) -> bool + Send + Sync;

/// The quantization settings a [`WeightSource::configure`] call gives.
#[derive(Default)]
struct Formats {
    fp8_block: Option<(usize, usize)>,
    compressed: Option<CompressedTensors>,
}

/// What a checkpoint holds of one tensor (see [`Recorder::for_checkpoint`]).
struct StoredTensor {
    dtype: String,
    shape: Vec<usize>,
    /// The safetensors file holding it (for errors).
    file: PathBuf,
}

/// A [`WeightSource`] without bytes that records every tensor asked for.
pub struct Recorder {
    present: Box<Presence>,
    /// The checkpoint's tensors by name, when recording for one: requests
    /// are checked against them.
    stored: Option<HashMap<String, StoredTensor>>,
    /// The config.json that errors about config fields name.
    config_path: PathBuf,
    formats: Mutex<Formats>,
    /// The shared zero-filled mapping placeholders view.
    zeros: Mutex<Option<Arc<memmap2::Mmap>>>,
    tensors: Mutex<Vec<RecordedTensor>>,
    /// What the loader said the requests it makes now are for.
    tag: Mutex<Option<ExpertTag>>,
}

impl Recorder {
    /// A recorder that answers presence questions (optional tensors, tied
    /// `lm_head`, gpt-oss's MXFP4-or-not parts) with `present`.
    pub fn new(present: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        Recorder {
            present: Box::new(present),
            stored: None,
            config_path: PathBuf::from("config.json"),
            formats: Mutex::new(Formats::default()),
            zeros: Mutex::new(None),
            tensors: Mutex::new(Vec::new()),
            tag: Mutex::new(None),
        }
    }

    /// A recorder for which exactly `names` ship (an existing checkpoint's).
    pub fn with_names(names: impl IntoIterator<Item = String>) -> Self {
        let names: HashSet<String> = names.into_iter().collect();
        Self::new(move |n| names.contains(n))
    }

    /// A recorder for a model known from config.json alone, whose optional
    /// tensors ship as a checkpoint made from that config ships them: the
    /// routers' selection bias (`e_score_correction_bias`) and gpt-oss's
    /// fused experts (in the format the config says) do; a separate
    /// `lm_head` of a tied model and the weights of output gates the config
    /// switches off do not. What `synth` writes and what `doctor` and
    /// `plan` estimate from a config.json.
    pub fn for_config() -> Self {
        Self::new(|n| n.ends_with(".e_score_correction_bias") || n.contains(".experts."))
    }

    /// A recorder for checkpoint `ckpt`: exactly its tensors ship, and each
    /// request is checked as the checkpoint checks it before anything is
    /// answered: a small tensor, a parameter and a raw tensor must ship, in
    /// a shape the loader accepts (placeholders then have the stored shape),
    /// a linear weight's codes, where they ship, have the shape the loader
    /// asks for, and shape questions get the stored shape. So a size in
    /// config.json the checkpoint disagrees with is a shape error here,
    /// before it sizes anything.
    pub fn for_checkpoint(ckpt: &Checkpoint) -> Result<Self, ModelError> {
        let files = ckpt.file_paths();
        let mut stored = HashMap::new();
        for name in ckpt.names() {
            let info = ckpt.tensor_info(name)?;
            let file = files.get(info.file).cloned().unwrap_or_default();
            stored.insert(
                name.to_string(),
                StoredTensor {
                    dtype: info.dtype,
                    shape: info.shape,
                    file,
                },
            );
        }
        let names: HashSet<String> = stored.keys().cloned().collect();
        Ok(Recorder {
            stored: Some(stored),
            config_path: ckpt.config_json_path(),
            ..Self::new(move |n| names.contains(n))
        })
    }

    /// The checkpoint's tensor `name`: `Ok(None)` without a checkpoint, an
    /// error when the checkpoint lacks it.
    fn stored(&self, name: &str) -> Result<Option<&StoredTensor>, ModelError> {
        match &self.stored {
            None => Ok(None),
            Some(tensors) => tensors
                .get(name)
                .map(Some)
                .ok_or_else(|| ModelError::MissingTensor { name: name.to_string() }),
        }
    }

    /// An error unless the checkpoint's `name` (if recording for one) has
    /// one of `shapes`; the index of the one it has (0 without a checkpoint).
    fn check_shape(&self, name: &str, shapes: &[&[usize]]) -> Result<usize, ModelError> {
        let Some(t) = self.stored(name)? else { return Ok(0) };
        shapes
            .iter()
            .position(|s| *s == t.shape.as_slice())
            .ok_or_else(|| ModelError::TensorShape {
                name: name.to_string(),
                path: t.file.clone(),
                got: t.shape.clone(),
                expected: shapes.first().map_or_else(Vec::new, |s| s.to_vec()),
            })
    }

    /// Every tensor asked for so far, in the order asked.
    pub fn tensors(&self) -> Vec<RecordedTensor> {
        lock(&self.tensors).clone()
    }

    /// Every tensor asked for, in the order asked, without copying them.
    pub fn into_tensors(self) -> Vec<RecordedTensor> {
        self.tensors.into_inner().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, name: &str, role: RecordedRole, dtypes: &[&'static str], shapes: Vec<Vec<usize>>) {
        lock(&self.tensors).push(RecordedTensor {
            name: name.to_string(),
            role,
            dtypes: dtypes.to_vec(),
            shapes,
            expert: *lock(&self.tag),
        });
    }

    /// How linear weight `name` ships under the configured quantization. A
    /// checkpoint's stored tensors decide what is packed; with none to look
    /// at, a compressed-tensors scheme is taken to pack only routed experts,
    /// as every released scheme does (Kimi K3's `targets` also cover bf16
    /// latent projections its `ignore` list does not name).
    fn shipped_as(&self, name: &str) -> ShippedAs {
        let module = name.strip_suffix(".weight").unwrap_or(name);
        let formats = lock(&self.formats);
        let routed = lock(&self.tag).is_some();
        if let Some(ModuleRule::Packed(f)) = formats.compressed.as_ref().map(|c| c.rule(module)) {
            if routed {
                return ShippedAs::Packed(f);
            }
        }
        match formats.fp8_block {
            Some(block) if module != "lm_head" => ShippedAs::Fp8 { block },
            _ => ShippedAs::Dense,
        }
    }

    /// Records the parts of `[rows, cols]` weight `name` shipped as `how`
    /// and answers with a zero matrix.
    fn weight(&self, name: &str, rows: usize, cols: usize, how: ShippedAs, linear: bool) -> Result<Weight, ModelError> {
        let layout = assemble::part_layout(name, rows, cols, how).map_err(|m| ModelError::Source(format!("weight `{name}`: {m}")))?;
        self.check_codes(&layout, linear)?;
        for PartLayout {
            kind,
            name: part,
            dtypes,
            shape,
            ..
        } in layout
        {
            let role = match linear {
                true => RecordedRole::Linear {
                    weight: name.to_string(),
                    part: kind,
                    rows,
                    cols,
                },
                false => RecordedRole::Param,
            };
            self.record(&part, role, dtypes, vec![shape]);
        }
        let bytes = self
            .zeros(byte_len(name, &[rows, cols], WeightDType::BF16.size())?)
            .map_err(|e| match e {
                ModelError::Source(m) => ModelError::Source(format!("weight `{name}` [{rows}, {cols}]: {m}")),
                other => other,
            })?;
        Ok(Weight::Matrix(WeightMatrix::new(name, WeightDType::BF16, rows, cols, bytes)?))
    }

    /// Recording for a checkpoint: the codes of a weight (`layout`'s first
    /// part) have the shape asked for where they ship; a parameter
    /// (`linear` false) must ship. A linear weight whose codes do not ship
    /// under this name is left to the checkpoint's own checks, which name
    /// the quantization config the names follow.
    fn check_codes(&self, layout: &[PartLayout], linear: bool) -> Result<(), ModelError> {
        let Some(codes) = layout.iter().find(|p| p.kind == PartKind::Codes) else {
            return Ok(());
        };
        if linear && !(self.present)(&codes.name) {
            return Ok(());
        }
        self.check_shape(&codes.name, &[&codes.shape]).map(|_| ())
    }

    /// `len` f32 zeros (a small-tensor placeholder), or an error when they
    /// cannot be allocated.
    fn f32_zeros(name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let mut values = Vec::new();
        values
            .try_reserve_exact(len)
            .map_err(|e| ModelError::Source(format!("tensor `{name}`: cannot allocate a placeholder of {len} f32 values ({e})")))?;
        values.resize(len, 0.0);
        Ok(values)
    }

    /// `len` zero bytes viewing the shared mapping (grown when too small).
    fn zeros(&self, len: usize) -> Result<SharedBytes, ModelError> {
        if len == 0 {
            return Ok(SharedBytes::from_vec(Vec::new()));
        }
        let mut zeros = lock(&self.zeros);
        let map = match zeros.as_ref().filter(|m| m.len() >= len) {
            Some(m) => m.clone(),
            None => {
                // MAP_NORESERVE: the zeros are never written, so a mapping larger
                // than RAM (gpt-oss 120b's bf16 fused experts: 4.2 GB) must not be
                // refused by the kernel's overcommit check on a small machine.
                let m = memmap2::MmapOptions::new()
                    .len(len)
                    .no_reserve_swap()
                    .map_anon()
                    .and_then(|m| m.make_read_only())
                    .map_err(|e| ModelError::Source(format!("mapping {len} zero bytes: {e}")))?;
                zeros.insert(Arc::new(m)).clone()
            }
        };
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = map;
        Ok(SharedBytes::new(owner, 0, len))
    }
}

impl WeightSource for Recorder {
    fn load(&self, request: &WeightRequest<'_>) -> Result<Weight, ModelError> {
        match *request {
            WeightRequest::Linear { name, rows, cols } => self.weight(name, rows, cols, self.shipped_as(name), true),
            WeightRequest::Param { name, rows, cols } => self.weight(name, rows, cols, ShippedAs::Dense, false),
            WeightRequest::F32 { name, shapes } => {
                if shapes.is_empty() {
                    return Err(ModelError::Source(format!("tensor `{name}` asked for in no shape")));
                }
                let shape = self.check_shape(name, shapes)?;
                self.record(
                    name,
                    RecordedRole::SmallF32,
                    FLOAT_DTYPES,
                    shapes.iter().map(|s| s.to_vec()).collect(),
                );
                Ok(Weight::F32 {
                    values: Self::f32_zeros(name, element_count(name, shapes[shape])?)?,
                    shape,
                })
            }
            WeightRequest::Present { name } => Ok(Weight::Present((self.present)(name))),
            WeightRequest::Shape { name } => Ok(Weight::Shape(match &self.stored {
                Some(tensors) => tensors.get(name).map(|t| t.shape.clone()),
                None => None,
            })),
            WeightRequest::Raw { name, dtypes, shape } => {
                let asked = *dtypes
                    .first()
                    .ok_or_else(|| ModelError::Source(format!("tensor `{name}` asked for in no dtype")))?;
                // For a checkpoint: its dtype and shape, which the caller checks.
                let (dtype, stored_shape) = match self.stored(name)? {
                    Some(t) => (t.dtype.as_str(), t.shape.as_slice()),
                    None => (asked, shape),
                };
                let size = dtype_size(dtype).ok_or_else(|| ModelError::Source(format!("tensor `{name}`: unknown dtype {dtype}")))?;
                let bytes = self.zeros(byte_len(name, stored_shape, size)?)?;
                let answer = RawTensor {
                    dtype: dtype.to_string(),
                    shape: stored_shape.to_vec(),
                    bytes,
                };
                self.record(name, RecordedRole::FusedRaw, dtypes, vec![shape.to_vec()]);
                Ok(Weight::Raw(answer))
            }
        }
    }

    fn zero_placeholders(&self) -> bool {
        true
    }

    fn tag_expert(&self, tag: Option<ExpertTag>) {
        *lock(&self.tag) = tag;
    }

    fn configure(&self, spec: &ModelSpec) {
        *lock(&self.formats) = Formats {
            fp8_block: spec.fp8_block,
            compressed: spec.compressed.clone(),
        };
    }

    fn config_path(&self) -> PathBuf {
        self.config_path.clone()
    }
}

/// The element count of tensor `name` of `shape`, or an error when it overflows.
fn element_count(name: &str, shape: &[usize]) -> Result<usize, ModelError> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).ok_or_else(|| {
        ModelError::Source(format!(
            "tensor `{name}`: shape {shape:?} has more elements than memory can address"
        ))
    })
}

/// Bytes of tensor `name` of `shape` at `size` bytes an element, or an error when they overflow.
fn byte_len(name: &str, shape: &[usize], size: usize) -> Result<usize, ModelError> {
    element_count(name, shape)?
        .checked_mul(size)
        .ok_or_else(|| ModelError::Source(format!("tensor `{name}`: shape {shape:?} has more bytes than memory can address")))
}

/// Bytes per element of a safetensors dtype.
fn dtype_size(dtype: &str) -> Option<usize> {
    match dtype {
        "U8" | "I8" | "F8_E4M3" => Some(1),
        "BF16" | "F16" => Some(2),
        "F32" | "I32" => Some(4),
        "I64" => Some(8),
        _ => None,
    }
}

/// The guarded value (a panic elsewhere leaves a recording usable).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
