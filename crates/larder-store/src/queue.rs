//! A FIFO work queue for the store's persistent worker threads (pread pool,
//! prefetchers): producers push, workers block in `pop` until there is work
//! or the queue is shut down.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};

pub(crate) struct WorkQueue<T> {
    items: Mutex<(VecDeque<T>, bool)>,
    ready: Condvar,
}

impl<T> WorkQueue<T> {
    pub(crate) fn new() -> Self {
        WorkQueue {
            items: Mutex::new((VecDeque::new(), false)),
            ready: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, (VecDeque<T>, bool)> {
        self.items.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds items and wakes the workers.
    pub(crate) fn push_all(&self, items: impl IntoIterator<Item = T>) {
        self.lock().0.extend(items);
        self.ready.notify_all();
    }

    /// The next item; `None` once the queue is shut down and empty.
    pub(crate) fn pop(&self) -> Option<T> {
        let mut q = self.lock();
        loop {
            if let Some(t) = q.0.pop_front() {
                return Some(t);
            }
            if q.1 {
                return None;
            }
            q = self.ready.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The next item (blocking as [`pop`](Self::pop)) and up to `more` others
    /// already queued.
    pub(crate) fn pop_batch(&self, more: usize) -> Vec<T> {
        let Some(first) = self.pop() else { return Vec::new() };
        let mut q = self.lock();
        let n = more.min(q.0.len());
        std::iter::once(first).chain(q.0.drain(..n)).collect()
    }

    /// Lets workers exit once the queue is empty.
    pub(crate) fn shut_down(&self) {
        self.lock().1 = true;
        self.ready.notify_all();
    }
}
