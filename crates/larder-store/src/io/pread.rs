//! The portable backend: a persistent pool of threads, each reading whole
//! jobs with `pread` (several jobs in flight, one per thread). Also the range
//! checks every backend applies to its depth ([`MAX_IO_DEPTH`]).

use std::os::unix::fs::FileExt;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use super::{plan, views, FileTable, IoBackend, ReadResult};
use crate::buf::AlignedBuf;
use crate::location::Extent;
use crate::queue::WorkQueue;
use crate::StoreError;

/// Most reads in flight a backend accepts (`--io-depth`): pread threads, or
/// units of 4 io_uring reads (a 1024-entry ring, far below the kernel's
/// 32768-entry limit and above what NVMe drives need to reach their limit).
pub const MAX_IO_DEPTH: usize = 256;

/// `Ok` when `min <= value <= max`; else an error naming `what` and the range.
pub(crate) fn check_range(what: &'static str, value: usize, min: usize, max: usize) -> Result<(), StoreError> {
    if (min..=max).contains(&value) {
        return Ok(());
    }
    Err(StoreError::OutOfRange { what, value, min, max })
}

/// Checks an I/O depth against `1..=MAX_IO_DEPTH`.
pub(crate) fn check_depth(depth: usize) -> Result<(), StoreError> {
    check_range("I/O depth (--io-depth)", depth, 1, MAX_IO_DEPTH)
}

/// Spawns a named worker thread, or an error saying which pool could not grow.
pub(crate) fn spawn(what: &'static str, name: String, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, StoreError> {
    std::thread::Builder::new()
        .name(name)
        .spawn(f)
        .map_err(|source| StoreError::Spawn { what, source })
}

struct Task {
    job: usize,
    extents: Vec<Extent>,
    reply: mpsc::Sender<(usize, ReadResult)>,
}

struct Shared {
    files: FileTable,
    queue: WorkQueue<Task>,
}

/// `threads` readers over one file table.
pub struct PreadPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl PreadPool {
    /// `threads` readers (1 to [`MAX_IO_DEPTH`]); an error, starting none,
    /// when out of range or when a thread cannot be spawned.
    pub fn new(files: FileTable, threads: usize) -> Result<PreadPool, StoreError> {
        check_depth(threads)?;
        let shared = Arc::new(Shared {
            files,
            queue: WorkQueue::new(),
        });
        // On an error, dropping the pool shuts down and joins the threads started.
        let mut pool = PreadPool {
            shared,
            threads: Vec::with_capacity(threads),
        };
        for i in 0..threads {
            let s = pool.shared.clone();
            pool.threads.push(spawn("pread", format!("larder-pread-{i}"), move || worker(&s))?);
        }
        Ok(pool)
    }
}

fn worker(s: &Shared) {
    while let Some(task) = s.queue.pop() {
        let result = read_job(&s.files, &task.extents);
        let _ = task.reply.send((task.job, result));
    }
}

/// Reads one job's extents into one aligned buffer.
pub(crate) fn read_job(files: &FileTable, extents: &[Extent]) -> ReadResult {
    let (spans, total) = plan(extents, files.direct);
    let mut buf = AlignedBuf::for_read(total as usize);
    for s in &spans {
        let dst = &mut buf.as_mut_slice()[s.buf_offset as usize..(s.buf_offset + s.len) as usize];
        let mut done = 0usize;
        while done < dst.len() {
            match files.files[s.file].read_at(&mut dst[done..], s.file_offset + done as u64) {
                Ok(0) => break,
                // O_DIRECT reads come up short only at the end of the file.
                Ok(n) if files.direct && n % crate::buf::ALIGN != 0 => {
                    done += n;
                    break;
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(files.read_error(s.file, s.file_offset, s.len, e)),
            }
        }
        if (done as u64) < s.needed {
            return Err(files.truncated(s.file, s.file_offset + s.needed));
        }
    }
    Ok(views(buf, &spans, extents))
}

impl IoBackend for PreadPool {
    fn name(&self) -> &'static str {
        "pread"
    }

    fn is_direct(&self) -> bool {
        self.shared.files.direct
    }

    fn read_blocking(&self, extents: &[Extent]) -> ReadResult {
        read_job(&self.shared.files, extents)
    }

    fn read(&self, jobs: &[&[Extent]], done: &mut dyn FnMut(usize, ReadResult)) {
        let (tx, rx) = mpsc::channel();
        self.shared.queue.push_all(jobs.iter().enumerate().map(|(job, extents)| Task {
            job,
            extents: extents.to_vec(),
            reply: tx.clone(),
        }));
        drop(tx);
        for (job, result) in rx.iter().take(jobs.len()) {
            done(job, result);
        }
    }
}

impl Drop for PreadPool {
    fn drop(&mut self) {
        self.shared.queue.shut_down();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
