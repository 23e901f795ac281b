//! larder-model: the architectures larder runs, exactly as transformers runs
//! them, with f32 activations and weights in their shipped dtype.
//!
//! - [`config`] turns a checkpoint's `config.json` into a [`ModelSpec`], one
//!   file per architecture under [`arch`];
//! - [`checkpoint`] opens safetensors files (single or sharded) and hands out
//!   weights without converting them, through [`assemble`] (the one place a
//!   weight's shipped tensors, dense, fp8 or 4-bit packed per [`quant`], become a matrix);
//! - [`decoder`] is the transformer shared by every architecture, built from
//!   per-layer mixers ([`attention`] + [`rope`], [`kv_cache`] for GQA and
//!   [`mla`]; [`kda`] for Kimi Linear's linear attention), [`mlp`] and [`moe`]; it runs
//!   many sequences at once ([`DecoderModel::forward_batch`]), each with its
//!   own [`state`];
//! - loaders ask for weights through a [`WeightSource`] ([`source`]): the
//!   checkpoint, or a [`Recorder`] that learns the tensors a model reads;
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
pub mod fused_experts;
pub mod kda;
pub mod kv_cache;
pub mod mla;
pub mod mlp;
pub mod moe;
pub mod quant;
pub mod rope;
pub mod source;
mod spec_limits;
pub mod state;
pub mod state_io;
pub mod synth;
pub mod upcycle;

pub use arch::{load_model, load_model_with};
pub use config::{FfnSpec, MlaCache, ModelSpec, MoeSpec};
pub use decoder::{BatchSeq, DecoderModel, RouteTrace, Wanted};
pub use error::ModelError;
pub use expert::{expert_layers, expert_tensors, routed_expert_parts, ExpertPart, ExpertProvider, ExpertTensor, InMemoryExperts};
pub use kv_cache::KvLayer;
pub use source::{ExpertTag, RandomSource, Recorder, Weight, WeightRequest, WeightSource};
pub use state::{LayerState, RecurrentLayer, RecurrentValues, SequenceState, StateSnapshot};
