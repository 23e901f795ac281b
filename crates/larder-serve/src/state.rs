//! What every connection shares ([`State`]) and the count of open
//! connections ([`ConnectionGuard`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::watch;

use crate::worker::Worker;
use crate::ServerConfig;

/// What every connection shares.
pub struct State {
    pub config: ServerConfig,
    /// The engine thread, once the model has loaded.
    pub worker: OnceLock<Worker>,
    pub ids: std::sync::atomic::AtomicU64,
    /// Turns true when the shutdown grace period ends: running requests
    /// stop (streams get an error event and `[DONE]`).
    pub abort: watch::Receiver<bool>,
    /// Connections open now.
    pub connections: AtomicUsize,
    /// Responses kept for `previous_response_id` and `GET /v1/responses/{id}`.
    pub responses: crate::response_store::Store,
}

/// Counts one open connection in [`State::connections`] while alive.
pub struct ConnectionGuard(Arc<State>);

impl ConnectionGuard {
    pub fn new(state: Arc<State>) -> Self {
        state.connections.fetch_add(1, Ordering::SeqCst);
        ConnectionGuard(state)
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::SeqCst);
    }
}
