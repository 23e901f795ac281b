//! How a bench shows what it is doing without knowing how: the caller's
//! [`Observer`] starts a [`Task`] per long step (a progress bar, plain
//! lines or JSON lines in the CLI) and shows notes: whole lines, in the
//! CLI's own form (`[larder] ...` where larder has always printed that).
//! [`Silent`] shows nothing.

/// What the counts of a [`Task`] measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Bytes: sizes with a rate.
    Bytes,
    /// Things (records, arms, tokens): `done/total`.
    Count,
}

/// Progress of one long step; updated from any thread.
pub trait Task: Send + Sync {
    /// Sets the amount done so far.
    fn set(&self, done: u64);
    /// Adds `n` to the amount done.
    fn inc(&self, n: u64);
    /// Changes the total (when it becomes known late).
    fn set_total(&self, total: u64);
    /// What is being worked on now (a backend, a file, an arm).
    fn set_message(&self, message: &str);
    /// Ends the step.
    fn finish(&self);
}

/// Where a bench or tool reports progress and notes.
pub trait Observer: Sync {
    /// Starts a step called `name` of `total` units (0: not known yet).
    fn task(&self, name: &str, total: u64, unit: Unit) -> Box<dyn Task>;
    /// A status line worth keeping, shown as it is (with and without `--json`).
    fn note(&self, line: &str);
    /// A line of the human-readable report, shown as it is (not with `--json`).
    fn detail(&self, line: &str);
}

/// Shows nothing (tests, callers that print their own way).
#[derive(Debug, Clone, Copy, Default)]
pub struct Silent;

impl Task for Silent {
    fn set(&self, _: u64) {}
    fn inc(&self, _: u64) {}
    fn set_total(&self, _: u64) {}
    fn set_message(&self, _: &str) {}
    fn finish(&self) {}
}

impl Observer for Silent {
    fn task(&self, _: &str, _: u64, _: Unit) -> Box<dyn Task> {
        Box::new(Silent)
    }
    fn note(&self, _: &str) {}
    fn detail(&self, _: &str) {}
}
