//! The speculative decode loop: draft, verify in one batched forward,
//! accept (larder-spec's rules), take the state back to what was kept.
//!
//! A verification pass runs `[pending, d1..dk]` (pending: the last chosen
//! token, not yet fed). Row `i` of its logits is the target's distribution
//! after `d_i` (row 0: after pending), exactly what one-token steps would
//! give (batch invariance). Drafts are kept while accepted; the first
//! rejected one is replaced by the target's token, or, if all are kept, the
//! target adds one more from the last row. The state goes back to
//! `pending + kept drafts` through [`larder_spec::rewind`] from a snapshot
//! taken before the pass (a truncation for KV; restore and re-run for a
//! recurrent layer); the replacement/bonus token becomes pending.

use std::time::Instant;

use larder_model::{RouteTrace, SequenceState};
use larder_spec::{accept_draft, rewind, AdaptiveK, Decision, Drafter, SpecStats};

use super::{Engine, FinishReason, GenerateOptions};
use crate::error::EngineError;
use crate::sampling::Sampler;
use crate::stats::{SpeculativeStats, Stats};

pub(super) struct Run<'a> {
    pub engine: &'a Engine,
    pub prompt: &'a [u32],
    pub opts: &'a GenerateOptions,
    pub started: Instant,
}

enum Flow {
    Go,
    Stop(FinishReason),
}

impl Run<'_> {
    /// Records a chosen token; says whether generation goes on.
    fn emit(&self, t: u32, ids: &mut Vec<u32>, stats: &mut Stats, on_token: &mut dyn FnMut(u32) -> bool) -> Flow {
        ids.push(t);
        if ids.len() == 1 {
            stats.time_to_first_token_s = self.started.elapsed().as_secs_f64();
        }
        if !on_token(t) {
            return Flow::Stop(FinishReason::Cancelled);
        }
        if self.opts.stop_at_eos && self.engine.generation.eos_token_ids.contains(&t) {
            return Flow::Stop(FinishReason::Stop);
        }
        if ids.len() >= self.opts.max_new {
            return Flow::Stop(FinishReason::Length);
        }
        Flow::Go
    }

    #[allow(clippy::too_many_arguments)]
    pub fn decode(
        &self,
        drafter: &mut dyn Drafter,
        sampler: &mut Sampler,
        state: &mut SequenceState,
        logits: Vec<f32>,
        stats: &mut Stats,
        on_token: &mut dyn FnMut(u32) -> bool,
        mut trace: Option<&mut RouteTrace>,
    ) -> Result<(Vec<u32>, FinishReason), EngineError> {
        let model = &self.engine.model;
        let max_ctx = model.spec().max_position_embeddings;
        let mut spec = SpecStats {
            drafter: drafter.name().to_string(),
            ..SpecStats::default()
        };
        let mut adapt = AdaptiveK::new(self.opts.draft_max);
        let mut ids = Vec::new();
        let mut context = self.prompt.to_vec();
        let mut finish = FinishReason::Length;
        if self.opts.max_new == 0 {
            return Ok((ids, finish));
        }
        let mut pending = sampler.sample(&logits);
        context.push(pending);
        if let Flow::Stop(r) = self.emit(pending, &mut ids, stats, on_token) {
            return Ok(self.done(ids, r, stats, spec, adapt.is_off()));
        }
        loop {
            if state.len() + 1 > max_ctx {
                finish = FinishReason::Length;
                break;
            }
            // Never draft past max_new or the context.
            let room = (self.opts.max_new - ids.len()).min(max_ctx - state.len() - 1);
            // The first decode step is plain: it calibrates what a token costs without drafting.
            let k = if spec.target_steps == 0 { 0 } else { adapt.k().min(room) };
            let mut drafts = Vec::new();
            if k > 0 {
                let t = Instant::now();
                drafts = drafter.propose(&context, k).map_err(|e| EngineError::Invalid {
                    field: "draft",
                    message: e.to_string(),
                })?;
                drafts.truncate(k);
                spec.draft_s += t.elapsed().as_secs_f64();
            }
            let step = Instant::now();
            if drafts.is_empty() {
                let l = model.forward_last(&[pending], state, trace.as_deref_mut())?;
                let secs = step.elapsed().as_secs_f64();
                stats.decode_s += secs;
                spec.target_steps += 1;
                adapt.plain_step(secs);
                pending = sampler.sample(&l);
                context.push(pending);
                if let Flow::Stop(r) = self.emit(pending, &mut ids, stats, on_token) {
                    finish = r;
                    break;
                }
                continue;
            }
            let before = state.snapshot();
            let rows: Vec<u32> = std::iter::once(pending).chain(drafts.iter().copied()).collect();
            let all = model.forward(&rows, state, trace.as_deref_mut())?;
            let secs = step.elapsed().as_secs_f64();
            stats.decode_s += secs;
            spec.target_steps += 1;
            spec.verify_steps += 1;
            spec.drafted += drafts.len() as u64;
            let mut kept = 0;
            let mut stop = None;
            for i in 0..=drafts.len() {
                let dist = sampler.distribution(all.row(i));
                let (token, accepted) = if i == drafts.len() {
                    (sampler.draw(&dist), false)
                } else {
                    let u = sampler.uniform();
                    match accept_draft(&dist, drafts[i], u, &mut |r| sampler.draw(r)) {
                        Decision::Accept => (drafts[i], true),
                        Decision::Replace(t) => (t, false),
                    }
                };
                context.push(token);
                if accepted {
                    kept += 1;
                }
                if let Flow::Stop(r) = self.emit(token, &mut ids, stats, on_token) {
                    stop = Some(r);
                    break;
                }
                if !accepted {
                    pending = token;
                    break;
                }
            }
            spec.accepted += kept as u64;
            adapt.verified(drafts.len(), kept, secs);
            rewind(state, &before, &rows, before.len() + 1 + kept, |kept_rows, state| {
                model.forward_last(kept_rows, state, None).map(drop)
            })?;
            if let Some(r) = stop {
                finish = r;
                break;
            }
        }
        Ok(self.done(ids, finish, stats, spec, adapt.is_off()))
    }

    fn done(&self, ids: Vec<u32>, finish: FinishReason, stats: &mut Stats, mut spec: SpecStats, off: bool) -> (Vec<u32>, FinishReason) {
        spec.disabled = off;
        stats.new_tokens = ids.len();
        // Tokens after the first per second of target forwards (several per verification pass).
        stats.finish(ids.len().saturating_sub(1));
        stats.speculative = Some(SpeculativeStats::from(&spec));
        (ids, finish)
    }
}
