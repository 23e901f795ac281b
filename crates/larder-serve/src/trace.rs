//! `larder serve --trace FILE`: the routes of every forward pass the engine
//! thread runs, kept in a [`RouteLog`] (each row tagged with its request and
//! position) and written to FILE as a route trace (JSON Lines, atomically:
//! a `.partial` file renamed when complete; FILE was checked before the
//! server started, `larder_engine::output`) whenever the engine goes idle,
//! at most every [`WRITE_EVERY`] while it stays busy, and once more when the
//! engine thread ends. So after the last request finishes, FILE holds every
//! pass so far, and a reader never sees a half-written file.
//!
//! Batched requests share passes: a pass's `pass` number is the same for all
//! its rows, and `seq` is the request's scheduler id. With a drafter each
//! request runs alone; its rows are numbered from the first position it
//! computed (after any reused prefix), drafted rows included.
//!
//! The log grows with every token served (a few hundred bytes per token);
//! it is for measurement sessions, not for a server left running for weeks.

use std::time::{Duration, Instant};

use larder_engine::{Engine, OutputFile, RouteLog};

/// How often a busy engine rewrites the trace file at most.
pub const WRITE_EVERY: Duration = Duration::from_secs(10);

/// Where and how to record routes (`--trace`).
#[derive(Debug, Clone)]
pub struct TraceConfig {
    /// The trace file, checked before the server starts (it may replace only
    /// a trace, and one already there only with `--overwrite`).
    pub output: OutputFile,
    /// Where the model was loaded from (the trace header's `model`).
    pub model: String,
    /// Bytes of one routed expert (what one cache miss reads).
    pub expert_bytes: u64,
    /// MoE layers ahead whose routers are asked on each layer's input.
    pub lookahead: usize,
}

/// The trace file and when it was last written.
pub(crate) struct TraceFile {
    config: TraceConfig,
    written_tokens: usize,
    written_at: Instant,
}

impl TraceFile {
    /// The file of `config` and an empty log for `engine`'s model (`None`,
    /// logged, for a model without MoE layers: `larder serve` refuses
    /// `--trace` for one before loading).
    pub fn open(config: TraceConfig, engine: &Engine) -> Option<(TraceFile, RouteLog)> {
        let Some(log) = RouteLog::new(engine.model().spec(), &config.model, config.expert_bytes, config.lookahead) else {
            tracing::error!(
                "--trace {}: the model has no MoE layers, so there are no routes to record",
                config.output.path().display()
            );
            return None;
        };
        let file = TraceFile {
            config,
            written_tokens: usize::MAX,
            written_at: Instant::now(),
        };
        Some((file, log))
    }

    /// Writes `log` when it has grown since the last write and the engine is
    /// `idle` or [`WRITE_EVERY`] has passed.
    pub fn maybe_write(&mut self, log: &RouteLog, idle: bool) {
        if log.tokens() != self.written_tokens && (idle || self.written_at.elapsed() >= WRITE_EVERY) {
            self.write(log);
        }
    }

    /// Writes `log` now; a failure is logged (serving goes on).
    pub fn write(&mut self, log: &RouteLog) {
        match log.write(&mut self.config.output) {
            Ok(()) => self.written_tokens = log.tokens(),
            Err(e) => tracing::error!("{e}"),
        }
        self.written_at = Instant::now();
    }
}
