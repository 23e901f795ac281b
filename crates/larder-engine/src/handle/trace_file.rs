//! The handle's route-trace file (`larder serve --trace FILE`): the routes
//! of every forward pass the engine thread runs, kept in a [`RouteLog`]
//! (each row tagged with its request's scheduler id, position and phase)
//! and written to FILE as a route trace (JSON Lines, atomically: a
//! `.partial` file renamed when complete; FILE was checked before the
//! engine started, [`crate::output`]) whenever the engine goes idle, at most
//! every [`WRITE_EVERY`] while it stays busy, and once more when the engine
//! thread ends. So after the last request finishes, FILE holds every pass so
//! far, and a reader never sees a half-written file.
//!
//! Batched requests share passes: a pass's `pass` number is the same for all
//! its rows. A drafting request's verification passes are recorded with
//! their drafted rows (at the positions they were tried at).
//!
//! The log grows with every token served (a few hundred bytes per token);
//! it is for measurement sessions, not for a server left running for weeks.

use std::time::{Duration, Instant};

use crate::engine::Engine;
use crate::error::EngineError;
use crate::output::OutputFile;
use crate::route_log::RouteLog;

/// How often a busy engine rewrites the trace file at most.
pub(super) const WRITE_EVERY: Duration = Duration::from_secs(10);

/// Where and how to record routes (`--trace`).
#[derive(Debug, Clone)]
pub struct TraceConfig {
    /// The trace file, checked before the engine starts (it may replace only
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
pub(super) struct TraceFile {
    config: TraceConfig,
    written_tokens: usize,
    written_at: Instant,
}

impl TraceFile {
    /// The file of `config` and an empty log for `engine`'s model (`None`,
    /// logged, for a model without MoE layers: `larder serve` refuses
    /// `--trace` for one before loading).
    pub(super) fn open(config: TraceConfig, engine: &Engine) -> Option<(TraceFile, RouteLog)> {
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
    /// `idle` or [`WRITE_EVERY`] has passed; a failure is logged (serving
    /// goes on).
    pub(super) fn maybe_write(&mut self, log: &RouteLog, idle: bool) {
        if log.tokens() != self.written_tokens && (idle || self.written_at.elapsed() >= WRITE_EVERY) {
            if let Err(e) = self.write(log) {
                tracing::error!("{e}");
            }
        }
    }

    /// Writes `log` now.
    pub(super) fn write(&mut self, log: &RouteLog) -> Result<(), EngineError> {
        self.written_at = Instant::now();
        log.write(&mut self.config.output).map_err(|e| EngineError::Invalid {
            field: "trace",
            message: e.to_string(),
        })?;
        self.written_tokens = log.tokens();
        Ok(())
    }
}
