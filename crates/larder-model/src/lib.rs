//! larder-model: the architectures larder runs, exactly as transformers runs
//! them, with f32 activations and weights in their shipped dtype.
//!
//! - [`config`] reads a checkpoint's `config.json` (one key policy for every
//!   architecture), and one file per architecture under [`arch`] turns it
//!   into a [`ModelSpec`] ([`spec`]: every spec type, with defaults);
//! - [`checkpoint`] opens safetensors files (single or sharded) and hands out
//!   weights without converting them, through [`assemble`] (the one place a
//!   weight's shipped tensors, dense, fp8 or 4-bit packed per [`quant`], become a matrix);
//! - [`decoder`] is the transformer shared by every architecture, built from
//!   [`layer`]s: per-layer mixers ([`attention`] + [`rope`], [`kv_cache`] for GQA and
//!   [`mla`]; [`kda`] for Kimi Linear's linear attention), [`mlp`] and [`moe`]; it runs
//!   many sequences at once ([`DecoderModel::forward_batch`]), each with its
//!   own [`state`];
//! - loaders ask for weights through a [`WeightSource`] ([`source`]): the
//!   checkpoint, or a [`Recorder`] that learns the tensors a model reads,
//!   seen through a prefix-scoped [`WeightView`];
//! - routed experts come from an [`ExpertProvider`]; the model never knows
//!   where expert bytes live.

pub mod activation;
pub mod arch;
pub mod assemble;
pub mod attention;
pub mod attn_residual;
pub mod checkpoint;
pub mod config;
pub mod decoder;
pub mod error;
pub mod expert;
pub mod expert_parts;
pub mod fused_experts;
pub mod kda;
pub mod kv_cache;
pub mod layer;
pub mod mla;
pub mod mlp;
pub mod moe;
pub mod quant;
pub mod rope;
pub mod source;
pub mod spec;
mod spec_limits;
pub mod state;
pub mod state_io;
pub mod synth;
pub mod upcycle;

pub use arch::{load_model, ModelLoad};
pub use decoder::{BatchSeq, DecoderModel, RouteTrace, Wanted};
pub use error::ModelError;
pub use expert::{expert_layers, expert_tensors, load_routed_experts, ExpertProvider, ExpertTensor, InMemoryExperts};
pub use expert_parts::{routed_expert_parts, ExpertPart};
pub use kv_cache::KvLayer;
pub use source::{ExpertTag, RandomSource, Recorder, TensorPath, Weight, WeightRequest, WeightSource, WeightView};
pub use spec::{FfnSpec, MlaCache, ModelSpec, MoeSpec};
pub use state::{LayerState, RecurrentLayer, RecurrentValues, SequenceState, StateSnapshot};
