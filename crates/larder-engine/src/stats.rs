//! The statistics every generation reports (`stats` in `larder run --json`).

use serde::Serialize;

/// Timing and throughput of one generation.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Stats {
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    /// Time to run the prompt through the model (to the first token's logits).
    pub prefill_s: f64,
    /// Time of every later forward pass (one per token after the first).
    pub decode_s: f64,
    /// Prompt tokens per second of prefill.
    pub prefill_tok_per_s: f64,
    /// Steady decode rate: forward passes after the first token per second.
    pub decode_tok_per_s: f64,
    /// From the start of the request to the first new token.
    pub time_to_first_token_s: f64,
}

impl Stats {
    /// Fills the derived rates.
    pub fn finish(&mut self, decode_steps: usize) {
        self.prefill_tok_per_s = rate(self.prompt_tokens, self.prefill_s);
        self.decode_tok_per_s = rate(decode_steps, self.decode_s);
    }
}

fn rate(n: usize, s: f64) -> f64 {
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}
