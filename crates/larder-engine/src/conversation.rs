//! Conversations and the request loop both `larder run` and `larder serve`
//! go through.
//!
//! A [`Conversation`] is one sequence: the tokens fed to the model so far and
//! the model's state for them. A request continues from the longest common
//! token prefix with what the conversation already holds (prefix reuse: only
//! the rest of the prompt is prefilled; batch invariance makes the output
//! bit-identical to a fresh run) and reports how many prompt tokens it reused.
//! A state that cannot roll back (a recurrent layer, Kimi Linear) returns to
//! the nearest snapshot it kept at or before that prefix: at the end of each
//! turn and before each prompt's last token ([`crate::return_points`]).
//!
//! [`Conversation::run`] takes a [`Request`] (prompt ids, [`GenerateOptions`],
//! stop strings, a [`Drafting`], a cancel flag) and streams [`RequestEvent`]s
//! to a [`RequestSink`]: each token with the text now safe to show (stop
//! strings removed, text held back while it may still start one), the text
//! released at the end, then the [`Outcome`] (finish reason, usage, stats).
//! The sink cancels by returning `false`. [`Engine::check_prompt`] is the
//! context-length check a request passes before it starts.

use std::sync::atomic::{AtomicBool, Ordering};

use larder_model::{RouteTrace, SequenceState};

use crate::drafting::Drafting;
use crate::engine::{Engine, FinishReason, GenerateOptions};
use crate::error::EngineError;
use crate::return_points::ReturnPoints;
use crate::stats::Stats;
use crate::tokenizer::StreamDecoder;

/// One request to run in a conversation.
#[derive(Clone, Copy)]
pub struct Request<'a> {
    pub prompt: &'a [u32],
    pub options: &'a GenerateOptions,
    /// Generation stops where any of these appears in the text; the stop
    /// string and what follows are not shown.
    pub stop: &'a [String],
    /// Speculative decoding (off by default).
    pub drafting: &'a Drafting,
    /// Set from anywhere to stop at the next token.
    pub cancel: Option<&'a AtomicBool>,
}

/// What a running request reports.
#[derive(Debug)]
pub enum RequestEvent<'a> {
    /// A chosen token and the text now safe to show (often empty: held back
    /// while it may start a stop string, or an incomplete UTF-8 character).
    Token { id: u32, text: &'a str },
    /// Text held back until the end, released because no stop string followed.
    Text(&'a str),
    /// The request ended (sent once, last; the sink's answer is ignored).
    Finished(&'a Outcome),
}

/// Receives a request's events; returns `false` to cancel it.
pub trait RequestSink {
    fn event(&mut self, event: RequestEvent<'_>) -> bool;
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
    /// Prompt tokens whose state was reused from the conversation.
    pub cached_tokens: usize,
    pub stats: Stats,
}

/// A sequence: the tokens fed to the model and the model's state for them.
pub struct Conversation {
    tokens: Vec<u32>,
    state: SequenceState,
    /// Snapshots to return to when the state cannot roll back (recurrent layers).
    points: ReturnPoints,
}

impl Conversation {
    /// An empty conversation for `engine`'s model.
    pub fn new(engine: &Engine) -> Self {
        Conversation {
            tokens: Vec::new(),
            state: engine.model().new_state(),
            points: ReturnPoints::new(),
        }
    }

    /// The tokens whose state the conversation holds.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Bytes of model state the conversation holds (its snapshots included).
    pub fn state_bytes(&self) -> usize {
        self.state.bytes() + self.points.bytes()
    }

    /// Lengths (positions) of the snapshots kept to return to, ascending:
    /// none for a model whose state rolls back (see [`crate::return_points`]).
    pub fn return_points(&self) -> Vec<usize> {
        self.points.lengths()
    }

    /// How many leading tokens of `prompt` the conversation already holds.
    pub fn common_prefix(&self, prompt: &[u32]) -> usize {
        self.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count()
    }

    /// Runs `request`, continuing from the longest common prefix, streaming
    /// events to `sink`. Afterwards the conversation holds the prompt and
    /// the new tokens fed to the model (on an error it is emptied).
    pub fn run(&mut self, engine: &Engine, request: &Request, sink: &mut dyn RequestSink) -> Result<Outcome, EngineError> {
        self.run_traced(engine, request, sink, None)
    }

    /// [`run`](Self::run), recording the routes of every position this turn
    /// computes (prompt rest and decode, with lookahead as `trace` asks) into
    /// `trace`.
    pub fn run_traced(
        &mut self,
        engine: &Engine,
        request: &Request,
        sink: &mut dyn RequestSink,
        trace: Option<&mut RouteTrace>,
    ) -> Result<Outcome, EngineError> {
        let result = self.run_inner(engine, request, sink, trace);
        if result.is_err() {
            *self = Conversation::new(engine);
        }
        result
    }

    fn run_inner(
        &mut self,
        engine: &Engine,
        request: &Request,
        sink: &mut dyn RequestSink,
        trace: Option<&mut RouteTrace>,
    ) -> Result<Outcome, EngineError> {
        let mut stops = StopFilter::new(request.stop)?;
        let mut drafter = request.drafting.drafter()?;
        let cached = self.common_prefix(request.prompt);
        let tok = engine.tokenizer().ok();
        let mut decoder = StreamDecoder::new();
        let mut text = String::new();
        let mut stop_hit = false;
        let mut on_token = |id: u32| {
            let piece = match tok {
                Some(t) => decoder.push(t, id).ok().flatten().unwrap_or_default(),
                None => String::new(),
            };
            let (shown, hit) = stops.push(&piece);
            text.push_str(&shown);
            let go = sink.event(RequestEvent::Token { id, text: &shown });
            if hit {
                stop_hit = true;
                return false;
            }
            go && !request.cancel.is_some_and(|c| c.load(Ordering::Relaxed))
        };
        let g = engine.generate_in(
            request.prompt,
            &mut self.state,
            Some(&mut self.points),
            cached,
            request.options,
            &mut on_token,
            trace,
            drafter.as_mut().map(|d| &mut **d as &mut dyn larder_spec::Drafter),
        )?;
        self.tokens = request.prompt.iter().chain(&g.ids).copied().take(self.state.len()).collect();
        let tail = stops.finish();
        if !tail.is_empty() {
            text.push_str(&tail);
            sink.event(RequestEvent::Text(&tail));
        }
        let outcome = Outcome {
            finish_reason: if stop_hit { FinishReason::Stop } else { g.finish_reason },
            stop_string: stops.matched.take(),
            prompt_tokens: request.prompt.len(),
            cached_tokens: g.stats.cached_tokens,
            ids: g.ids,
            text,
            stats: g.stats,
        };
        sink.event(RequestEvent::Finished(&outcome));
        Ok(outcome)
    }
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
pub struct StopFilter {
    stops: Vec<String>,
    held: String,
    done: bool,
    matched: Option<String>,
}

impl StopFilter {
    /// A filter for `stops`; an empty stop string is refused (it would match at once).
    pub fn new(stops: &[String]) -> Result<Self, EngineError> {
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
    pub fn push(&mut self, piece: &str) -> (String, bool) {
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
    pub fn finish(&mut self) -> String {
        if self.done {
            String::new()
        } else {
            std::mem::take(&mut self.held)
        }
    }

    /// The stop string that matched, if one did.
    pub fn matched(&self) -> Option<&str> {
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
