//! The engine thread's loop: admits submitted jobs between scheduler steps
//! (each job's events go out through a [`JobSink`]), steps while anything
//! runs or waits, reports failures to their job, updates the metrics, logs
//! warnings and keeps the route-trace file written. It ends when the handle
//! has gone (no more jobs can come) and nothing runs or waits.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};

use tokio::sync::mpsc::UnboundedSender;

use super::metrics::Shared;
use super::trace_file::TraceFile;
use super::{CancelFlag, Event, HandleConfig};
use crate::engine::Engine;
use crate::error::EngineError;
use crate::request::{Job, RequestEvent, RequestSink};
use crate::scheduler::{Scheduler, StepReport};

/// A job on its way to the engine thread.
pub(super) struct Command {
    pub job: Job,
    pub events: UnboundedSender<Event>,
    pub cancel: CancelFlag,
}

/// Where a job's events go on the engine thread; cancelled when its
/// receiver is gone, its flag is set, or the handle was dropped.
struct JobSink {
    events: UnboundedSender<Event>,
    cancel: CancelFlag,
    shared: Arc<Shared>,
}

impl RequestSink for JobSink {
    fn event(&mut self, event: RequestEvent<'_>) -> bool {
        match event {
            // Sent even when empty: a streaming reader then hears of every
            // token, which is how a vanished client is noticed.
            RequestEvent::Token { id, text, logprob } => {
                let sent = self.events.send(Event::Token {
                    id,
                    text: text.to_string(),
                    logprob: logprob.cloned(),
                });
                sent.is_ok() && !self.cancelled()
            }
            RequestEvent::Text(text) => self.events.send(Event::Text(text.to_string())).is_ok(),
            RequestEvent::Finished(outcome) => {
                self.shared.ended(outcome);
                let _ = self.events.send(Event::Done(Box::new(outcome.clone())));
                true
            }
        }
    }

    fn cancelled(&self) -> bool {
        self.events.is_closed() || self.cancel.load(Ordering::Relaxed) || self.shared.cancel_all.load(Ordering::Relaxed)
    }
}

/// The engine thread's state before it starts.
pub(super) struct Worker {
    engine: Arc<Engine>,
    shared: Arc<Shared>,
    commands: mpsc::Receiver<Command>,
}

impl Worker {
    pub(super) fn new(engine: Arc<Engine>, shared: Arc<Shared>, commands: mpsc::Receiver<Command>) -> Self {
        Worker { engine, shared, commands }
    }

    /// Runs the loop until the handle is gone and nothing is left; returns
    /// the result of the trace file's last write.
    pub(super) fn run(self, config: HandleConfig) -> Result<(), EngineError> {
        let engine = &*self.engine;
        let mut sched = Scheduler::new(engine, config.scheduler)?;
        if let Some(disk) = config.disk_tier {
            let dir = disk.dir.clone();
            if let Err(e) = sched.attach_disk_tier(disk) {
                tracing::error!("state dir {}: {e}; conversations are kept in RAM only", dir.display());
            }
            self.shared.set_disk(sched.disk_stats());
        }
        let mut file = config.trace.and_then(|t| TraceFile::open(t, engine)).map(|(file, log)| {
            sched.record_routes(log);
            file
        });
        let mut live: HashMap<u64, UnboundedSender<Event>> = HashMap::new();
        loop {
            warn_all(&mut sched, engine);
            if let (Some(f), Some(log)) = (file.as_mut(), sched.routes()) {
                f.maybe_write(log, sched.is_idle());
            }
            if sched.is_idle() {
                // Nothing to do: wait for a job, or end once the handle is gone.
                match self.commands.recv() {
                    Ok(command) => self.admit(&mut sched, &mut live, command),
                    Err(_) => break,
                }
            }
            while let Ok(command) = self.commands.try_recv() {
                self.admit(&mut sched, &mut live, command);
            }
            let report = sched.step();
            self.shared.stepped(&sched, &report);
            report_ends(report, &mut live);
        }
        match (file.as_mut(), sched.routes()) {
            (Some(f), Some(log)) => f.write(log),
            _ => Ok(()),
        }
    }

    /// Hands a job to the scheduler, or fails it at once when refused (the
    /// handle checked it already, so this is unlikely).
    fn admit<'e>(&self, sched: &mut Scheduler<'e>, live: &mut HashMap<u64, UnboundedSender<Event>>, command: Command) {
        let Command { job, events, cancel } = command;
        let prompt_tokens = job.prompt.len();
        let sink = JobSink {
            events: events.clone(),
            cancel,
            shared: self.shared.clone(),
        };
        match sched.submit(job, Box::new(sink)) {
            Ok(id) => {
                self.shared.accepted(prompt_tokens);
                live.insert(id, events);
            }
            Err(e) => {
                let _ = events.send(Event::Failed(e));
            }
        }
    }
}

/// Forgets the jobs that ended and tells the failed ones why.
fn report_ends(report: StepReport, live: &mut HashMap<u64, UnboundedSender<Event>>) {
    for id in report.finished {
        live.remove(&id);
    }
    for failure in report.failed {
        if let Some(events) = live.remove(&failure.id) {
            let _ = events.send(Event::Failed(failure.error));
        }
    }
}

/// Logs the disk tier's and the engine's warnings since the last call.
fn warn_all(sched: &mut Scheduler<'_>, engine: &Engine) {
    for w in sched.take_disk_warnings().into_iter().chain(engine.take_warnings()) {
        tracing::warn!("{w}");
    }
}
