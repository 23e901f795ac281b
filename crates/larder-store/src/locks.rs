//! Poison-tolerant locking for the store's mutexes: a thread that panics
//! while holding one (a caller's callback, say) leaves counters and maps as
//! they were, so the other threads keep using them instead of panicking too.

use std::sync::{Condvar, Mutex, MutexGuard};

/// Locks `m`, taking it over from a thread that panicked while holding it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits on `cv` with `guard`, as [`lock`] tolerating a poisoned mutex.
pub(crate) fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(|e| e.into_inner())
}
