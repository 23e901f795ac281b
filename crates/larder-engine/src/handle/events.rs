//! A job's events ([`Event`]) and the channel they come through
//! ([`Events`]): unbounded, so the engine thread never waits for a slow
//! reader, and readable both from async code and from plain threads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use super::CancelFlag;
use crate::choice::TokenLogprob;
use crate::error::EngineError;
use crate::request::Outcome;

/// What a submitted job reports, in order: `Token`s (and `Text`), then
/// exactly one `Done` or `Failed`.
#[derive(Debug)]
pub enum Event {
    /// A chosen token, the text it releases (often empty: held back while
    /// it may start a stop string, or an incomplete UTF-8 character) and its
    /// logprob when the job asked for them.
    Token {
        id: u32,
        text: String,
        logprob: Option<TokenLogprob>,
    },
    /// Text held back until the end, released because no stop string followed.
    Text(String),
    /// The job ended (finished, stopped, or cancelled).
    Done(Box<Outcome>),
    /// The job failed while it ran (an expert that cannot be read, say).
    Failed(EngineError),
}

/// The receiving end of a job's events; dropping it cancels the job.
pub struct Events {
    receiver: UnboundedReceiver<Event>,
    cancel: CancelFlag,
    prompt_tokens: usize,
}

impl Events {
    /// A channel for a job of `prompt_tokens` tokens: its events and the sender.
    pub(super) fn channel(prompt_tokens: usize) -> (Events, UnboundedSender<Event>) {
        let (sender, receiver) = unbounded_channel();
        let events = Events {
            receiver,
            cancel: Arc::new(AtomicBool::new(false)),
            prompt_tokens,
        };
        (events, sender)
    }

    pub(super) fn cancel_flag(&self) -> CancelFlag {
        self.cancel.clone()
    }

    /// The job's prompt length.
    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }

    /// The next event, `None` once the job has ended and every event was
    /// taken (or the engine thread stopped without ending it).
    pub async fn recv(&mut self) -> Option<Event> {
        self.receiver.recv().await
    }

    /// [`recv`](Self::recv) for a plain thread (not from async code: it
    /// would block the runtime).
    pub fn blocking_recv(&mut self) -> Option<Event> {
        self.receiver.blocking_recv()
    }

    /// Cancels the job at the next step; events already sent still come.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// Waits (on a plain thread) for the job to end, its text events
    /// skipped: its outcome, or the error it failed with.
    pub fn wait(mut self) -> Result<Outcome, EngineError> {
        while let Some(event) = self.blocking_recv() {
            match event {
                Event::Done(outcome) => return Ok(*outcome),
                Event::Failed(e) => return Err(e),
                Event::Token { .. } | Event::Text(_) => {}
            }
        }
        Err(EngineError::EngineThread("stopped before the job ended".into()))
    }
}

/// The events of the job, blocking for each (for plain threads).
impl Iterator for Events {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        self.blocking_recv()
    }
}
