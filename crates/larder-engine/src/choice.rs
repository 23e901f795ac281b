//! How one request chooses each token from the model's logits, around the
//! [`Sampler`]: OpenAI's sampling-time adjustments ([`LogitAdjustments`]:
//! `logit_bias`, `frequency_penalty`, `presence_penalty`), the request's
//! [`TokenConstraint`] (tokens it forbids get probability 0), and the
//! log-probabilities it reports ([`TokenLogprob`]).
//!
//! The model's logits are never changed: adjustments apply to a copy that
//! only sampling sees, and logprobs are the log-softmax of the model's own
//! f32 logits (before bias, penalties, temperature and the constraint: what
//! vLLM reports by default, and what `larder forward` gives), so a token's
//! logprob equals the log-softmax of `forward`'s logits at its position,
//! whatever the batch, the streaming or the drafter. [`log_softmax`] is that
//! function: computed in f64 from the f32 logits, rounded to f32 once.
//!
//! Every chosen token goes through [`TokenChooser::commit`] in the order it
//! is chosen (a plain step, or each accepted draft and the replacement or
//! bonus token of a verification pass), so the counts the penalties use and
//! the constraint's state are those of a request decoding alone.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use crate::constraint::TokenConstraint;
use crate::error::EngineError;
use crate::sampling::Sampler;

/// OpenAI's sampling-time adjustments of one request: the logits sampling
/// sees are `logit[t] + logit_bias[t] - count[t] * frequency_penalty -
/// (count[t] > 0) * presence_penalty`, `count[t]` the times `t` was
/// generated so far in this request (the prompt does not count).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogitAdjustments {
    /// Token id to a bias in [-100, 100] added to its logit.
    pub logit_bias: BTreeMap<u32, f32>,
    /// In [-2, 2]; 0 is off.
    pub frequency_penalty: f32,
    /// In [-2, 2]; 0 is off.
    pub presence_penalty: f32,
}

impl LogitAdjustments {
    /// Whether sampling sees the model's logits unchanged.
    pub fn is_none(&self) -> bool {
        self.logit_bias.is_empty() && self.frequency_penalty == 0.0 && self.presence_penalty == 0.0
    }

    /// Rejects values OpenAI refuses, and biased ids outside a vocabulary of `vocab` tokens.
    pub(crate) fn validate(&self, vocab: usize) -> Result<(), EngineError> {
        for (field, v) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return Err(EngineError::Invalid {
                    field,
                    message: format!("{v} must be in [-2, 2]"),
                });
            }
        }
        for (&token, &bias) in &self.logit_bias {
            if !(-100.0..=100.0).contains(&bias) {
                return Err(EngineError::Invalid {
                    field: "logit_bias",
                    message: format!("bias {bias} of token {token} must be in [-100, 100]"),
                });
            }
            if token as usize >= vocab {
                return Err(EngineError::Invalid {
                    field: "logit_bias",
                    message: format!("token {token} is outside the vocabulary of {vocab} tokens"),
                });
            }
        }
        Ok(())
    }
}

/// Most `top_logprobs` a request may ask for (OpenAI's bound).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A generated token's log-probability under the model, and the best
/// alternatives at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    /// `log_softmax(logits)[token]` of the model's logits at its position.
    pub logprob: f32,
    /// The `top_logprobs` most likely tokens there and their logprobs, most
    /// likely first (ties to the lower id); empty when none were asked for.
    pub top: Vec<(u32, f32)>,
}

/// The log-softmax of `logits`: `l - max - ln(sum(exp(l - max)))` in f64,
/// rounded to f32 (the function every reported logprob comes from).
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let norm = LogNorm::of(logits);
    logits.iter().map(|&l| norm.logprob(l)).collect()
}

/// The max and log of the normaliser of a row of logits.
struct LogNorm {
    max: f64,
    log_sum: f64,
}

impl LogNorm {
    fn of(logits: &[f32]) -> LogNorm {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
        LogNorm { max, log_sum: sum.ln() }
    }

    fn logprob(&self, l: f32) -> f32 {
        (l as f64 - self.max - self.log_sum) as f32
    }
}

/// `token`'s logprob in `logits` and the `top` best (most likely first, ties to the lower id).
pub(crate) fn token_logprob(logits: &[f32], token: u32, top: usize) -> TokenLogprob {
    let norm = LogNorm::of(logits);
    let logprob = logits.get(token as usize).map_or(f32::NEG_INFINITY, |&l| norm.logprob(l));
    let order = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    let top = top.min(ids.len());
    if top > 0 && top < ids.len() {
        ids.select_nth_unstable_by(top - 1, order);
    }
    ids.truncate(top);
    ids.sort_by(order);
    TokenLogprob {
        token,
        logprob,
        top: ids.into_iter().map(|t| (t, norm.logprob(logits[t as usize]))).collect(),
    }
}

/// Chooses one request's tokens: its sampler, adjustments, constraint and
/// the counts of what it generated.
pub(crate) struct TokenChooser {
    sampler: Sampler,
    adjust: LogitAdjustments,
    counts: HashMap<u32, u32>,
    constraint: Option<Box<dyn TokenConstraint>>,
    /// The constraint's mask for the position being chosen.
    mask: Vec<bool>,
    /// `Some(n)`: report logprobs with the `n` best alternatives.
    logprobs: Option<usize>,
}

impl TokenChooser {
    pub(crate) fn new(
        sampler: Sampler,
        adjust: LogitAdjustments,
        constraint: Option<Box<dyn TokenConstraint>>,
        logprobs: Option<usize>,
    ) -> Self {
        TokenChooser {
            sampler,
            adjust,
            counts: HashMap::new(),
            constraint,
            mask: Vec::new(),
            logprobs,
        }
    }

    /// The logits sampling sees (the model's when nothing adjusts them).
    fn adjusted<'a>(&self, logits: &'a [f32]) -> Cow<'a, [f32]> {
        if self.adjust.is_none() {
            return Cow::Borrowed(logits);
        }
        let mut out = logits.to_vec();
        for (&t, &bias) in &self.adjust.logit_bias {
            if let Some(l) = out.get_mut(t as usize) {
                *l += bias;
            }
        }
        for (&t, &count) in &self.counts {
            if let Some(l) = out.get_mut(t as usize) {
                *l -= count as f32 * self.adjust.frequency_penalty + self.adjust.presence_penalty;
            }
        }
        out.into()
    }

    /// The distribution the next token is drawn from (as
    /// [`Sampler::distribution`]), over the adjusted logits and only the
    /// tokens the constraint allows. Asks the constraint for its mask: call
    /// once per position, then [`commit`](Self::commit) the token chosen.
    pub(crate) fn distribution(&mut self, logits: &[f32]) -> Result<Vec<(u32, f64)>, EngineError> {
        let adjusted = self.adjusted(logits);
        let allowed = match &mut self.constraint {
            None => None,
            Some(constraint) => {
                self.mask.clear();
                self.mask.resize(logits.len(), false);
                constraint.allowed(&mut self.mask)?;
                if !self.mask.contains(&true) {
                    return Err(EngineError::Constraint(crate::ConstraintError(
                        "the constraint allows no token at this position".into(),
                    )));
                }
                Some(self.mask.as_slice())
            }
        };
        Ok(self.sampler.distribution_over(&adjusted, allowed))
    }

    /// Chooses the next token from `logits` (not yet committed).
    pub(crate) fn sample(&mut self, logits: &[f32]) -> Result<u32, EngineError> {
        let dist = self.distribution(logits)?;
        Ok(self.sampler.draw(&dist))
    }

    /// A uniform draw from the request's generator (speculative acceptance).
    pub(crate) fn uniform(&mut self) -> f64 {
        self.sampler.uniform()
    }

    /// Draws from a distribution.
    pub(crate) fn draw(&mut self, dist: &[(u32, f64)]) -> u32 {
        self.sampler.draw(dist)
    }

    /// Records `token` as chosen at the position last asked for.
    pub(crate) fn commit(&mut self, token: u32) -> Result<(), EngineError> {
        *self.counts.entry(token).or_insert(0) += 1;
        if let Some(constraint) = &mut self.constraint {
            constraint.commit(token)?;
        }
        Ok(())
    }

    /// Whether the constraint says the output is complete.
    pub(crate) fn is_done(&self) -> bool {
        self.constraint.as_ref().is_some_and(|c| c.is_done())
    }

    /// `token`'s logprob at a position with these model `logits`, when the request asks for them.
    pub(crate) fn logprob(&self, logits: &[f32], token: u32) -> Option<TokenLogprob> {
        self.logprobs.map(|top| token_logprob(logits, token, top))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::constraint::ConstraintError;
    use crate::sampling::SamplingParams;

    struct EvenOnly;

    impl TokenConstraint for EvenOnly {
        fn allowed(&mut self, allowed: &mut [bool]) -> Result<(), ConstraintError> {
            allowed.iter_mut().step_by(2).for_each(|a| *a = true);
            Ok(())
        }
        fn commit(&mut self, token: u32) -> Result<(), ConstraintError> {
            if token % 2 == 1 {
                return Err(ConstraintError(format!("odd token {token}")));
            }
            Ok(())
        }
    }

    fn chooser(temperature: f32, adjust: LogitAdjustments, constraint: Option<Box<dyn TokenConstraint>>) -> TokenChooser {
        let params = SamplingParams {
            temperature,
            seed: 5,
            ..SamplingParams::default()
        };
        TokenChooser::new(Sampler::new(params).unwrap(), adjust, constraint, Some(2))
    }

    #[test]
    fn log_softmax_sums_to_one_and_keeps_order() {
        let logits = [1.0f32, 3.0, -2.0, 3.0];
        let lp = log_softmax(&logits);
        let total: f64 = lp.iter().map(|&l| (l as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        let r = token_logprob(&logits, 0, 2);
        assert_eq!(r.logprob, lp[0]);
        assert_eq!(r.top, vec![(1, lp[1]), (3, lp[3])]);
        assert_eq!(token_logprob(&logits, 2, 0).top, vec![]);
        assert_eq!(token_logprob(&logits, 2, 9).top.len(), 4);
    }

    #[test]
    fn constraint_masks_greedy_and_sampling() {
        let logits = [0.0f32, 9.0, 1.0, 8.0, 0.5];
        let mut g = chooser(0.0, LogitAdjustments::default(), Some(Box::new(EvenOnly)));
        assert_eq!(g.sample(&logits).unwrap(), 2);
        let mut s = chooser(1.0, LogitAdjustments::default(), Some(Box::new(EvenOnly)));
        for _ in 0..200 {
            let t = s.sample(&logits).unwrap();
            assert_eq!(t % 2, 0);
            s.commit(t).unwrap();
        }
        assert!(s.commit(1).is_err());
    }

    #[test]
    fn bias_and_penalties_shift_what_is_sampled() {
        let logits = [1.0f32, 2.0, 0.0];
        let bias = LogitAdjustments {
            logit_bias: BTreeMap::from([(2, 5.0)]),
            ..LogitAdjustments::default()
        };
        assert_eq!(chooser(0.0, bias, None).sample(&logits).unwrap(), 2);
        // A presence penalty of 1.5 makes a repeat of token 1 lose to token 0.
        let presence = LogitAdjustments {
            presence_penalty: 1.5,
            ..LogitAdjustments::default()
        };
        let mut c = chooser(0.0, presence, None);
        assert_eq!(c.sample(&logits).unwrap(), 1);
        c.commit(1).unwrap();
        assert_eq!(c.sample(&logits).unwrap(), 0);
        // A frequency penalty grows with the count: 0.6 after two repeats.
        let frequency = LogitAdjustments {
            frequency_penalty: 0.6,
            ..LogitAdjustments::default()
        };
        let mut c = chooser(0.0, frequency, None);
        c.commit(1).unwrap();
        assert_eq!(c.sample(&logits).unwrap(), 1);
        c.commit(1).unwrap();
        assert_eq!(c.sample(&logits).unwrap(), 0);
    }

    #[test]
    fn adjustments_are_validated() {
        let bad = |a: LogitAdjustments| a.validate(10).err().map(|e| e.to_string()).unwrap_or_default();
        let bias = |t, b| LogitAdjustments {
            logit_bias: BTreeMap::from([(t, b)]),
            ..LogitAdjustments::default()
        };
        assert!(bad(bias(3, 101.0)).contains("logit_bias"));
        assert!(bad(bias(10, 1.0)).contains("outside the vocabulary"));
        assert!(bad(LogitAdjustments {
            presence_penalty: 2.5,
            ..LogitAdjustments::default()
        })
        .contains("presence_penalty"));
        assert!(bias(3, -100.0).validate(10).is_ok());
    }
}
