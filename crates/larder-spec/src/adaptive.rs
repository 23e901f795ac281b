//! How many tokens to draft: start small, grow while drafts are kept,
//! shrink when they are not, and stop drafting for the request when a
//! verification pass costs more than the tokens it yields would cost one
//! plain step at a time.

/// Draft-length controller for one request.
#[derive(Debug, Clone)]
pub struct AdaptiveK {
    k: usize,
    max: usize,
    off: bool,
    plain_s: Option<f64>,
    verify_s: f64,
    verify_tokens: f64,
    verifies: usize,
}

/// Verification passes before the cost check may switch drafting off.
const WARMUP: usize = 4;

impl AdaptiveK {
    pub fn new(max: usize) -> Self {
        AdaptiveK {
            k: 2.min(max.max(1)),
            max: max.max(1),
            off: false,
            plain_s: None,
            verify_s: 0.0,
            verify_tokens: 0.0,
            verifies: 0,
        }
    }

    /// Tokens to draft next (0 when drafting is off).
    pub fn k(&self) -> usize {
        if self.off {
            0
        } else {
            self.k
        }
    }

    pub fn is_off(&self) -> bool {
        self.off
    }

    /// A plain one-token target step took `secs`.
    pub fn plain_step(&mut self, secs: f64) {
        self.plain_s = Some(self.plain_s.map_or(secs, |p| 0.8 * p + 0.2 * secs));
    }

    /// A verification pass of `drafted` tokens kept `accepted` and took `secs`.
    pub fn verified(&mut self, drafted: usize, accepted: usize, secs: f64) {
        self.verifies += 1;
        self.verify_s += secs;
        self.verify_tokens += accepted as f64 + 1.0;
        if accepted == drafted {
            self.k = (self.k + 1).min(self.max);
        } else if accepted == 0 {
            self.k = (self.k / 2).max(1);
        }
        if let Some(plain) = self.plain_s {
            // Seconds per token with drafting vs. without.
            if self.verifies >= WARMUP && self.verify_s / self.verify_tokens > plain {
                self.off = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_shrinks_and_switches_off() {
        let mut a = AdaptiveK::new(8);
        assert_eq!(a.k(), 2);
        a.verified(2, 2, 0.01);
        a.verified(3, 3, 0.01);
        assert_eq!(a.k(), 4);
        a.verified(4, 0, 0.01);
        assert_eq!(a.k(), 2);
        let mut b = AdaptiveK::new(8);
        b.plain_step(0.01);
        for _ in 0..4 {
            b.verified(2, 0, 0.02); // one token per 20 ms vs. 10 ms plain
        }
        assert!(b.is_off() && b.k() == 0);
        let mut c = AdaptiveK::new(8);
        c.plain_step(0.01);
        for _ in 0..4 {
            c.verified(4, 4, 0.02); // five tokens per 20 ms
        }
        assert!(!c.is_off());
    }
}
