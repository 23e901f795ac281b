//! What a request may sample next: a per-request filter over the vocabulary
//! (a JSON schema's grammar, a required tool call), applied to the model's
//! logits just before sampling. The logits themselves are never changed: a
//! constraint only says which tokens may be chosen, so greedy and seeded
//! runs stay reproducible, and a drafted token the constraint forbids is
//! rejected like any other mismatch.
//!
//! One trait, [`TokenConstraint`]: `allowed` fills a mask for the next
//! position, `commit` advances past the token chosen there.

use std::fmt;

/// Why a constraint cannot go on (the request fails with this message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConstraintError(pub String);

impl fmt::Display for ConstraintError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConstraintError {}

/// A filter over the next token, advanced token by token.
pub trait TokenConstraint: Send {
    /// Sets `allowed[t]` to whether token `t` may come next (`allowed` has
    /// one entry per vocabulary id, all `false` on entry). Called once per
    /// sampled position, before sampling; never called after [`is_done`]
    /// returns true.
    ///
    /// [`is_done`]: TokenConstraint::is_done
    fn allowed(&mut self, allowed: &mut [bool]) -> Result<(), ConstraintError>;

    /// The token chosen at the position [`allowed`](TokenConstraint::allowed)
    /// was last asked for (one the mask allowed).
    fn commit(&mut self, token: u32) -> Result<(), ConstraintError>;

    /// Whether the constrained output is complete: generation stops here
    /// (the request ends with `finish_reason: "stop"`).
    fn is_done(&self) -> bool {
        false
    }
}
