//! larder-engine: everything between a checkpoint folder and generated text.
//!
//! - [`Engine`] loads a checkpoint (model, tokenizer, chat template,
//!   generation config) and generates with it;
//! - [`request`] is what a request is ([`Job`]) and reports (events to a
//!   [`RequestSink`], the [`Outcome`]), with stop strings and the context check;
//! - [`scheduler`] is the one generation path: many sequences decode
//!   together in batched steps, each bit-identical to running alone
//!   (queue, KV budget with preemption, chunked prefill, a prefix cache of
//!   finished conversations, speculative decoding's verification rows);
//!   [`Engine::run`] and [`Engine::generate`] run one request through it on
//!   the caller's thread;
//! - [`handle`] runs the scheduler on an engine thread of its own
//!   ([`EngineHandle`]: submit jobs, receive their events, metrics), for
//!   `larder serve`, `larder run` and embedders;
//! - [`return_points`] keeps the snapshots a sequence whose state cannot
//!   roll back (a recurrent layer) returns to for prefix reuse;
//! - [`drafting`] resolves the drafter a user names (speculative decoding);
//! - [`tokenizer`] wraps `tokenizer.json` and decodes streams incrementally;
//! - [`chat`] renders `tokenizer_config.json` chat templates like transformers;
//! - [`sampling`] picks tokens (greedy or seeded temperature/top-k/top-p);
//! - [`generation`] reads `generation_config.json` (EOS ids);
//! - [`experts`] streams routed experts from larder-store (direct from
//!   safetensors or from a packed store);
//! - [`integrity`] checks a packed store's carried files and spine at load,
//!   and proves for `larder verify` that a store loads;
//! - [`stats`] is the timing/throughput record every run reports;
//! - [`output`] checks an output file the user names (`--trace`, `--out`)
//!   before any work and writes it atomically;
//! - [`memory_limit`] is the memory this process may use (MemAvailable and
//!   its cgroup v1 or v2 limit) and whether a run fits under the limit;
//! - [`plan`] is the first decode planner (fit, RAM budget, expected tok/s).

pub mod chat;
pub mod drafting;
pub mod drive_probe;
pub mod engine;
pub mod error;
pub mod experts;
pub mod forecast;
pub mod generation;
pub mod handle;
pub mod integrity;
#[cfg(feature = "remote")]
pub mod lazy;
pub mod machine;
pub mod memory_check;
pub mod memory_limit;
pub mod memory_watch;
pub mod open;
pub mod output;
pub mod pack;
pub mod plan;
pub mod planner;
pub mod prefill;
#[cfg(feature = "remote")]
pub mod pull;
pub mod recommend;
pub mod request;
pub mod return_points;
pub mod route_log;
pub mod sampling;
pub mod scheduler;
pub mod sizing;
pub mod stats;
pub mod store_folder;
pub mod tokenizer;

pub use chat::{ChatMessage, ChatTemplate};
pub use drafting::{DrafterChoice, Drafting};
pub use engine::{Engine, ExpertMode, FinishReason, GenerateOptions, Generation, LoadOptions};
pub use error::EngineError;
pub use generation::GenerationConfig;
pub use handle::{EngineHandle, Event, Events, HandleConfig, Metrics, TraceConfig};
pub use larder_model::RouteTrace;
pub use larder_router::Phase;
/// Expert-store counters and sizes, for clients of the engine (the server's
/// `/metrics` and ready line) that depend on no other larder crate.
pub use larder_store::{format_size, StoreStats};
pub use output::{OutputError, OutputFile, OutputKind, ReportKind, RunInputs};
pub use prefill::PrefillChunk;
pub use request::{Job, Outcome, RequestEvent, RequestSink, StopFilter};
pub use return_points::ReturnPoints;
pub use route_log::{RouteLog, RowTag};
pub use sampling::{Sampler, SamplingParams};
pub use scheduler::{check_state_dir, DiskTierConfig, DiskTierStats, Failure, KvCosts, Scheduler, SchedulerConfig, StepReport};
pub use stats::{ExpertStats, SpeculativeStats, Stats};
pub use tokenizer::{StreamDecoder, TextTokenizer};
