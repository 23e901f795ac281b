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
//! names: [`Recorder::with_names`]), since which optional tensors ship is
//! the checkpoint's business. Stored shapes are unknown to it
//! ([`WeightRequest::Shape`] answers `None`).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use larder_tensor::weight::SharedBytes;
use larder_tensor::{WeightDType, WeightMatrix};

use super::{ExpertTag, RawTensor, Weight, WeightRequest, WeightSource};
use crate::assemble::{self, PartKind, PartLayout, ShippedAs, FLOAT_DTYPES};
use crate::config::ModelSpec;
use crate::error::ModelError;
use crate::quant::{CompressedTensors, ModuleRule};

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
pub type Presence = dyn Fn(&str) -> bool + Send + Sync;

/// The quantization settings a [`WeightSource::configure`] call gives.
#[derive(Default)]
struct Formats {
    fp8_block: Option<(usize, usize)>,
    compressed: Option<CompressedTensors>,
}

/// A [`WeightSource`] without bytes that records every tensor asked for.
pub struct Recorder {
    present: Box<Presence>,
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

    /// Every tensor asked for so far, in the order asked.
    pub fn tensors(&self) -> Vec<RecordedTensor> {
        lock(&self.tensors).clone()
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

    /// How linear weight `name` ships under the configured quantization.
    fn shipped_as(&self, name: &str) -> ShippedAs {
        let module = name.strip_suffix(".weight").unwrap_or(name);
        let formats = lock(&self.formats);
        if let Some(ModuleRule::Packed(f)) = formats.compressed.as_ref().map(|c| c.rule(module)) {
            return ShippedAs::Packed(f);
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
        let bytes = self.zeros(rows * cols * WeightDType::BF16.size())?;
        Ok(Weight::Matrix(WeightMatrix::new(name, WeightDType::BF16, rows, cols, bytes)?))
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
                let first = shapes
                    .first()
                    .ok_or_else(|| ModelError::Source(format!("tensor `{name}` asked for in no shape")))?;
                self.record(
                    name,
                    RecordedRole::SmallF32,
                    FLOAT_DTYPES,
                    shapes.iter().map(|s| s.to_vec()).collect(),
                );
                Ok(Weight::F32 {
                    values: vec![0.0; first.iter().product()],
                    shape: 0,
                })
            }
            WeightRequest::Present { name } => Ok(Weight::Present((self.present)(name))),
            WeightRequest::Shape { .. } => Ok(Weight::Shape(None)),
            WeightRequest::Raw { name, dtypes, shape } => {
                let dtype = *dtypes
                    .first()
                    .ok_or_else(|| ModelError::Source(format!("tensor `{name}` asked for in no dtype")))?;
                let size = dtype_size(dtype).ok_or_else(|| ModelError::Source(format!("tensor `{name}`: unknown dtype {dtype}")))?;
                self.record(name, RecordedRole::FusedRaw, dtypes, vec![shape.to_vec()]);
                Ok(Weight::Raw(RawTensor {
                    dtype: dtype.to_string(),
                    shape: shape.to_vec(),
                    bytes: self.zeros(shape.iter().product::<usize>() * size)?,
                }))
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
