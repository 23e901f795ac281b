//! Prompt lookup: if the last few tokens appeared earlier in the context,
//! guess that what followed them then follows them now. No model, no I/O;
//! strong on text that repeats or quotes its prompt.

use crate::{Drafter, SpecError};

/// N-gram prompt-lookup drafter.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NgramDrafter {
    /// Longest suffix tried first.
    pub max_n: usize,
    /// Shortest suffix accepted as a match.
    pub min_n: usize,
}

impl Default for NgramDrafter {
    fn default() -> Self {
        NgramDrafter { max_n: 4, min_n: 2 }
    }
}

impl Drafter for NgramDrafter {
    fn name(&self) -> &'static str {
        "ngram"
    }

    fn propose(&mut self, context: &[u32], k: usize) -> Result<Vec<u32>, SpecError> {
        let len = context.len();
        for n in (self.min_n.max(1)..=self.max_n.min(len.saturating_sub(1))).rev() {
            let suffix = &context[len - n..];
            // The most recent earlier occurrence that has a continuation.
            if let Some(start) = (0..len - n).rev().find(|&i| &context[i..i + n] == suffix) {
                let from = start + n;
                let end = (from + k).min(len);
                if from < end {
                    return Ok(context[from..end].to_vec());
                }
            }
        }
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continues_the_latest_match() {
        let mut d = NgramDrafter::default();
        let ctx = [1, 2, 3, 4, 5, 9, 1, 2, 3];
        assert_eq!(d.propose(&ctx, 3).unwrap(), vec![4, 5, 9]);
        assert_eq!(d.propose(&ctx, 1).unwrap(), vec![4]);
        assert_eq!(d.propose(&[1, 2, 3], 3).unwrap(), Vec::<u32>::new());
        // The longest matching suffix wins.
        let ctx = [7, 8, 1, 2, 9, 8, 1, 2];
        assert_eq!(d.propose(&ctx, 2).unwrap(), vec![9, 8]);
    }
}
