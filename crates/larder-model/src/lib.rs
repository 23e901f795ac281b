//! larder-model: the architectures larder runs, exactly as transformers runs
//! them, with f32 activations and weights in their shipped dtype.
//!
//! - [`config`] reads a checkpoint's `config.json` (one key policy for every
//!   architecture), and one file per architecture under [`arch`] turns it
//!   into a [`ModelSpec`] (every spec type is re-exported here, with defaults);
//! - [`checkpoint`] opens safetensors files (single or sharded) and hands out
//!   weights without converting them, through [`assemble`] (the one place a
//!   weight's shipped tensors, dense, fp8 or 4-bit packed per [`ModuleRule`], become a matrix);
//! - [`DecoderModel`] is the transformer shared by every architecture, built from
//!   layers: per-layer mixers (attention + [`Rope`], [`KvLayer`] for GQA and
//!   [`MlaAttention`]; KDA for Kimi Linear's linear attention), [`Mlp`] and MoE blocks; it runs
//!   many sequences at once ([`DecoderModel::forward_batch`]), each with its
//!   own [`SequenceState`];
//! - loaders ask for weights through a [`WeightSource`]: the
//!   checkpoint, or a [`Recorder`] that learns the tensors a model reads,
//!   seen through a prefix-scoped [`WeightView`];
//! - routed experts come from an [`ExpertProvider`]; the model never knows
//!   where expert bytes live.

mod activation;
pub mod arch;
pub mod assemble;
mod attention;
mod attn_residual;
pub mod checkpoint;
pub mod config;
mod decoder;
mod error;
mod expert;
mod expert_parts;
mod fused_experts;
mod kda;
mod kv_cache;
mod layer;
mod mla;
mod mlp;
mod moe;
mod quant;
mod rope;
mod source;
mod spec;
mod spec_limits;
mod state;
pub mod state_io;
pub mod synth;
mod upcycle;

// Loading a model, and what it is: the spec types.
pub use arch::{load_model, ModelLoad};
pub use error::ModelError;
pub use spec::{
    ExpertKind, FfnSpec, KdaOutputGate, KdaSpec, LayerSpec, MixerSpec, MlaCache, MlaSpec, ModelSpec, MoeNames, MoeSpec, Scoring,
    SharedExpertSpec, LATENT_NORM_EPS,
};
// Running it: the decoder, its layers' parts, and per-sequence state.
pub use activation::{activation_bytes_per_row, prefill_rows};
pub use decoder::{BatchSeq, DecoderModel, RouteTrace, Wanted};
pub use kda::forget_log_decay;
pub use kv_cache::KvLayer;
pub use mla::{MlaAttention, QueryProj};
pub use mlp::{load_mlp, Mlp};
pub use rope::{Rope, RopeScaling, RopeSpec};
pub use state::{LayerState, RecurrentLayer, RecurrentValues, SequenceState, StateSnapshot};
// Routed experts: where they come from and how their tensors are laid out.
pub use expert::{expert_layers, expert_tensors, load_routed_experts, ExpertProvider, ExpertTensor, InMemoryExperts};
pub use expert_parts::{routed_expert_parts, ExpertPart};
pub use fused_experts::{gpt_oss_layer_parts, FusedLayer};
pub use quant::{ModuleRule, PackedFormat};
// Weight sources.
pub use source::{
    ExpertTag, RandomSource, RecordedRole, RecordedTensor, Recorder, TensorPath, Weight, WeightRequest, WeightSource, WeightView,
};
// Writing checkpoints: upcycling a dense model to MoE.
pub use upcycle::{upcycle, UpcycleLayout, UpcycleReport, UpcycleSpec};
