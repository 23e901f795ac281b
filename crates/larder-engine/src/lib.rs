//! larder-engine: everything between a checkpoint folder and generated text.
//!
//! The public API is the items re-exported at the crate root (grouped below
//! by area) and a few namespaces named by path ([`open`], [`sizing`],
//! [`planner`] and [`plan`], [`pack`], [`integrity`], [`kimi_k3_chat`],
//! [`drive_probe`], [`recommend`], and with feature `remote` `lazy` and
//! `pull`). The modules named here in `code` are private.
//!
//! - [`Engine`] loads a checkpoint (model, tokenizer, chat format,
//!   generation config) and generates with it;
//! - `request` is what a request is ([`Job`]) and reports (events to a
//!   [`RequestSink`], the [`Outcome`]), with stop strings and the context check;
//! - `scheduler` ([`Scheduler`]) is the one generation path: many sequences
//!   decode together in batched steps, each bit-identical to running alone
//!   (queue, KV budget with preemption, chunked prefill, a prefix cache of
//!   finished conversations, speculative decoding's verification rows);
//!   [`Engine::run`] and [`Engine::generate`] run one request through it on
//!   the caller's thread;
//! - `handle` runs the scheduler on an engine thread of its own
//!   ([`EngineHandle`]: submit jobs, receive their events, metrics), for
//!   `larder serve`, `larder run` and embedders;
//! - `return_points` keeps the snapshots a sequence whose state cannot
//!   roll back (a recurrent layer) returns to for prefix reuse;
//! - `drafting` resolves the drafter a user names ([`DrafterChoice`],
//!   speculative decoding);
//! - `tokenizer` wraps `tokenizer.json` or Kimi's `tiktoken.model` ([`TextTokenizer`]) and decodes
//!   streams incrementally ([`StreamDecoder`]);
//! - `chat` renders `tokenizer_config.json` chat templates like
//!   transformers ([`ChatTemplate`]); [`kimi_k3_chat`] builds Kimi K3's
//!   chat (no template ships) as its `encoding_k3.py` does;
//! - `grammar` compiles structured output (`response_format`'s JSON
//!   schemas, tool calls, Lark grammars) with llguidance into a
//!   [`TokenConstraint`] ([`GrammarEngine`], [`GrammarConstraint`]);
//! - `sampling` picks tokens (greedy or seeded temperature/top-k/top-p,
//!   [`SamplingParams`]);
//! - `generation` reads `generation_config.json` (EOS ids, [`GenerationConfig`]);
//! - `experts` streams routed experts from larder-store (direct from
//!   safetensors or from a packed store);
//! - [`integrity`] checks a packed store's carried files and spine at load,
//!   and proves for `larder verify` that a store loads;
//! - `stats` is the timing/throughput record every run reports ([`Stats`]);
//! - `output` checks an output file the user names (`--trace`, `--out`)
//!   before any work and writes it atomically ([`OutputFile`]);
//! - `memory_limit` is the memory this process may use (MemAvailable and
//!   its cgroup v1 or v2 limit) and whether a run fits under the limit;
//! - [`plan`] is the first decode planner (fit, RAM budget, expected tok/s).
//! - `tensor_sizes` sizes a model from the tensors its loader reads (a
//!   recorded load, [`estimate_sizes`]), for [`sizing`] and the planners.

// Namespaces dependents name: opening a model, sizing and planning it,
// packing and checking a store, the machine `larder doctor` reports.
pub mod drive_probe;
pub mod integrity;
pub mod kimi_k3_chat;
#[cfg(feature = "remote")]
pub mod lazy;
pub mod open;
pub mod pack;
pub mod plan;
pub mod planner;
#[cfg(feature = "remote")]
pub mod pull;
pub mod recommend;
pub mod sizing;

mod chat;
mod chat_json;
mod chat_message;
mod choice;
mod constraint;
mod drafting;
mod engine;
mod error;
mod experts;
mod forecast;
mod generation;
mod grammar;
mod handle;
mod machine;
mod memory_check;
mod memory_limit;
mod memory_watch;
mod output;
mod prefill;
pub mod reasoning;
mod request;
mod return_points;
mod route_log;
mod sampling;
mod scheduler;
mod stats;
mod store_folder;
mod tensor_sizes;
mod tokenizer;
pub mod tool_calls;

// The engine: loading a checkpoint and generating with it.
pub use engine::{Engine, ExpertMode, FinishReason, GenerateOptions, Generation, LoadOptions, OutputReader, PREFILL_CHUNK};
pub use error::EngineError;
pub use generation::GenerationConfig;
pub use prefill::{mem_available, PrefillChunk};
pub use stats::{ExpertStats, SpeculativeStats, Stats};
// Requests and what they report.
pub use request::{Job, Outcome, RequestEvent, RequestSink};
pub use sampling::SamplingParams;
// What a request may sample next (grammars, required tool calls).
pub use choice::{log_softmax, LogitAdjustments, TokenLogprob, MAX_TOP_LOGPROBS};
pub use constraint::{ConstraintError, TokenConstraint};
pub use grammar::{GrammarConstraint, GrammarEngine, GrammarError, GrammarSpec, ToolSchema, MAX_GRAMMAR_BYTES};
// The scheduler: batched decoding, the KV budget, the prefix cache's disk tier.
pub use scheduler::{
    check_state_dir, default_state_quota, DiskTierConfig, DiskTierStats, Failure, KvCosts, Scheduler, SchedulerConfig, StepReport,
};
// The engine thread: submitting jobs, their events, metrics, route traces.
pub use handle::{EngineHandle, Event, Events, HandleConfig, Metrics, TraceConfig};
pub use larder_model::RouteTrace;
pub use larder_router::Phase;
pub use route_log::{RouteLog, RowTag};
// Speculative decoding's drafter.
pub use drafting::{DrafterChoice, Drafting};
// Text: tokenizers, streaming decode, chat templates.
pub use chat::{ChatMessage, ChatTemplate, FunctionCall, RenderOptions, ToolCall};
pub use tokenizer::{StreamDecoder, TextTokenizer, KIMI_K3_SPECIAL_IDS, KIMI_SPECIAL_IDS};
// Output files the user names, checked before any work.
pub use output::{OutputError, OutputFile, OutputKind, ReportKind, RunInputs};
// Memory: the budget that follows available RAM.
pub use memory_watch::{MemoryWatch, WatchConfig};
// The machine, model sizes from the tensors a loader reads, store folders.
pub use machine::Machine;
pub use store_folder::unfinished_store;
pub use tensor_sizes::{checkpoint_recorded_sizes, config_float_dtype, estimate_sizes};

/// Expert-store counters and sizes, for clients of the engine (the server's
/// `/metrics` and ready line) that depend on no other larder crate.
pub use larder_store::{format_size, parse_size, StoreStats};
