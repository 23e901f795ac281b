//! larder-spec: speculative decoding. A [`Drafter`] guesses the next few
//! tokens cheaply; the target model verifies all of them in **one** batched
//! forward pass (reading the union of their experts once), and the
//! acceptance rules here decide what is kept:
//!
//! - greedy: a drafted token is kept while it equals the target's own
//!   argmax; the target's token follows the last kept one. Batch invariance
//!   makes the logits of a verification pass identical to one-token steps,
//!   so greedy speculative output is identical to plain decoding;
//! - sampling: drafts are deterministic guesses (a point mass), so the
//!   standard speculative-sampling rule becomes: keep draft `d` with
//!   probability `p(d)`, otherwise sample from `p` with `d` removed and
//!   renormalised. The output distribution is exactly the target's.
//!
//! [`AdaptiveK`] sizes drafts from measured acceptance and step cost and
//! turns drafting off for a request when it stops paying.
//!
//! Drafters: [`NgramDrafter`] (prompt lookup), [`ModelDrafter`] (a small
//! model sharing the target's vocabulary, with its own state, or the
//! target itself using only RAM-resident experts: [`ModelDrafter::self_draft`]).
//!
//! After speculative tokens were run, a state goes back to the kept prefix
//! only through [`rewind`](rewind()) (snapshot before, rewind after): its
//! documentation says how that works for KV and for recurrent layers.

mod accept;
mod adaptive;
mod model;
mod ngram;
mod rewind;

// Acceptance rules and draft sizing.
pub use accept::{accept_draft, Decision, Resample};
pub use adaptive::AdaptiveK;
// Drafters.
pub use model::ModelDrafter;
pub use ngram::NgramDrafter;
// Taking a state back to the kept prefix.
pub use rewind::{refeed, rewind};

/// Errors from drafters.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    #[error("draft model: {0}")]
    Model(#[from] larder_model::ModelError),
    #[error("{0}")]
    Invalid(String),
}

/// Guesses the tokens that follow a context.
pub trait Drafter: Send {
    /// A short name for stats (`ngram`, `model`, ...).
    fn name(&self) -> &'static str;
    /// Up to `k` guessed tokens following `context` (the prompt and every
    /// token generated so far). Drafters keep whatever state they like
    /// between calls but must answer for any context (the target may have
    /// rejected part of the previous guess).
    fn propose(&mut self, context: &[u32], k: usize) -> Result<Vec<u32>, SpecError>;
}

/// Counters of one request's speculative decoding.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct SpecStats {
    pub drafter: String,
    /// Tokens proposed.
    pub drafted: u64,
    /// Proposed tokens the target kept.
    pub accepted: u64,
    /// Verification passes (target forwards over drafted tokens).
    pub verify_steps: u64,
    /// All target forwards during decode (verification and plain steps).
    pub target_steps: u64,
    /// Time spent drafting.
    pub draft_s: f64,
    /// Whether drafting was switched off during the request (it stopped paying).
    pub disabled: bool,
}

impl SpecStats {
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    /// Drafted tokens kept per verification pass.
    pub fn mean_accepted(&self) -> f64 {
        if self.verify_steps == 0 {
            0.0
        } else {
            self.accepted as f64 / self.verify_steps as f64
        }
    }
}
