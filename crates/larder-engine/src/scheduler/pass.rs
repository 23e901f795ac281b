//! A step's forward pass: one `forward_batch` over every running sequence's
//! rows ([`PassOut`] per sequence), route recording (the scheduler's
//! [`RouteLog`](crate::RouteLog) and each request's own [`RouteTrace`]), and what happens
//! when the pass fails: the sequence at fault is removed, or, when the pass
//! cannot tell which one is, each runs alone so that only the ones whose
//! experts cannot be read fail.

use std::ops::Range;
use std::time::Instant;

use larder_model::{BatchSeq, RouteTrace, Wanted};
use larder_router::Phase;
use larder_tensor::Mat;

use super::{Failure, Scheduler, StepReport};
use crate::error::EngineError;
use crate::route_log::RowTag;

/// What a sequence's rows of a pass gave.
pub(super) enum PassOut {
    /// Prompt rows fed, no logits wanted yet.
    Fed,
    /// The last row's logits (a decode step, or the end of its feed).
    Last(Vec<f32>),
    /// Every row's logits (a verification pass: pending, then each draft).
    Verify(Mat),
}

/// A forward pass's error, with the index of the sequence at fault when one is.
type StepError = (Option<usize>, EngineError);

impl<'e> Scheduler<'e> {
    /// Runs the forward pass; a sequence at fault is removed and the rest
    /// run again (states are unchanged on error). `None` when none is left.
    pub(super) fn forward_or_fail(&mut self, report: &mut StepReport) -> Option<Vec<PassOut>> {
        loop {
            match self.forward() {
                Ok(out) => return Some(out),
                Err((Some(i), error)) => {
                    let s = self.running.remove(i);
                    report.failed.push(Failure { id: s.id, error });
                    if self.running.is_empty() {
                        return None;
                    }
                }
                Err((None, error)) if self.running.len() == 1 => {
                    let s = self.running.remove(0);
                    report.failed.push(Failure { id: s.id, error });
                    return None;
                }
                // Not one sequence's fault as far as the pass can tell (an
                // expert the source cannot send, say): each runs alone.
                Err((None, _)) => return self.forward_each_alone(report),
            }
        }
    }

    /// Runs every running sequence in a pass of its own (states are
    /// unchanged by the failed batch): the ones whose experts can be read go
    /// on with exactly the logits the batch would have given them (batch
    /// invariance, docs/design.md §3), the others fail with their own
    /// error. So a request needing an expert from a source that is down
    /// never takes the cached requests batched with it down too.
    fn forward_each_alone(&mut self, report: &mut StepReport) -> Option<Vec<PassOut>> {
        let all = std::mem::take(&mut self.running);
        let (mut kept, mut outs) = (Vec::with_capacity(all.len()), Vec::with_capacity(all.len()));
        for s in all {
            self.running.push(s);
            let outcome = self.forward();
            let Some(s) = self.running.pop() else { continue };
            match outcome {
                Ok(mut out) => {
                    outs.push(out.pop().unwrap_or(PassOut::Fed));
                    kept.push(s);
                }
                Err((_, error)) => report.failed.push(Failure { id: s.id, error }),
            }
        }
        self.running = kept;
        (!self.running.is_empty()).then_some(outs)
    }

    /// The trace tags of the rows of a pass over `inputs` (one per running
    /// sequence, in order).
    fn row_tags(&self, inputs: &[(Vec<u32>, Wanted)]) -> Vec<RowTag> {
        let mut tags = Vec::new();
        for (s, (ids, _)) in self.running.iter().zip(inputs) {
            let (start, prompt) = (s.state.len(), s.prompt.len());
            tags.extend((start..start + ids.len()).map(|pos| RowTag {
                seq: s.id as usize,
                pos,
                phase: if pos < prompt { Phase::Prompt } else { Phase::Decode },
            }));
        }
        tags
    }

    /// A recording for this pass, when the log or a request records routes:
    /// router lookahead as deep as the deepest of them asks.
    fn pass_recorder(&self) -> Option<RouteTrace> {
        let log = self.routes.as_ref().map(|log| log.recorder().lookahead);
        let jobs = self.running.iter().filter_map(|s| s.routes.as_ref().map(|r| r.lookahead));
        log.into_iter().chain(jobs).max().map(RouteTrace::with_lookahead)
    }

    /// One forward pass over every running sequence; per sequence what its
    /// rows gave.
    fn forward(&mut self) -> Result<Vec<PassOut>, StepError> {
        let chunk = self.config.prefill_chunk;
        let inputs: Vec<(Vec<u32>, Wanted)> = self.running.iter().map(|s| s.input(chunk)).collect();
        let mut recorder = self.pass_recorder();
        let tags = (self.routes.is_some() && recorder.is_some()).then(|| self.row_tags(&inputs));
        let started = Instant::now();
        let mut batch: Vec<BatchSeq<'_>> = self
            .running
            .iter_mut()
            .zip(&inputs)
            .map(|(s, (ids, wanted))| BatchSeq::new(ids, &mut s.state, *wanted))
            .collect();
        let out = self
            .engine
            .model()
            .forward_batch(&mut batch, recorder.as_mut())
            .map_err(|e| match e {
                larder_model::ModelError::Sequence { index, source } => (Some(index), EngineError::Model(*source)),
                e => (None, EngineError::Model(e)),
            })?;
        drop(batch);
        let secs = started.elapsed().as_secs_f64();
        if let Some(rt) = &recorder {
            self.record(rt, &inputs, tags.as_deref());
        }
        let mut result = Vec::with_capacity(out.len());
        for ((s, (ids, wanted)), m) in self.running.iter_mut().zip(&inputs).zip(out) {
            if let Some(snap) = s.state.take_marked() {
                s.points.keep(snap);
            }
            let last = s.next.is_some() || s.fed + ids.len() == s.feed.len();
            s.account(ids.len(), last, secs);
            if let Some(spec) = &mut s.spec {
                spec.timed(secs);
            }
            result.push(match (wanted, last) {
                (Wanted::All, _) => PassOut::Verify(m),
                (Wanted::Last, true) => PassOut::Last(m.into_vec()),
                (Wanted::Last, false) => PassOut::Fed,
            });
        }
        Ok(result)
    }

    /// Appends a successful pass's routes to the log (rows tagged by
    /// `tags`) and each recording request's rows to its own trace.
    fn record(&mut self, rt: &RouteTrace, inputs: &[(Vec<u32>, Wanted)], tags: Option<&[RowTag]>) {
        if let (Some(log), Some(tags)) = (self.routes.as_mut(), tags) {
            log.append(rt, |row| tags[row]);
        }
        let mut row = 0;
        for (s, (ids, _)) in self.running.iter_mut().zip(inputs) {
            if let Some(mine) = &mut s.routes {
                append_rows(mine, rt, row..row + ids.len());
            }
            row += ids.len();
        }
    }
}

/// Appends rows `rows` of the one-pass recording `pass` to `to` as a pass
/// of its own (router lookahead only as deep as `to` records).
fn append_rows(to: &mut RouteTrace, pass: &RouteTrace, rows: Range<usize>) {
    for (&layer, routes) in &pass.layers {
        if let Some(mine) = routes.get(rows.clone()) {
            to.layers.entry(layer).or_default().extend_from_slice(mine);
        }
    }
    for (&(target, depth), picks) in &pass.predicted {
        if depth <= to.lookahead {
            if let Some(mine) = picks.get(rows.clone()) {
                to.predicted.entry((target, depth)).or_default().extend_from_slice(mine);
            }
        }
    }
    to.passes.push(rows.len());
}
