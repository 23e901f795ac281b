//! Progress of long work (pack, load, verify, download, benchmarks) on stderr,
//! in the form the reader can use: an indicatif bar on a terminal, a plain
//! line at most every ~2 s otherwise, or JSON lines with `--json` (stdout stays
//! one JSON document). [`Progress`] is `Send + Sync`: I/O and rayon threads
//! update it through atomics; a mutex only guards the rate limiter.
//! `LARDER_PROGRESS_SECS` changes the ~2 s between lines (0: every update;
//! tests use it to check totals). [`Shown`] shows the library benches' and
//! tools' progress and notes this way; [`FetchProgress`] a lazy cache's fetch,
//! [`pull_events`] a pull's.
//! This is the one module of larder-tools that draws on a terminal: the CLI's
//! view of progress, which the other tools only report through an `Observer`.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use larder_store::lazy::LazyEvent;
use larder_store::pull::PullEvent;

/// Least time between two plain or JSON lines (unless `LARDER_PROGRESS_SECS` says otherwise).
const LINE_EVERY: Duration = Duration::from_secs(2);

/// The time between lines: `LARDER_PROGRESS_SECS` if it is a number of seconds, else [`LINE_EVERY`].
fn line_every() -> Duration {
    std::env::var("LARDER_PROGRESS_SECS")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .unwrap_or(LINE_EVERY)
}

/// What the counts of a [`Progress`] measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Bytes: shown as sizes with a rate and an ETA.
    Bytes,
    /// Things (layers, records, files): shown as `done/total`.
    Count,
}

impl Unit {
    fn name(self) -> &'static str {
        match self {
            Unit::Bytes => "bytes",
            Unit::Count => "count",
        }
    }
}

/// How progress is shown: decided once, from stderr and `--json`.
enum Sink {
    Bar(ProgressBar),
    Lines { json: bool, last: Mutex<Option<Instant>> },
}

/// Progress of one task on stderr (see the module doc for the forms).
pub struct Progress {
    task: String,
    unit: Unit,
    done: AtomicU64,
    total: AtomicU64,
    message: Mutex<String>,
    started: Instant,
    every: Duration,
    finished: AtomicBool,
    /// `done` as of the last line printed (`u64::MAX`: none yet).
    shown: AtomicU64,
    sink: Sink,
}

impl Progress {
    /// `task` e.g. "pack", "load", "download"; `json` = the command's --json flag.
    pub fn new(task: &str, total: u64, unit: Unit, json: bool) -> Progress {
        let sink = if !json && std::io::stderr().is_terminal() {
            Sink::Bar(bar(task, total, unit))
        } else {
            Sink::Lines {
                json,
                last: Mutex::new(None),
            }
        };
        Progress {
            task: task.to_string(),
            unit,
            done: AtomicU64::new(0),
            total: AtomicU64::new(total),
            message: Mutex::new(String::new()),
            started: Instant::now(),
            every: line_every(),
            finished: AtomicBool::new(false),
            shown: AtomicU64::new(u64::MAX),
            sink,
        }
    }

    /// Sets the amount done so far.
    pub fn set(&self, done: u64) {
        self.done.store(done, Ordering::Relaxed);
        self.update(false);
    }

    /// Adds `n` to the amount done.
    pub fn inc(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
        self.update(false);
    }

    /// Changes the total (when it becomes known late).
    pub fn set_total(&self, total: u64) {
        self.total.store(total, Ordering::Relaxed);
        if let Sink::Bar(b) = &self.sink {
            b.set_length(total);
        }
    }

    /// What is being worked on now, e.g. the current file or layer.
    pub fn set_message(&self, msg: &str) {
        if let Ok(mut m) = self.message.lock() {
            m.clear();
            m.push_str(msg);
        }
        if let Sink::Bar(b) = &self.sink {
            b.set_message(msg.to_string());
        }
    }

    /// A line of its own above the progress (an event worth keeping, e.g. a
    /// drive's measured speed): `[larder] msg`, or `{"note": msg}` with --json.
    pub fn note(&self, msg: &str) {
        match &self.sink {
            Sink::Bar(b) => b.println(format!("[larder] {msg}")),
            Sink::Lines { json: true, .. } => eprintln!("{}", serde_json::json!({ "note": msg })),
            Sink::Lines { json: false, .. } => eprintln!("[larder] {msg}"),
        }
    }

    /// Ends the task: clears the bar, or prints the final line (once; none
    /// when the task was too quick to print any).
    pub fn finish(&self) {
        if self.finished.swap(true, Ordering::Relaxed) {
            return;
        }
        match &self.sink {
            Sink::Bar(b) => b.finish_and_clear(),
            // A task that printed no line (quicker than ~2 s) needs no final one.
            Sink::Lines { last, .. } if last.lock().is_ok_and(|l| l.is_some()) => self.update(true),
            Sink::Lines { .. } => {}
        }
    }

    fn update(&self, last: bool) {
        match &self.sink {
            Sink::Bar(b) => b.set_position(self.done.load(Ordering::Relaxed)),
            Sink::Lines { json, last: when } => {
                if !last && !self.due(when) {
                    return;
                }
                let done = self.done.load(Ordering::Relaxed);
                // The final line is left out when the last one said the same.
                if self.shown.swap(done, Ordering::Relaxed) == done && last {
                    return;
                }
                let line = if *json { self.json_line() } else { self.plain_line() };
                let mut err = std::io::stderr().lock();
                let _ = writeln!(err, "{line}");
            }
        }
    }

    /// Whether a line is due now (and, if so, records that it is printed).
    fn due(&self, last: &Mutex<Option<Instant>>) -> bool {
        let Ok(mut last) = last.try_lock() else {
            return false; // another thread is deciding right now
        };
        let now = Instant::now();
        let first_due = self.started + self.every;
        let due = match *last {
            Some(t) => now.duration_since(t) >= self.every,
            None => now >= first_due,
        };
        if due {
            *last = Some(now);
        }
        due
    }

    fn json_line(&self) -> String {
        let mut doc = serde_json::json!({
            "progress": self.task,
            "done": self.done.load(Ordering::Relaxed),
            "total": self.total.load(Ordering::Relaxed),
            "unit": self.unit.name(),
        });
        let msg = self.message.lock().map(|m| m.clone()).unwrap_or_default();
        if !msg.is_empty() {
            doc["message"] = serde_json::Value::String(msg);
        }
        doc.to_string()
    }

    /// `[larder] pack: 1.2 GiB / 2.5 GiB (48%), 310 MiB/s (layer 3)`.
    fn plain_line(&self) -> String {
        let done = self.done.load(Ordering::Relaxed);
        let total = self.total.load(Ordering::Relaxed);
        let mut line = format!("[larder] {}: ", self.task);
        match self.unit {
            Unit::Bytes => line.push_str(&format!("{} / {}", human(done), human(total))),
            Unit::Count => line.push_str(&format!("{done} / {total}")),
        }
        if let Some(pct) = done.saturating_mul(100).checked_div(total) {
            line.push_str(&format!(" ({pct}%)"));
        }
        let secs = self.started.elapsed().as_secs_f64();
        if self.unit == Unit::Bytes && secs > 0.0 {
            line.push_str(&format!(", {}/s", human((done as f64 / secs) as u64)));
        }
        let msg = self.message.lock().map(|m| m.clone()).unwrap_or_default();
        if !msg.is_empty() {
            line.push_str(&format!(" ({msg})"));
        }
        line
    }
}

impl Progress {
    /// A `(done, total)` callback (a model load's) that moves this progress.
    pub fn hook(self: &Arc<Self>) -> Arc<dyn Fn(u64, u64) + Send + Sync> {
        let shown = self.clone();
        Arc::new(move |done, total| {
            shown.set_total(total);
            shown.set(done);
        })
    }
}

impl Drop for Progress {
    /// A bar left behind by an error path is cleared, never left half drawn.
    fn drop(&mut self) {
        if let Sink::Bar(b) = &self.sink {
            if !b.is_finished() {
                b.finish_and_clear();
            }
        }
    }
}

/// `1.2 GiB`, `310 MiB`, `512 B`: one decimal above KiB.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1} {}", UNITS[i])
}

fn bar(task: &str, total: u64, unit: Unit) -> ProgressBar {
    let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let counts = match unit {
        Unit::Bytes => "{bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
        Unit::Count => "{pos}/{len}",
    };
    let template = format!("{task} [{{bar:40}}] {counts} {{msg}}");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        b.set_style(style.progress_chars("=> "));
    }
    b.enable_steady_tick(Duration::from_millis(200));
    b
}

/// A progress bar on stderr when it is a terminal (hidden otherwise).
pub fn progress_bar(len: u64, template: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// The progress bar of a lazy cache's fetch (the spine's ranges, or every
/// source file streamed once and checked).
pub struct FetchProgress(Arc<Progress>);

impl FetchProgress {
    pub fn new(json: bool) -> FetchProgress {
        FetchProgress(Arc::new(Progress::new("spine", 0, Unit::Bytes, json)))
    }

    /// The callback `larder_engine::open` reports the fetch to.
    pub fn events(&self) -> Box<dyn Fn(LazyEvent) + Sync> {
        let fetch = self.0.clone();
        Box::new(move |e: LazyEvent| match e {
            LazyEvent::Started {
                total_bytes,
                done_bytes,
                whole_files,
            } => {
                if whole_files {
                    fetch.set_message("checking every source file against its sha256 (once per cache)");
                }
                fetch.set_total(total_bytes);
                fetch.set(done_bytes);
            }
            LazyEvent::Advanced { bytes } => fetch.inc(bytes),
            LazyEvent::FileChecked { file, verified } => {
                if !verified {
                    tracing::warn!("{file}: the source publishes no sha256; its bytes are trusted as they streamed");
                }
            }
            LazyEvent::Done => fetch.finish(),
        })
    }
}

impl Drop for FetchProgress {
    fn drop(&mut self) {
        self.0.finish();
    }
}

/// `larder pull`'s events shown on `progress`: drives measured, files
/// started (resumed ones noted), bytes, files the source publishes no sha256
/// for, sealing.
pub fn pull_events(progress: &Progress) -> impl Fn(PullEvent) + Sync + '_ {
    move |ev| match ev {
        PullEvent::MeasuringDrive { dir } => progress.set_message(&format!("measuring {}", dir.display())),
        PullEvent::DriveMeasured { dir, gbps } => progress.note(&format!("{}: {gbps:.2} GB/s read", dir.display())),
        PullEvent::Started {
            total_bytes,
            done_bytes,
            files,
        } => {
            progress.set_total(total_bytes);
            progress.set(done_bytes);
            progress.set_message(&format!("{files} files"));
        }
        PullEvent::FileStarted { file, from, .. } if from > 0 => {
            progress.note(&format!("{file}: resuming at byte {from}"));
            progress.set_message(&file);
        }
        PullEvent::FileStarted { file, .. } => progress.set_message(&file),
        PullEvent::Advanced { bytes } => progress.inc(bytes),
        PullEvent::FileDone { file, verified: false } => {
            progress.note(&format!("{file}: the source publishes no sha256 for it; not checked"))
        }
        PullEvent::FileDone { .. } => {}
        PullEvent::Sealing => progress.set_message("digesting and checking the store"),
    }
}

/// Progress and notes of the library benches and tools (`larder_bench::Observer`):
/// a [`Progress`] per task, lines on stderr as they are given, the human
/// report's lines only without `--json`.
#[derive(Debug, Clone, Copy)]
pub struct Shown {
    /// The command's --json.
    pub json: bool,
}

impl larder_bench::Task for Progress {
    fn set(&self, done: u64) {
        Progress::set(self, done);
    }
    fn inc(&self, n: u64) {
        Progress::inc(self, n);
    }
    fn set_total(&self, total: u64) {
        Progress::set_total(self, total);
    }
    fn set_message(&self, message: &str) {
        Progress::set_message(self, message);
    }
    fn finish(&self) {
        Progress::finish(self);
    }
}

impl larder_bench::Observer for Shown {
    fn task(&self, name: &str, total: u64, unit: larder_bench::Unit) -> Box<dyn larder_bench::Task> {
        let unit = match unit {
            larder_bench::Unit::Bytes => Unit::Bytes,
            larder_bench::Unit::Count => Unit::Count,
        };
        Box::new(Progress::new(name, total, unit, self.json))
    }

    fn note(&self, line: &str) {
        eprintln!("{line}");
    }

    fn detail(&self, line: &str) {
        if !self.json {
            eprintln!("{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_line_reads_sizes_percent_and_message() {
        let p = Progress::new("pack", 2 << 30, Unit::Bytes, false);
        p.done.store(1 << 30, Ordering::Relaxed);
        p.set_message("layer 3");
        let line = p.plain_line();
        assert!(line.starts_with("[larder] pack: 1.0 GiB / 2.0 GiB (50%), "), "{line}");
        assert!(line.ends_with("/s (layer 3)"), "{line}");
    }

    #[test]
    fn json_line_has_the_stable_keys() {
        let p = Progress::new("load", 10, Unit::Count, true);
        p.set(4);
        let v: serde_json::Value = serde_json::from_str(&p.json_line()).unwrap();
        assert_eq!(v["progress"], "load");
        assert_eq!(v["done"], 4);
        assert_eq!(v["total"], 10);
        assert_eq!(v["unit"], "count");
    }

    #[test]
    fn lines_are_rate_limited() {
        let p = Progress::new("x", 1, Unit::Count, true);
        let Sink::Lines { last, .. } = &p.sink else { return };
        assert!(!p.due(last), "no line before the first 2 s");
        *last.lock().unwrap() = Some(Instant::now() - p.every);
        assert!(p.due(last));
        assert!(!p.due(last), "the next one waits 2 s");
    }

    #[test]
    fn progress_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Progress>();
    }
}
