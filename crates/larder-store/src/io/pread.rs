//! The portable backend: a persistent pool of threads, each reading whole
//! jobs with `pread` (several jobs in flight, one per thread).

use std::os::unix::fs::FileExt;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use super::{plan, views, FileTable, IoBackend, ReadResult};
use crate::buf::AlignedBuf;
use crate::location::Extent;
use crate::queue::WorkQueue;

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
    pub fn new(files: FileTable, threads: usize) -> PreadPool {
        let shared = Arc::new(Shared {
            files,
            queue: WorkQueue::new(),
        });
        let threads = (0..threads.max(1))
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("larder-pread-{i}"))
                    .spawn(move || worker(&s))
                    .expect("spawn pread thread")
            })
            .collect();
        PreadPool { shared, threads }
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
