//! Accepting drafted tokens against the target's distribution.

/// Draws a token from a `(token, probability)` distribution.
pub type Resample<'a> = dyn FnMut(&[(u32, f64)]) -> u32 + 'a;

/// What the target does with one drafted token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The draft is kept.
    Accept,
    /// The draft is rejected; this token (from the target) replaces it.
    Replace(u32),
}

/// Decides on draft `d` given the target's distribution `p` over candidate
/// tokens (`(token, probability)`, probabilities summing to one; greedy is a
/// single entry of probability 1) and a uniform draw `u` in [0, 1) for the
/// acceptance test, with `resample(residual)` drawing from the renormalised
/// residual when rejected.
///
/// Deterministic drafts make `q` a point mass on `d`, so speculative
/// sampling's `min(1, p(d)/q(d))` is `p(d)` and its residual
/// `norm(max(0, p - q))` is `p` without `d`: the kept-or-replaced token is
/// distributed exactly as `p`.
pub fn accept_draft(p: &[(u32, f64)], d: u32, u: f64, resample: &mut Resample<'_>) -> Decision {
    let pd = p.iter().find(|(t, _)| *t == d).map_or(0.0, |&(_, x)| x);
    if u < pd {
        return Decision::Accept;
    }
    let rest: f64 = p.iter().filter(|(t, _)| *t != d).map(|&(_, x)| x).sum();
    let residual: Vec<(u32, f64)> = p.iter().filter(|(t, _)| *t != d).map(|&(t, x)| (t, x / rest)).collect();
    if residual.is_empty() {
        // p is a point mass on d, so u < 1 = p(d) always accepts; unreachable in practice.
        return Decision::Accept;
    }
    Decision::Replace(resample(&residual))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first(r: &[(u32, f64)]) -> u32 {
        r[0].0
    }

    #[test]
    fn greedy_keeps_only_the_argmax() {
        let p = [(7u32, 1.0)];
        assert_eq!(accept_draft(&p, 7, 0.999, &mut first), Decision::Accept);
        assert_eq!(accept_draft(&p, 3, 0.0, &mut |_| 7), Decision::Replace(7));
    }

    #[test]
    fn sampling_accepts_with_p_and_resamples_the_rest() {
        let p = [(1u32, 0.5), (2, 0.3), (3, 0.2)];
        assert_eq!(accept_draft(&p, 2, 0.29, &mut first), Decision::Accept);
        let mut seen = Vec::new();
        let d = accept_draft(&p, 2, 0.31, &mut |r| {
            seen = r.to_vec();
            r[1].0
        });
        assert_eq!(d, Decision::Replace(3));
        assert!((seen[0].1 - 0.5 / 0.7).abs() < 1e-12 && (seen[1].1 - 0.2 / 0.7).abs() < 1e-12);
        // A draft outside the support is always replaced.
        assert_eq!(accept_draft(&p, 9, 0.0, &mut first), Decision::Replace(1));
    }
}
