//! The responses `/v1/responses` keeps for `previous_response_id` and
//! `GET /v1/responses/{id}`: in memory, bounded, the oldest dropped first.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde_json::Value;

use crate::agent::Turn;

/// Most responses kept.
pub const STORE_RESPONSES: usize = 1024;
/// Most bytes of text kept.
pub const STORE_BYTES: usize = 64 << 20;

#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub(crate) turns: Vec<Turn>,
    pub(crate) response: Value,
    bytes: usize,
}

/// The responses kept for `previous_response_id`, in memory, at most
/// [`STORE_RESPONSES`] and [`STORE_BYTES`], the oldest dropped first.
#[derive(Default)]
pub struct Store {
    inner: Mutex<StoreInner>,
}

#[derive(Default)]
struct StoreInner {
    by_id: HashMap<String, Stored>,
    order: VecDeque<String>,
    bytes: usize,
}

impl Store {
    pub(crate) fn put(&self, id: String, turns: Vec<Turn>, response: Value) {
        let bytes = turns.iter().map(Turn::bytes).sum::<usize>() + id.len();
        if bytes > STORE_BYTES {
            return;
        }
        let Ok(mut s) = self.inner.lock() else { return };
        while s.by_id.len() >= STORE_RESPONSES || s.bytes + bytes > STORE_BYTES {
            let Some(old) = s.order.pop_front() else { break };
            if let Some(gone) = s.by_id.remove(&old) {
                s.bytes -= gone.bytes;
            }
        }
        s.bytes += bytes;
        s.order.push_back(id.clone());
        s.by_id.insert(id, Stored { turns, response, bytes });
    }

    pub(crate) fn get(&self, id: &str) -> Option<Stored> {
        self.inner.lock().ok()?.by_id.get(id).cloned()
    }
}
