//! [`EngineHandle`]: an [`Engine`] on a thread of its own, running the
//! [`Scheduler`](crate::Scheduler) loop, the one place requests are
//! generated for callers that submit concurrently (`larder serve`,
//! `larder run`, embedders).
//!
//! - [`EngineHandle::start`] moves the engine to its thread (with the
//!   scheduler's limits, an optional disk tier and route-trace file:
//!   [`HandleConfig`]) and shares it read-only ([`EngineHandle::engine`]:
//!   tokenizer, chat template, prompt checks on other threads).
//! - [`EngineHandle::submit`] checks a [`Job`] on the caller's thread (the
//!   same checks the scheduler makes: prompt, context, sampling, stop
//!   strings, KV budget), so a refusal is an `Err` before anything runs, and
//!   returns its [`Events`]: each token with its text, held-back text, then
//!   `Done` with the [`Outcome`](crate::Outcome) or `Failed` with the error. Received with
//!   `recv().await` (async callers), [`Events::blocking_recv`] or as an
//!   iterator. Dropping the events, or [`Events::cancel`], cancels the job
//!   at the next step, queued or running; jobs with a drafter decode
//!   speculatively inside the same batched steps.
//! - The loop admits new jobs between steps, retires cancelled ones,
//!   reports failures to their job, logs the engine's warnings
//!   ([`Engine::take_warnings`]) and the disk tier's (`tracing`, at warn),
//!   and rewrites the route-trace file when idle (at most every
//!   [`WRITE_EVERY`](trace_file::WRITE_EVERY) while busy, and once more at the end).
//! - [`EngineHandle::metrics`] is a snapshot: running and waiting
//!   sequences, the last step's batch, KV bytes in use and kept, tokens and
//!   rates, the expert store's and the disk tier's counters.
//! - [`EngineHandle::stop`] lets every submitted job finish, writes the
//!   trace a last time and returns that write's result; dropping the handle
//!   instead cancels what still runs and waits for the thread.
//!
//! Files: `events` (events and their channel), `metrics`, `trace_file`,
//! `worker` (the engine thread's loop).

mod events;
mod metrics;
mod trace_file;
mod worker;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::request::Job;
use crate::scheduler::{DiskTierConfig, KvCosts, SchedulerConfig};
pub use events::{Event, Events};
pub use metrics::Metrics;
use metrics::Shared;
pub use trace_file::TraceConfig;
use worker::{Command, Worker};

/// How an [`EngineHandle`] runs its scheduler.
#[derive(Debug, Clone, Default)]
pub struct HandleConfig {
    /// Batch size, prefill chunk, KV budget, prefix cache.
    pub scheduler: SchedulerConfig,
    /// Keep finished conversations on disk too (`--state-dir`); a folder
    /// that fails to open is logged and the handle runs without it.
    pub disk_tier: Option<DiskTierConfig>,
    /// Record every pass's routes into a trace file (`--trace`).
    pub trace: Option<TraceConfig>,
}

/// The engine on its own thread; see the module docs.
pub struct EngineHandle {
    engine: Arc<Engine>,
    commands: Option<mpsc::Sender<Command>>,
    thread: Option<JoinHandle<Result<(), EngineError>>>,
    shared: Arc<Shared>,
    costs: KvCosts,
    kv_budget: Option<usize>,
}

impl EngineHandle {
    /// Moves `engine` to a new engine thread running the scheduler as
    /// `config` says. An error when the scheduler's limits are invalid
    /// (`max_batch` or `prefill_chunk` 0) or the thread cannot start.
    pub fn start(engine: Engine, config: HandleConfig) -> Result<EngineHandle, EngineError> {
        // Checked here, so a bad limit is the caller's error, not the thread's.
        crate::Scheduler::new(&engine, config.scheduler)?;
        let engine = Arc::new(engine);
        let shared = Arc::new(Shared::default());
        let (commands, received) = mpsc::channel();
        let worker = Worker::new(engine.clone(), shared.clone(), received);
        let kv_budget = config.scheduler.kv_budget;
        let thread = std::thread::Builder::new()
            .name("larder-engine".into())
            .spawn(move || worker.run(config))
            .map_err(|e| EngineError::EngineThread(format!("cannot start: {e}")))?;
        Ok(EngineHandle {
            costs: KvCosts::of(&engine),
            engine,
            commands: Some(commands),
            thread: Some(thread),
            shared,
            kv_budget,
        })
    }

    /// The engine, shared read-only (tokenizer, chat template, prompt
    /// checks, model spec) with the engine thread.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Checks `job` here ([`KvCosts::check`]) and hands it to the engine
    /// thread; its events come through the returned [`Events`]. An error
    /// when it is refused or the engine thread has stopped.
    pub fn submit(&self, job: Job) -> Result<Events, EngineError> {
        self.costs.check(&self.engine, &job, self.kv_budget)?;
        let prompt_tokens = job.prompt.len();
        let (events, sender) = Events::channel(prompt_tokens);
        let command = Command {
            job,
            events: sender,
            cancel: events.cancel_flag(),
        };
        let sent = self.commands.as_ref().is_some_and(|c| c.send(command).is_ok());
        if !sent {
            return Err(stopped());
        }
        Ok(events)
    }

    /// What the engine is doing now.
    pub fn metrics(&self) -> Metrics {
        self.shared.snapshot(&self.engine)
    }

    /// Lets every submitted job run to its end (cancel one by dropping its
    /// events), then stops the engine thread; returns the result of the
    /// trace file's last write (`Ok` without `--trace`).
    pub fn stop(mut self) -> Result<(), EngineError> {
        self.finish()
    }

    fn finish(&mut self) -> Result<(), EngineError> {
        self.commands = None;
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(EngineError::EngineThread("panicked (a bug: see the log above)".into())),
            None => Ok(()),
        }
    }
}

/// Cancels every job still queued or running, and waits for the engine
/// thread (at most the step in progress and the trace's last write).
impl Drop for EngineHandle {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.shared.cancel_all.store(true, Ordering::Relaxed);
            let _ = self.finish();
        }
    }
}

fn stopped() -> EngineError {
    EngineError::EngineThread("has stopped; no more requests are taken".into())
}

/// A flag shared by a job's events and its sink on the engine thread.
pub(crate) type CancelFlag = Arc<AtomicBool>;
