//! What a request is and what it reports, for every way of running one
//! (the [`Scheduler`](crate::Scheduler), [`Engine::run`] on the caller's
//! thread, the [`EngineHandle`](crate::EngineHandle) on the engine thread).
//!
//! A [`Job`] says what to generate: prompt ids, [`GenerateOptions`], stop
//! strings, an optional drafter (speculative decoding), OpenAI's logit
//! adjustments, an optional [`TokenConstraint`], whether to report logprobs
//! and whether to record its routes. While it runs it streams [`RequestEvent`]s to a
//! [`RequestSink`]: each token with the text now safe to show (stop strings
//! removed, text held back while it may still start one), the text released
//! at the end, then the [`Outcome`] (finish reason, usage, stats). The sink
//! cancels by returning `false`, or from anywhere through
//! [`RequestSink::cancelled`]. [`Engine::check_prompt`] is the
//! context-length check a request passes before it starts; [`StopFilter`]
//! cuts stop strings out of streamed text.

use larder_model::RouteTrace;
use larder_spec::Drafter;

use crate::choice::{LogitAdjustments, TokenLogprob};
use crate::constraint::TokenConstraint;

use crate::engine::{Engine, FinishReason, GenerateOptions};
use crate::error::EngineError;
use crate::stats::Stats;

/// One request: what to generate (owned and `Send`: it may be handed to the
/// engine thread).
#[derive(Default)]
pub struct Job {
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
    /// Generation stops where any of these appears in the text; the stop
    /// string and what follows are not shown.
    pub stop: Vec<String>,
    /// Speculative decoding: a fresh drafter for this request (`None`: plain
    /// decoding). [`Drafting::drafter`](crate::Drafting::drafter) makes one
    /// from a user's choice. The model verifies every drafted token, so only
    /// speed changes (greedy ids are identical; sampling keeps its
    /// distribution, reproducible per seed).
    pub drafter: Option<Box<dyn Drafter>>,
    /// Record the routes of every position this request computes (prompt
    /// rest, decode, drafted rows), with router lookahead to this many MoE
    /// layers, into [`Outcome::routes`] (`None`: no recording).
    pub record_routes: Option<usize>,
    /// OpenAI's `logit_bias` and frequency / presence penalties, applied to
    /// the copy of the logits sampling sees.
    pub adjust: LogitAdjustments,
    /// What the request may sample (a grammar, a required tool call):
    /// forbidden tokens get probability 0, a drafted token it forbids is
    /// rejected, and generation stops with `Stop` once it is done.
    pub constraint: Option<Box<dyn TokenConstraint>>,
    /// Report each generated token's logprob with this many best
    /// alternatives (at most [`MAX_TOP_LOGPROBS`](crate::MAX_TOP_LOGPROBS);
    /// `None`: no logprobs).
    pub logprobs: Option<usize>,
    /// Spell special tokens in the streamed text (not the EOS that ends
    /// it): tool-call and reasoning markers that are special tokens
    /// (DeepSeek-V3, Kimi, gpt-oss) reach the output parsers. Default: left
    /// out, as `skip_special_tokens` does.
    pub keep_special_tokens: bool,
}

impl Job {
    /// A job generating from `prompt` with default options, no stop
    /// strings, no drafter and no route recording.
    pub fn new(prompt: Vec<u32>) -> Job {
        Job { prompt, ..Job::default() }
    }

    /// With these generation options.
    pub fn options(mut self, options: GenerateOptions) -> Job {
        self.options = options;
        self
    }

    /// Constrained by `constraint` (see [`Job::constraint`]).
    pub fn constraint(mut self, constraint: Box<dyn TokenConstraint>) -> Job {
        self.constraint = Some(constraint);
        self
    }

    /// With these logit adjustments (see [`Job::adjust`]).
    pub fn adjust(mut self, adjust: LogitAdjustments) -> Job {
        self.adjust = adjust;
        self
    }

    /// Reporting logprobs with `top` alternatives per token (see [`Job::logprobs`]).
    pub fn logprobs(mut self, top: usize) -> Job {
        self.logprobs = Some(top);
        self
    }

    /// With speculative decoding by `drafter` (`None`: plain decoding).
    pub fn drafter(mut self, drafter: Option<Box<dyn Drafter>>) -> Job {
        self.drafter = drafter;
        self
    }
}

/// What a running request reports.
#[derive(Debug)]
pub enum RequestEvent<'a> {
    /// A chosen token, the text now safe to show (often empty: held back
    /// while it may start a stop string, or an incomplete UTF-8 character)
    /// and its logprob when the job asked for them ([`Job::logprobs`]).
    Token {
        id: u32,
        text: &'a str,
        logprob: Option<&'a TokenLogprob>,
    },
    /// Text held back until the end, released because no stop string followed.
    Text(&'a str),
    /// The request ended (sent once, last; the sink's answer is ignored).
    Finished(&'a Outcome),
}

/// Receives a request's events; returns `false` to cancel it.
pub trait RequestSink {
    fn event(&mut self, event: RequestEvent<'_>) -> bool;

    /// Whether the request was cancelled from elsewhere (a client that left,
    /// a flag): asked before every step, queued or running. Never, by default.
    fn cancelled(&self) -> bool {
        false
    }
}

impl<F: FnMut(RequestEvent<'_>) -> bool> RequestSink for F {
    fn event(&mut self, event: RequestEvent<'_>) -> bool {
        self(event)
    }
}

/// How a request ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// New token ids (the EOS or the token completing a stop string included).
    pub ids: Vec<u32>,
    /// Every piece of text shown, stop strings removed.
    pub text: String,
    /// `Stop` for an EOS or a stop string, `Length`, or `Cancelled`.
    pub finish_reason: FinishReason,
    /// The stop string that ended generation, if one did.
    pub stop_string: Option<String>,
    pub prompt_tokens: usize,
    /// Prompt tokens whose state was reused from a kept conversation.
    pub cached_tokens: usize,
    pub stats: Stats,
    /// The routes it recorded ([`Job::record_routes`]), rows in the order
    /// they were computed (prompt rest, then each decode or verification
    /// pass, drafted rows included).
    pub routes: Option<RouteTrace>,
    /// Each new token's logprob, in order, when the job asked for them
    /// ([`Job::logprobs`]).
    pub logprobs: Option<Vec<TokenLogprob>>,
}

impl Engine {
    /// Checks a request's prompt before it starts: every id inside the
    /// vocabulary (an error on field `prompt`), and `max_tokens` plus the
    /// prompt within the model's context (field `max_tokens`). Returns the
    /// new tokens to allow: `max_tokens`, or the context left when `None`.
    pub fn check_prompt(&self, prompt: &[u32], max_tokens: Option<usize>) -> Result<usize, EngineError> {
        self.model().check_ids(prompt, 0).map_err(|e| EngineError::Invalid {
            field: "prompt",
            message: e.to_string(),
        })?;
        let context = self.model().spec().max_position_embeddings;
        let room = context.saturating_sub(prompt.len());
        match max_tokens {
            Some(n) if n > room => Err(EngineError::Invalid {
                field: "max_tokens",
                message: format!(
                    "max_tokens {n} plus the prompt's {} tokens exceed the model's context of {} tokens",
                    prompt.len(),
                    prompt.len() + room
                ),
            }),
            Some(n) => Ok(n),
            None => Ok(room),
        }
    }
}

/// Removes stop strings from streamed text: text that could still be the
/// start of a stop string is held back until it cannot.
pub(crate) struct StopFilter {
    stops: Vec<String>,
    held: String,
    done: bool,
    matched: Option<String>,
}

impl StopFilter {
    /// A filter for `stops`; an empty stop string is refused (it would match at once).
    pub(crate) fn new(stops: &[String]) -> Result<Self, EngineError> {
        if stops.iter().any(String::is_empty) {
            return Err(EngineError::Invalid {
                field: "stop",
                message: "an empty stop string would stop before the first token; give non-empty strings".into(),
            });
        }
        Ok(StopFilter {
            stops: stops.to_vec(),
            held: String::new(),
            done: false,
            matched: None,
        })
    }

    /// Adds generated text; returns the text safe to emit, and whether a stop string matched.
    pub(crate) fn push(&mut self, piece: &str) -> (String, bool) {
        if self.done {
            return (String::new(), true);
        }
        self.held.push_str(piece);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, _)| *at);
        if let Some((at, s)) = first {
            self.done = true;
            self.matched = Some(s.clone());
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, true);
        }
        // Hold back the longest suffix that is a prefix of a stop string.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| (1..s.len()).filter(|&n| s.is_char_boundary(n)).map(move |n| &s[..n]))
            .filter(|p| self.held.ends_with(p))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, false)
    }

    /// Text held back at the end of generation (no stop string followed).
    pub(crate) fn finish(&mut self) -> String {
        if self.done {
            String::new()
        } else {
            std::mem::take(&mut self.held)
        }
    }

    /// The stop string that matched, if one did.
    pub(crate) fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(stops: &[&str]) -> StopFilter {
        StopFilter::new(&stops.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn stop_strings_are_cut_across_pieces() {
        let mut f = filter(&["END"]);
        assert_eq!(f.push("hello E"), ("hello ".to_string(), false));
        assert_eq!(f.push("N"), (String::new(), false));
        assert_eq!(f.push("D more"), (String::new(), true));
        assert_eq!(f.matched(), Some("END"));
        let mut f = filter(&["END"]);
        assert_eq!(f.push("hello EN"), ("hello ".to_string(), false));
        assert_eq!(f.push("x"), ("ENx".to_string(), false));
        assert_eq!(f.finish(), "");
        let mut f = filter(&[]);
        assert_eq!(f.push("abc"), ("abc".to_string(), false));
    }

    #[test]
    fn held_text_is_released_at_the_end() {
        let mut f = filter(&["STOP"]);
        assert_eq!(f.push("go ST"), ("go ".to_string(), false));
        assert_eq!(f.finish(), "ST");
        assert_eq!(f.matched(), None);
    }

    #[test]
    fn the_earliest_stop_string_wins() {
        let mut f = filter(&["cd", "b"]);
        assert_eq!(f.push("abcd"), ("a".to_string(), true));
        assert_eq!(f.matched(), Some("b"));
        // After a match nothing more is shown.
        assert_eq!(f.push("zzz"), (String::new(), true));
        assert_eq!(f.finish(), "");
    }

    #[test]
    fn multibyte_stop_strings_hold_whole_characters() {
        // "é" is two bytes: a prefix of the stop string is only ever cut at a char boundary.
        let mut f = filter(&["éa"]);
        assert_eq!(f.push("xé"), ("x".to_string(), false));
        assert_eq!(f.push("b"), ("éb".to_string(), false));
        let mut f = filter(&["日本"]);
        assert_eq!(f.push("今日"), ("今".to_string(), false));
        assert_eq!(f.push("本だ"), (String::new(), true));
    }

    #[test]
    fn empty_stop_strings_are_refused() {
        let e = StopFilter::new(&[String::new()]).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("stop"), "{e}");
    }
}
