//! One request run to its end on the caller's thread: [`Engine::run`] (a
//! [`Job`] through a [`Scheduler`] of its own: one sequence, no prefix
//! cache) and [`Engine::generate`] (prompt ids and a per-token callback over
//! it). The same path as batched serving, so what a request gives here it
//! gives in any batch ([`EngineHandle`](crate::EngineHandle) runs the
//! scheduler on an engine thread for concurrent requests).

use super::{Engine, GenerateOptions, Generation};
use crate::error::EngineError;
use crate::request::{Job, Outcome, RequestEvent, RequestSink};
use crate::scheduler::{Scheduler, SchedulerConfig};

/// Passes events on to the caller's sink and keeps the outcome.
struct Capture<'a> {
    sink: &'a mut dyn RequestSink,
    outcome: &'a mut Option<Outcome>,
}

impl RequestSink for Capture<'_> {
    fn event(&mut self, event: RequestEvent<'_>) -> bool {
        if let RequestEvent::Finished(outcome) = &event {
            *self.outcome = Some((*outcome).clone());
        }
        self.sink.event(event)
    }

    fn cancelled(&self) -> bool {
        self.sink.cancelled()
    }
}

impl Engine {
    /// Runs `job` alone to its end on this thread, streaming its events to
    /// `sink` (which cancels by returning `false`); returns its outcome. An
    /// error when the job is refused (see [`KvCosts::check`](crate::KvCosts::check):
    /// prompt, context, sampling, stop strings) or fails while it runs.
    pub fn run(&self, job: Job, sink: &mut dyn RequestSink) -> Result<Outcome, EngineError> {
        let config = SchedulerConfig {
            max_batch: 1,
            prefix_cache: 0,
            ..SchedulerConfig::default()
        };
        let mut outcome = None;
        {
            let mut sched = Scheduler::new(self, config)?;
            let capture = Capture {
                sink,
                outcome: &mut outcome,
            };
            sched.submit(job, Box::new(capture))?;
            while !sched.is_idle() {
                if let Some(failure) = sched.step().failed.into_iter().next() {
                    return Err(failure.error);
                }
            }
        }
        outcome.ok_or_else(|| EngineError::Invalid {
            field: "prompt",
            message: "internal: the request ended without an outcome".into(),
        })
    }

    /// Generates after `prompt` (plain decoding, no stop strings): `on_token`
    /// sees each new id as it is chosen and returns `false` to stop.
    /// Generation also stops where the context is full (`opts.max_new` is
    /// capped to the room the prompt leaves).
    pub fn generate(
        &self,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Generation, EngineError> {
        self.generate_recorded(prompt, opts, on_token, None).map(|(g, _)| g)
    }

    /// [`generate`](Self::generate), appending the routes of every position
    /// (prompt and decode) to `trace` (router lookahead as deep as it asks).
    /// A thin wrapper kept for the decode benchmark: new code runs a [`Job`]
    /// with [`Job::record_routes`] and reads [`Outcome::routes`].
    pub fn generate_traced(
        &self,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_token: &mut dyn FnMut(u32) -> bool,
        trace: Option<&mut larder_model::RouteTrace>,
    ) -> Result<Generation, EngineError> {
        let Some(trace) = trace else {
            return self.generate(prompt, opts, on_token);
        };
        let (g, routes) = self.generate_recorded(prompt, opts, on_token, Some(trace.lookahead))?;
        if let Some(routes) = routes {
            for (layer, r) in routes.layers {
                trace.layers.entry(layer).or_default().extend(r);
            }
            for (key, p) in routes.predicted {
                trace.predicted.entry(key).or_default().extend(p);
            }
            trace.passes.extend(routes.passes);
        }
        Ok(g)
    }

    fn generate_recorded(
        &self,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_token: &mut dyn FnMut(u32) -> bool,
        record_routes: Option<usize>,
    ) -> Result<(Generation, Option<larder_model::RouteTrace>), EngineError> {
        let room = self.check_prompt(prompt, None)?;
        let job = Job {
            prompt: prompt.to_vec(),
            options: GenerateOptions {
                max_new: opts.max_new.min(room),
                ..opts.clone()
            },
            record_routes,
            ..Job::default()
        };
        let mut sink = |event: RequestEvent<'_>| match event {
            RequestEvent::Token { id, .. } => on_token(id),
            _ => true,
        };
        let outcome = self.run(job, &mut sink)?;
        let generation = Generation {
            ids: outcome.ids,
            finish_reason: outcome.finish_reason,
            stats: outcome.stats,
        };
        Ok((generation, outcome.routes))
    }
}
