//! `pull`: a store straight from a remote checkpoint, without a second
//! copy of it. Each source file streams once, in order, from a
//! [`FileSource`]; its bytes land where `pack` would put them (expert
//! records in the layer files on their drives, spine tensors in the spine
//! file), written in place under temporary names (`scatter`). A file is
//! read in ranges, several in flight, and hashed and written in order, then
//! checked against the sha256 the source publishes (the hub's LFS one). Then every file is sealed as `pack` seals
//! it (record digests, read back, committed; `seal`), the small files
//! copied, and `manifest.json` written last: the result is the store `pack`
//! makes of the same checkpoint, record for record.
//!
//! Resumable: progress per source file is saved in `pull-state.json`
//! ([`journal`]) after the bytes it counts are synced, every
//! [`PullOptions::save_every`] and whenever a stream ends; a rerun
//! re-hashes the kept prefix from where it landed and fetches only the
//! rest. Locked and planned like `pack` (same `pack-plan.json`), so a
//! folder holds one pull at a time and keeps its store id across reruns.

pub mod journal;
pub(crate) mod scatter;
pub(crate) mod seal;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::fsutil::lock_exclusive;
use crate::manifest::{DriveEntry, Manifest, FORMAT, VERSION};
use crate::pack::{check_existing_store, copy_files, PackOptions};
use crate::pack_plan::{load_or_make_plan, resolve, store_folder, DriveSpec, PackEvent, PackSource, LOCK, SPINE};
use crate::remote::{FileSource, RemoteError, StreamState};
use crate::StoreError;
use journal::{FileProgress, Journal};
use scatter::{GatherReader, Layout, OpenOutputs, ScatterSink};

pub use journal::PULL_STATE;

/// One source file as the pull sees it: its name at the source, its size,
/// and its first bytes as read before the download (the safetensors
/// length prefix and header), which the stream must repeat.
#[derive(Debug, Clone)]
pub struct PullFile {
    pub name: String,
    pub size: u64,
    pub head: Vec<u8>,
}

/// Most range requests in flight over all streams (`jobs × ranges`): each
/// buffers up to [`PullOptions::range_bytes`], and the next group is in
/// flight while one is written.
pub(crate) const MAX_IN_FLIGHT: usize = 64;

/// How to pull.
#[derive(Debug, Clone, Copy)]
pub struct PullOptions {
    /// Source files streamed at once.
    pub jobs: usize,
    /// Range requests in flight per file (the file is still hashed and
    /// written in order), and bytes per request.
    pub ranges: usize,
    pub range_bytes: u64,
    /// How often progress is saved (after syncing what it counts), by a
    /// thread of its own so streams never wait for the drive: about what a
    /// killed pull fetches again.
    pub save_every: Duration,
}

impl Default for PullOptions {
    fn default() -> Self {
        PullOptions {
            jobs: 4,
            ranges: 4,
            range_bytes: 8 << 20,
            save_every: Duration::from_secs(2),
        }
    }
}

/// What a pull reports as it goes.
#[derive(Debug, Clone)]
pub enum PullEvent {
    /// Measuring a drive's read speed (placement over several drives).
    MeasuringDrive {
        dir: PathBuf,
    },
    DriveMeasured {
        dir: PathBuf,
        gbps: f64,
    },
    /// All source bytes, and those already on the drive from an earlier run.
    Started {
        total_bytes: u64,
        done_bytes: u64,
        files: usize,
    },
    /// A file's stream starts at `from` (more than 0 when resumed).
    FileStarted {
        file: String,
        size: u64,
        from: u64,
    },
    /// More bytes arrived and were written.
    Advanced {
        bytes: u64,
    },
    FileDone {
        file: String,
        verified: bool,
    },
    /// Every file is in; the store files are being digested and checked.
    Sealing,
}

/// The outcome of a pull.
#[derive(Debug, Clone, Serialize)]
pub struct PullReport {
    pub out: PathBuf,
    pub store_id: String,
    pub files: usize,
    /// Bytes of all source files.
    pub total_bytes: u64,
    /// Bytes streamed by this run (less than the total when resumed).
    pub fetched_bytes: u64,
    /// Files whose sha256 was checked against the source's.
    pub verified_files: usize,
    /// Files the source published no sha256 for.
    pub unverified_files: Vec<String>,
    pub layers: usize,
    pub experts: usize,
    pub drives: Vec<DriveEntry>,
    pub seconds: f64,
}

/// Pulls `src` (described from the headers in `files`, `files[i]` being
/// `src.files[i]`) from `remote` into the store `out`, layer files on
/// `drives` (the store root when empty).
pub fn pull(
    remote: &dyn FileSource,
    files: &[PullFile],
    src: &PackSource,
    out: &Path,
    drives: &[DriveSpec],
    opts: PullOptions,
    progress: &(dyn Fn(PullEvent) + Sync),
) -> Result<PullReport, StoreError> {
    let started = Instant::now();
    if files.len() != src.files.len() {
        return Err(StoreError::Invalid(format!(
            "pull: {} source files described, {} given",
            src.files.len(),
            files.len()
        )));
    }
    let in_flight = opts.jobs.max(1).saturating_mul(opts.ranges.max(1));
    if in_flight > MAX_IN_FLIGHT {
        return Err(StoreError::Invalid(format!(
            "--jobs {} x --ranges {} = {in_flight} range requests in flight (each buffering up to {} MiB, twice); \
             at most {MAX_IN_FLIGHT}: lower --jobs or --ranges",
            opts.jobs,
            opts.ranges,
            opts.range_bytes >> 20
        )));
    }
    std::fs::create_dir_all(out).map_err(|e| StoreError::io(out, e))?;
    let _out_lock = lock_exclusive(&out.join(LOCK), "another `larder pull` or `larder pack` into this --out")?;
    check_existing_store(src, out, PackOptions::default())?;
    let plan = load_or_make_plan(src, out, drives, &mut |e| match e {
        PackEvent::MeasuringDrive { dir } => progress(PullEvent::MeasuringDrive { dir }),
        PackEvent::DriveMeasured { dir, gbps } => progress(PullEvent::DriveMeasured { dir, gbps }),
        _ => {}
    })?;
    let drive_dirs: Vec<PathBuf> = plan.drives.iter().map(|d| resolve(out, &d.path)).collect();
    let mut _drive_locks = Vec::new();
    for dir in &drive_dirs {
        let sub = dir.join(store_folder(&plan.store_id));
        std::fs::create_dir_all(&sub).map_err(|e| StoreError::io(&sub, e))?;
        _drive_locks.push(lock_exclusive(&sub.join(LOCK), "another `larder pull` of this store")?);
    }
    let layout = Layout::new(src, &plan, &drive_dirs, out.join(SPINE))?;
    let journal = Journal::open(out, &plan.store_id)?;
    let total_bytes: u64 = files.iter().map(|f| f.size).sum();
    let mut fetched_bytes = 0;
    if !layout.all_on_drive() {
        // A store file was removed since the journal counted its bytes.
        journal.reset()?;
    }
    if !files.iter().all(|f| journal.get(&f.name).done) {
        let (outputs, created) = OpenOutputs::open(&layout)?;
        if created {
            // A store file was (re)created: nothing counted before is on the drive.
            journal.reset()?;
        }
        let done_bytes = files.iter().map(|f| journal.get(&f.name).offset).sum();
        progress(PullEvent::Started {
            total_bytes,
            done_bytes,
            files: files.len(),
        });
        fetched_bytes = stream_files(remote, files, &layout.pieces, &outputs, &journal, opts, &NoObserver, progress)?;
    }
    progress(PullEvent::Sealing);
    let (layers, spine) = seal::seal(src, &layout, out)?;
    let carried = copy_files(&src.copy, out)?;
    let manifest = Manifest {
        format: FORMAT.into(),
        version: VERSION,
        store_id: plan.store_id.clone(),
        model_type: src.model_type.clone(),
        source: src.identity.clone(),
        files: carried,
        spine: vec![spine],
        drives: plan.drives.clone(),
        layers,
        digest: String::new(),
    };
    manifest.write(out)?;
    let verified: Vec<bool> = files.iter().map(|f| journal.get(&f.name).verified).collect();
    journal.remove()?;
    Ok(PullReport {
        out: out.to_path_buf(),
        store_id: plan.store_id,
        files: files.len(),
        total_bytes,
        fetched_bytes,
        verified_files: verified.iter().filter(|v| **v).count(),
        unverified_files: files
            .iter()
            .zip(&verified)
            .filter(|(_, v)| !**v)
            .map(|(f, _)| f.name.clone())
            .collect(),
        layers: manifest.layers.len(),
        experts: manifest.layers.iter().map(|l| l.experts.len()).sum(),
        drives: plan.drives,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Sees every byte of each source file's stream, in order, the kept prefix
/// of a resumed stream included; told when a file's stream ends with its
/// sha256 checked, before the journal counts the file done. Lazy stores
/// digest the expert components a stream carries this way; `pull` needs
/// nothing ([`NoObserver`]).
pub(crate) trait StreamObserver: Sync {
    /// File `file`'s stream starts again from byte 0: forget what was seen.
    fn restart(&self, file: usize);
    /// Bytes `pos..pos + bytes.len()` of file `file`.
    fn observe(&self, file: usize, pos: u64, bytes: &[u8]);
    /// File `file` streamed whole; `verified`: its sha256 matched the one
    /// the source published (`false`: none was published).
    fn finished(&self, file: usize, verified: bool) -> Result<(), StoreError>;
}

/// The observer of a plain pull.
pub(crate) struct NoObserver;

impl StreamObserver for NoObserver {
    fn restart(&self, _: usize) {}
    fn observe(&self, _: usize, _: u64, _: &[u8]) {}
    fn finished(&self, _: usize, _: bool) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Streams every source file the journal does not count done into
/// `pieces` (per file, where its bytes land in `outputs`), `opts.jobs`
/// files at once, each checked against the sha256 its source publishes;
/// the bytes fetched. Progress is journaled as [`pull`] describes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn stream_files(
    remote: &dyn FileSource,
    files: &[PullFile],
    pieces: &[Vec<scatter::Piece>],
    outputs: &OpenOutputs,
    journal: &Journal,
    opts: PullOptions,
    observer: &dyn StreamObserver,
    progress: &(dyn Fn(PullEvent) + Sync),
) -> Result<u64, StoreError> {
    Streams {
        remote,
        files,
        pieces,
        outputs,
        journal,
        opts,
        observer,
        progress,
        reached: Mutex::new(vec![None; files.len()]),
        saving: Mutex::new(()),
    }
    .run()
}

/// The streams of one run: up to `opts.jobs` source files at once.
struct Streams<'a> {
    remote: &'a dyn FileSource,
    files: &'a [PullFile],
    pieces: &'a [Vec<scatter::Piece>],
    outputs: &'a OpenOutputs,
    journal: &'a Journal,
    opts: PullOptions,
    observer: &'a dyn StreamObserver,
    progress: &'a (dyn Fn(PullEvent) + Sync),
    /// Per file, the offset its stream has written up to (while it runs).
    reached: Mutex<Vec<Option<u64>>>,
    /// Held while progress is synced and saved, so a stream's final save is
    /// never overtaken by an older snapshot.
    saving: Mutex<()>,
}

impl Streams<'_> {
    /// Streams every unfinished file; the bytes fetched. After the first
    /// failure no new file starts; the ones streaming finish or fail.
    fn run(&self) -> Result<u64, StoreError> {
        let todo: Vec<usize> = (0..self.files.len())
            .filter(|&i| !self.journal.get(&self.files[i].name).done)
            .collect();
        let next = AtomicUsize::new(0);
        let fetched = AtomicU64::new(0);
        let failed: Mutex<Option<StoreError>> = Mutex::new(None);
        let workers = self.opts.jobs.clamp(1, todo.len().max(1));
        let streaming = AtomicUsize::new(workers);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                // Saves progress every `save_every` while streams run.
                let mut last = Instant::now();
                while streaming.load(Ordering::Acquire) > 0 {
                    std::thread::sleep(Duration::from_millis(20));
                    if last.elapsed() >= self.opts.save_every {
                        if let Err(e) = self.save_reached() {
                            lock(&failed).get_or_insert(e);
                            return;
                        }
                        last = Instant::now();
                    }
                }
            });
            for _ in 0..workers {
                scope.spawn(|| {
                    loop {
                        if lock(&failed).is_some() {
                            break;
                        }
                        let Some(&i) = todo.get(next.fetch_add(1, Ordering::Relaxed)) else {
                            break;
                        };
                        match self.stream(i) {
                            Ok(n) => {
                                fetched.fetch_add(n, Ordering::Relaxed);
                            }
                            Err(e) => {
                                lock(&failed).get_or_insert(e);
                                break;
                            }
                        }
                    }
                    streaming.fetch_sub(1, Ordering::Release);
                });
            }
        });
        match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(fetched.into_inner()),
        }
    }

    /// Syncs every output, then saves the offset each running stream had
    /// reached before the sync.
    fn save_reached(&self) -> Result<(), StoreError> {
        let _saving = lock(&self.saving);
        let reached: Vec<(usize, u64)> = lock(&self.reached)
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.map(|at| (i, at)))
            .collect();
        if reached.is_empty() {
            return Ok(());
        }
        self.outputs.sync()?;
        self.journal
            .advance(reached.iter().map(|&(i, at)| (self.files[i].name.as_str(), at)))
    }

    /// Streams file `i` from where the journal says it stopped into its
    /// pieces; the bytes fetched.
    fn stream(&self, i: usize) -> Result<u64, StoreError> {
        let (file, pieces) = (&self.files[i], &self.pieces[i][..]);
        let saved = self.journal.get(&file.name);
        let mut state = StreamState::default();
        self.observer.restart(i);
        if saved.offset > 0 {
            let kept = ObservedReader {
                inner: GatherReader {
                    head: &file.head,
                    pieces,
                    outputs: self.outputs,
                    pos: 0,
                    end: saved.offset,
                },
                observer: self.observer,
                file: i,
                pos: 0,
            };
            // A prefix that cannot be read back is fetched again.
            state = StreamState::from_prefix(kept).unwrap_or_else(|_| {
                self.observer.restart(i);
                StreamState::default()
            });
        }
        let from = state.offset;
        (self.progress)(PullEvent::FileStarted {
            file: file.name.clone(),
            size: file.size,
            from,
        });
        let mut reported = from;
        let mut advanced = |pos: u64| -> std::io::Result<()> {
            (self.progress)(PullEvent::Advanced { bytes: pos - reported });
            reported = pos;
            lock(&self.reached)[i] = Some(pos);
            Ok(())
        };
        let mut sink = ObservedSink {
            inner: ScatterSink {
                head: &file.head,
                pieces,
                outputs: self.outputs,
                pos: from,
                advanced: &mut advanced,
            },
            observer: self.observer,
            file: i,
            pos: from,
        };
        match self.fetch(file, &mut sink, &mut state) {
            Ok(verified) => {
                self.observer.finished(i, verified)?;
                self.save(i, file.size, true, verified)?;
                (self.progress)(PullEvent::FileDone {
                    file: file.name.clone(),
                    verified,
                });
                Ok(file.size - from)
            }
            Err(e) => {
                // Keep what arrived (all of it is bad when the sha256 disagrees).
                let keep = match e {
                    RemoteError::Sha256Mismatch { .. } => 0,
                    _ => state.offset,
                };
                let saved = self.save(i, keep, false, false);
                Err(pull_error(e, saved.is_ok()))
            }
        }
    }

    /// Reads `file` from `state.offset` to its end into `sink` in ranges of
    /// [`PullOptions::range_bytes`], [`PullOptions::ranges`] in flight,
    /// hashing and writing them in order; checks the sha256 the source
    /// publishes. Whether it was checked. (`FileSource::stream_file` with
    /// several requests in flight, so one large file is not one connection's
    /// speed.)
    fn fetch(&self, file: &PullFile, sink: &mut dyn Write, state: &mut StreamState) -> Result<bool, RemoteError> {
        let meta = self.remote.file_meta(&file.name)?;
        if meta.size != file.size {
            return Err(RemoteError::ListingMismatch {
                url: file.name.clone(),
                file: file.name.clone(),
                reason: format!("{} bytes now, {} when its header was read", meta.size, file.size),
            });
        }
        let step = self.opts.range_bytes.max(1);
        let group_at = |next: u64| -> Vec<(u64, u64)> {
            (0..self.opts.ranges.max(1) as u64)
                .map(|i| next + i * step)
                .take_while(|&at| at < file.size)
                .map(|at| (at, step.min(file.size - at)))
                .collect()
        };
        let read = |group: Vec<(u64, u64)>, spare: Vec<Vec<u8>>| self.remote.read_ranges_into(&file.name, &group, group.len(), spare);
        // The next group of ranges is in flight while this one is hashed and
        // written; a written group's buffers take the group after next.
        std::thread::scope(|scope| {
            let mut group = group_at(state.offset);
            let mut pending = (!group.is_empty()).then(|| scope.spawn(move || read(group, Vec::new())));
            let mut next = state.offset;
            let mut spare: Vec<Vec<u8>> = Vec::new();
            while let Some(handle) = pending.take() {
                let ranges = handle.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?;
                next += ranges.iter().map(|b| b.len() as u64).sum::<u64>();
                group = group_at(next);
                if !group.is_empty() {
                    let reuse = std::mem::take(&mut spare);
                    pending = Some(scope.spawn(move || read(group, reuse)));
                }
                for bytes in &ranges {
                    sink.write_all(bytes).map_err(|source| RemoteError::Sink {
                        file: file.name.clone(),
                        offset: state.offset,
                        source,
                    })?;
                    state.consume(bytes);
                }
                spare = ranges;
            }
            Ok::<(), RemoteError>(())
        })?;
        let got = state.sha256_hex();
        match meta.sha256 {
            Some(expected) if expected != got => Err(RemoteError::Sha256Mismatch {
                url: file.name.clone(),
                file: file.name.clone(),
                expected,
                got,
            }),
            Some(_) => Ok(true),
            None => Ok(false),
        }
    }

    /// Ends file `i`'s stream: syncs every output, then records its progress.
    fn save(&self, i: usize, offset: u64, done: bool, verified: bool) -> Result<(), StoreError> {
        let _saving = lock(&self.saving);
        lock(&self.reached)[i] = None;
        self.outputs.sync()?;
        self.journal.set(&self.files[i].name, FileProgress { offset, done, verified })
    }
}

/// A reader of a kept prefix that shows its bytes to the observer.
struct ObservedReader<'a, R> {
    inner: R,
    observer: &'a dyn StreamObserver,
    file: usize,
    pos: u64,
}

impl<R: std::io::Read> std::io::Read for ObservedReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.observer.observe(self.file, self.pos, &buf[..n]);
        self.pos += n as u64;
        Ok(n)
    }
}

/// A sink that shows the bytes it is given to the observer, once written.
struct ObservedSink<'a, W> {
    inner: W,
    observer: &'a dyn StreamObserver,
    file: usize,
    pos: u64,
}

impl<W: Write> Write for ObservedSink<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.observer.observe(self.file, self.pos, &buf[..n]);
        self.pos += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A stream's failure, saying what a rerun does.
fn pull_error(e: RemoteError, progress_saved: bool) -> StoreError {
    let resume = match &e {
        RemoteError::BadSource { .. } | RemoteError::Unauthorized { .. } | RemoteError::NotFound { .. } => None,
        RemoteError::Sha256Mismatch { .. } => Some("run `larder pull` again to fetch the file anew"),
        _ if progress_saved => Some("the bytes that arrived are kept: run the same `larder pull` again to resume"),
        _ => Some("run the same `larder pull` again to resume"),
    };
    match resume {
        Some(hint) => StoreError::Invalid(format!("{e}; {hint}")),
        None => StoreError::Invalid(e.to_string()),
    }
}
