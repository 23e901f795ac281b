//! io_uring backend (Linux): one ring, many reads in flight from the calling
//! thread. Each job's spans are split into 1 MiB reads so several drives and
//! deep device queues stay busy; a job is reported the moment its last read
//! lands, while the others continue in the kernel.
//!
//! Prefetch ([`IoBackend::read_background`]) reads with pread on the ring's
//! files, one record per prefetch thread: a batch submitted on a ring of its
//! own finishes every record at about the same time, so the first one a
//! demand waits for arrives last (measured: decode fell from 13.4 to 7.6
//! tok/s, bench/results/2026-12-03-plan.md).
//!
//! Registered buffers are not used: job buffers are allocated per read (they
//! become the cache's entries), and measured reads already reach the drive
//! limit without them (see docs/store.md).

use std::os::unix::io::AsRawFd;
use std::sync::Mutex;

use io_uring::{opcode, types, IoUring};

use super::{plan, views, FileTable, IoBackend, ReadResult, Span};
use crate::buf::AlignedBuf;
use crate::location::Extent;
use crate::StoreError;

/// Bytes per submitted read.
const CHUNK: u64 = 1 << 20;
/// Reads in flight per unit of `depth`.
const READS_PER_DEPTH: usize = 4;

/// Whether this kernel lets us create a ring.
pub(super) fn available() -> bool {
    IoUring::new(2).is_ok()
}

pub(crate) struct UringBackend {
    files: FileTable,
    ring: Mutex<IoUring>,
    in_flight: usize,
}

impl UringBackend {
    /// A ring for `depth` x 4 reads in flight (`depth` from 1 to
    /// [`MAX_IO_DEPTH`](super::MAX_IO_DEPTH)); an error when out of range or
    /// when the kernel refuses the ring.
    pub(crate) fn new(files: FileTable, depth: usize) -> Result<UringBackend, StoreError> {
        super::pread::check_depth(depth)?;
        let in_flight = depth * READS_PER_DEPTH;
        let new_ring = || {
            IoUring::new((in_flight as u32).next_power_of_two())
                .map_err(|e| StoreError::Invalid(format!("cannot create an io_uring ({e}); use --io pread")))
        };
        Ok(UringBackend {
            files,
            ring: Mutex::new(new_ring()?),
            in_flight,
        })
    }
}

/// One read of part of a span.
struct Op {
    job: usize,
    span: usize,
    /// Offset inside the span, and bytes still to read from there.
    at: u64,
    len: u64,
}

struct JobState {
    /// Allocated when the job's first read is submitted (so allocation and
    /// page faults overlap the reads already in flight); taken when done.
    buf: Option<AlignedBuf>,
    size: usize,
    finished: bool,
    spans: Vec<Span>,
    ops_left: usize,
    /// Per span: the span offset where the file ended, if a read came up short.
    eof_at: Vec<Option<u64>>,
    error: Option<StoreError>,
}

impl IoBackend for UringBackend {
    fn name(&self) -> &'static str {
        "uring"
    }

    fn is_direct(&self) -> bool {
        self.files.direct
    }

    fn read_blocking(&self, extents: &[Extent]) -> ReadResult {
        // pread on the ring's files: the ring serves one batch at a time.
        super::pread::read_job(&self.files, extents)
    }

    fn read(&self, jobs: &[&[Extent]], done: &mut dyn FnMut(usize, ReadResult)) {
        self.read_on(&self.ring, jobs, done)
    }
}

impl UringBackend {
    /// Reads `jobs` with up to `in_flight` reads at once on `ring`.
    fn read_on(&self, ring: &Mutex<IoUring>, jobs: &[&[Extent]], done: &mut dyn FnMut(usize, ReadResult)) {
        let mut ring = ring.lock().unwrap_or_else(|e| e.into_inner());
        let mut states: Vec<JobState> = Vec::with_capacity(jobs.len());
        let mut queue: std::collections::VecDeque<Op> = Default::default();
        for (job, extents) in jobs.iter().enumerate() {
            let (spans, total) = plan(extents, self.files.direct);
            let mut ops = 0;
            for (si, s) in spans.iter().enumerate() {
                let mut at = 0;
                while at < s.len {
                    let len = CHUNK.min(s.len - at);
                    queue.push_back(Op { job, span: si, at, len });
                    ops += 1;
                    at += len;
                }
            }
            states.push(JobState {
                buf: None,
                size: total as usize,
                finished: false,
                eof_at: vec![None; spans.len()],
                spans,
                ops_left: ops,
                error: None,
            });
        }
        // Jobs without any bytes complete at once.
        for (job, st) in states.iter_mut().enumerate() {
            if st.ops_left == 0 {
                finish(job, st, jobs[job], &self.files, done);
            }
        }
        let mut ops: Vec<Option<Op>> = Vec::new();
        let mut free: Vec<usize> = Vec::new();
        let mut outstanding = 0usize;
        loop {
            // Fill the submission queue.
            while outstanding < self.in_flight {
                let Some(op) = queue.pop_front() else { break };
                let st = &mut states[op.job];
                let span = st.spans[op.span];
                let size = st.size;
                let buf = st.buf.get_or_insert_with(|| AlignedBuf::for_read(size));
                // SAFETY: the op's range lies inside the job buffer (planned above), which
                // stays alive and unmoved (heap allocation) until the job finishes.
                let ptr = unsafe { buf.as_mut_ptr().add((span.buf_offset + op.at) as usize) };
                let fd = types::Fd(self.files.files[span.file].as_raw_fd());
                let entry = opcode::Read::new(fd, ptr, op.len as u32).offset(span.file_offset + op.at);
                let slot = match free.pop() {
                    Some(i) => {
                        ops[i] = Some(op);
                        i
                    }
                    None => {
                        ops.push(Some(op));
                        ops.len() - 1
                    }
                };
                let sqe = entry.build().user_data(slot as u64);
                // SAFETY: the buffer outlives the read (see above); the queue has room
                // because at most `in_flight` (<= ring size) entries are outstanding.
                if unsafe { ring.submission().push(&sqe) }.is_err() {
                    // Full: put it back and submit what we have.
                    let op = ops[slot].take().expect("just stored");
                    free.push(slot);
                    queue.push_front(op);
                    break;
                }
                outstanding += 1;
            }
            if outstanding == 0 {
                break;
            }
            if let Err(e) = ring.submit_and_wait(1) {
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                // The ring itself failed: fail every unfinished job.
                for (job, st) in states.iter_mut().enumerate() {
                    if !st.finished {
                        st.finished = true;
                        // Reads may still land in this buffer: leak it rather than free it.
                        if let Some(b) = st.buf.take() {
                            std::mem::forget(b);
                        }
                        done(job, Err(StoreError::Invalid(format!("io_uring submit failed: {e}"))));
                    }
                }
                return;
            }
            let completions: Vec<(usize, i32)> = ring.completion().map(|c| (c.user_data() as usize, c.result())).collect();
            for (slot, res) in completions {
                outstanding -= 1;
                let op = ops[slot].take().expect("completion for a live op");
                free.push(slot);
                let st = &mut states[op.job];
                let span = st.spans[op.span];
                if res < 0 {
                    let err = std::io::Error::from_raw_os_error(-res);
                    if err.kind() == std::io::ErrorKind::Interrupted {
                        queue.push_back(op);
                        continue;
                    }
                    st.error
                        .get_or_insert_with(|| self.files.read_error(span.file, span.file_offset + op.at, op.len, err));
                } else {
                    let n = res as u64;
                    if n == 0 {
                        let e = &mut st.eof_at[op.span];
                        *e = Some(e.map_or(op.at, |x| x.min(op.at)));
                    } else if n < op.len && self.files.direct {
                        // O_DIRECT reads come up short only at the end of the file
                        // (and the rest could not be asked for unaligned).
                        let e = &mut st.eof_at[op.span];
                        *e = Some(e.map_or(op.at + n, |x| x.min(op.at + n)));
                    } else if n < op.len {
                        queue.push_back(Op {
                            job: op.job,
                            span: op.span,
                            at: op.at + n,
                            len: op.len - n,
                        });
                        continue;
                    }
                }
                st.ops_left -= 1;
                if st.ops_left == 0 {
                    finish(op.job, st, jobs[op.job], &self.files, done);
                }
            }
        }
    }
}

fn finish(job: usize, st: &mut JobState, extents: &[Extent], files: &FileTable, done: &mut dyn FnMut(usize, ReadResult)) {
    if st.finished {
        return;
    }
    st.finished = true;
    let buf = st.buf.take().unwrap_or_else(|| AlignedBuf::for_read(st.size));
    if let Some(e) = st.error.take() {
        done(job, Err(e));
        return;
    }
    for (s, eof) in st.spans.iter().zip(&st.eof_at) {
        if let Some(at) = eof {
            if *at < s.needed {
                done(job, Err(files.truncated(s.file, s.file_offset + s.needed)));
                return;
            }
        }
    }
    done(job, Ok(views(buf, &st.spans, extents)));
}
