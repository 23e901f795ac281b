//! larder-engine: everything between a checkpoint folder and generated text.
//!
//! - [`Engine`] loads a checkpoint (model, tokenizer, chat template,
//!   generation config) and generates with it;
//! - [`tokenizer`] wraps `tokenizer.json` and decodes streams incrementally;
//! - [`chat`] renders `tokenizer_config.json` chat templates like transformers;
//! - [`sampling`] picks tokens (greedy or seeded temperature/top-k/top-p);
//! - [`generation`] reads `generation_config.json` (EOS ids);
//! - [`experts`] streams routed experts from larder-store (direct from
//!   safetensors or from a packed store);
//! - [`integrity`] checks a packed store's carried files and spine at load,
//!   and proves for `larder verify` that a store loads;
//! - [`stats`] is the timing/throughput record every run reports;
//! - [`plan`] is the first decode planner (fit, RAM budget, expected tok/s).

pub mod chat;
pub mod engine;
pub mod error;
pub mod experts;
pub mod generation;
pub mod integrity;
pub mod pack;
pub mod plan;
pub mod sampling;
pub mod stats;
pub mod tokenizer;

pub use chat::{ChatMessage, ChatTemplate};
pub use engine::{Engine, ExpertMode, FinishReason, GenerateOptions, Generation, LoadOptions};
pub use error::EngineError;
pub use generation::GenerationConfig;
pub use sampling::{Sampler, SamplingParams};
pub use stats::{ExpertStats, SpeculativeStats, Stats};
pub use tokenizer::{StreamDecoder, TextTokenizer};
