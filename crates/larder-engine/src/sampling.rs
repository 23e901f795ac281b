//! Choosing the next token from logits: greedy (argmax, ties to the lower
//! id, as `torch.argmax`), or temperature / top-k / top-p sampling with a
//! seeded ChaCha8 generator (reproducible across runs and platforms).
//! Filters apply in transformers' order: temperature, top-k, top-p.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::EngineError;

/// Sampling settings of one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1 = off).
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens (0 = off).
    pub top_k: usize,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Rejects values that have no meaning.
    pub(crate) fn validate(&self) -> Result<(), EngineError> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(EngineError::Invalid {
                field: "temperature",
                message: format!("{} must be a finite number >= 0", self.temperature),
            });
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(EngineError::Invalid {
                field: "top_p",
                message: format!("{} must be in (0, 1]", self.top_p),
            });
        }
        Ok(())
    }

    pub(crate) fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// Picks tokens for one generation.
pub(crate) struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
}

impl Sampler {
    pub(crate) fn new(params: SamplingParams) -> Result<Self, EngineError> {
        params.validate()?;
        Ok(Sampler {
            params,
            rng: ChaCha8Rng::seed_from_u64(params.seed),
        })
    }

    /// The next token id.
    #[cfg(test)]
    pub(crate) fn sample(&mut self, logits: &[f32]) -> u32 {
        let dist = self.distribution_over(logits, None);
        self.draw(&dist)
    }

    /// The distribution tokens are drawn from: `(token, probability)` in a
    /// fixed order (descending logit, ties to the lower id), after
    /// temperature, top-k and top-p; greedy is the argmax with probability 1.
    /// With `allowed` (one entry per token, at least one `true`) only the
    /// allowed tokens are candidates: masked before the filters, as a logit
    /// of minus infinity would be, so the filters and the renormalisation
    /// see only what may be sampled.
    pub(crate) fn distribution_over(&self, logits: &[f32], allowed: Option<&[bool]>) -> Vec<(u32, f64)> {
        let may = |i: usize| allowed.is_none_or(|a| a.get(i).copied().unwrap_or(false));
        if self.params.is_greedy() {
            let best = match allowed {
                None => argmax(logits),
                // The first maximum among allowed tokens (ties to the lower id).
                Some(_) => logits
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| may(i))
                    .fold(None, |best: Option<(usize, f32)>, (i, &l)| match best {
                        Some((_, b)) if l <= b => best,
                        _ => Some((i, l)),
                    })
                    .map_or(0, |(i, _)| i as u32),
            };
            return vec![(best, 1.0)];
        }
        let t = self.params.temperature;
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|&(i, _)| may(i))
            .map(|(i, &l)| (i as u32, l / t))
            .collect();
        if cand.is_empty() {
            return Vec::new();
        }
        // Descending by logit, ties to the lower id: a total, reproducible order.
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if self.params.top_k > 0 && self.params.top_k < cand.len() {
            cand.truncate(self.params.top_k);
        }
        let max = cand[0].1;
        let mut probs: Vec<f64> = cand.iter().map(|&(_, l)| ((l - max) as f64).exp()).collect();
        let sum: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= sum);
        if self.params.top_p < 1.0 {
            // Keep tokens while the mass before them is below top_p (always at least one).
            let mut mass = 0.0;
            let keep = probs
                .iter()
                .position(|&p| {
                    mass += p;
                    mass >= self.params.top_p as f64
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
            let s: f64 = probs.iter().sum();
            probs.iter_mut().for_each(|p| *p /= s);
        }
        cand.iter().zip(probs).map(|(&(t, _), p)| (t, p)).collect()
    }

    /// A uniform draw in [0, 1) from this request's generator (greedy: 0).
    pub(crate) fn uniform(&mut self) -> f64 {
        if self.params.is_greedy() {
            0.0
        } else {
            self.rng.random()
        }
    }

    /// Draws from a distribution (as [`distribution`](Self::distribution) returns).
    pub(crate) fn draw(&mut self, dist: &[(u32, f64)]) -> u32 {
        let u = self.uniform();
        let mut acc = 0.0;
        for &(t, p) in dist {
            acc += p;
            if u < acc {
                return t;
            }
        }
        dist.last().map_or(0, |&(t, _)| t)
    }
}

pub(crate) use larder_tensor::ops::argmax;

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_p: f32, top_k: usize, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_p,
            top_k,
            seed,
        }
    }

    #[test]
    fn greedy_takes_first_max() {
        let mut s = Sampler::new(SamplingParams::default()).unwrap();
        assert_eq!(s.sample(&[0.0, 2.0, 2.0, 1.0]), 1);
    }

    #[test]
    fn seeded_sampling_reproduces() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let run = |seed| {
            let mut s = Sampler::new(params(0.8, 0.9, 20, seed)).unwrap();
            (0..30).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_one_is_greedy() {
        let logits = [0.1, 3.0, 0.2, 2.9];
        let mut s = Sampler::new(params(1.5, 1.0, 1, 3)).unwrap();
        for _ in 0..20 {
            assert_eq!(s.sample(&logits), 1);
        }
    }

    #[test]
    fn top_p_drops_the_tail() {
        // p = [~0.67, ~0.24, ~0.09]: top_p 0.5 keeps only the first.
        let logits = [2.0, 1.0, 0.0];
        let mut s = Sampler::new(params(1.0, 0.5, 0, 1)).unwrap();
        for _ in 0..50 {
            assert_eq!(s.sample(&logits), 0);
        }
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let logits = [0.0f32, (2.0f32).ln(), (3.0f32).ln()]; // p = 1/6, 2/6, 3/6
        let mut s = Sampler::new(params(1.0, 1.0, 0, 42)).unwrap();
        let mut counts = [0usize; 3];
        let n = 60_000;
        for _ in 0..n {
            counts[s.sample(&logits) as usize] += 1;
        }
        for (c, p) in counts.iter().zip([1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0]) {
            assert!((*c as f64 / n as f64 - p).abs() < 0.01, "{counts:?}");
        }
    }

    #[test]
    fn rejects_bad_params() {
        assert!(Sampler::new(params(-1.0, 1.0, 0, 0)).is_err());
        assert!(Sampler::new(params(f32::NAN, 1.0, 0, 0)).is_err());
        assert!(Sampler::new(params(1.0, 0.0, 0, 0)).is_err());
        assert!(Sampler::new(params(1.0, 1.5, 0, 0)).is_err());
    }
}
