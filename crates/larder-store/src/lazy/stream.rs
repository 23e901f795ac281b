//! The first open of a lazy store checked by streaming
//! ([`SourceCheck::Stream`](super::SourceCheck)): every source file streams
//! once, whole, as `pull` streams it (resumable, several files at once) and
//! is checked against the sha256 its source publishes. On the way its
//! spine tensors land in the spine file, the records the disk quota admits
//! land in their layer files, and every expert component it holds is
//! digested ([`Watch`]), so each record's source digest is known before
//! any byte is used. Nothing fetched by range later is trusted: it must
//! match that digest.
//!
//! A file's component digests are saved in `lazy-stream/` when its stream
//! ends, before the journal counts it done, so a rerun streams only the
//! files not done; the folder goes once `lazy.json` is written.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::backend::Rec;
use super::known::{component_digest, source_digest};
use super::records::Key;
use super::{LazyEvent, LazyOptions};
use crate::buf::AlignedBuf;
use crate::digest::Digest;
use crate::fsutil::write_atomic;
use crate::pull::journal::{FileProgress, Journal};
use crate::pull::scatter::{Layout, OpenOutputs, Piece};
use crate::pull::{stream_files, PullEvent, PullFile, PullOptions, StreamObserver};
use crate::remote::FileSource;
use crate::StoreError;

/// Where finished files' component digests wait for the end of the stream.
pub(super) const STREAM_DIR: &str = "lazy-stream";

/// What the stream left on the drive and learned.
pub(super) struct Streamed {
    /// Records written in place, each with the digest of its bytes as they
    /// lie (the records log's) and its length.
    pub kept: Vec<(Key, Digest, u64)>,
    /// Every record's source digest.
    pub known: Vec<(Key, Digest)>,
    /// Per source file: whether its sha256 matched one the source published.
    pub verified: Vec<bool>,
}

/// Streams every source file of `files` into `layout` (spine, and the
/// records of `recs` that fit `budget`), checking each whole; see the
/// module docs.
#[allow(clippy::too_many_arguments)]
pub(super) fn stream_sources(
    remote: &dyn FileSource,
    files: &[PullFile],
    layout: &Layout,
    recs: &[Rec],
    budget: Option<u64>,
    root: &Path,
    store_id: &str,
    opts: &LazyOptions,
    progress: &(dyn Fn(LazyEvent) + Sync),
) -> Result<Streamed, StoreError> {
    let keep = admit(recs, budget);
    let pieces = pieces_kept(layout, recs, &keep, files.len());
    let watch = Watch::new(files, recs, root.join(STREAM_DIR));
    let journal = Journal::open(root, store_id)?;
    let (outputs, created) = OpenOutputs::open(layout)?;
    if created {
        // A store file was (re)created: nothing counted before is on the drive.
        journal.reset()?;
    }
    watch.load_saved(&journal)?;
    let total_bytes: u64 = files.iter().map(|f| f.size).sum();
    let done_bytes: u64 = files.iter().map(|f| journal.get(&f.name).offset).sum();
    progress(LazyEvent::Started {
        total_bytes,
        done_bytes,
        whole_files: true,
    });
    let pull_opts = PullOptions {
        range_bytes: opts.range_bytes.max(1),
        ..PullOptions::default()
    };
    let events = |e: PullEvent| match e {
        PullEvent::Advanced { bytes } => progress(LazyEvent::Advanced { bytes }),
        PullEvent::FileDone { file, verified } => progress(LazyEvent::FileChecked { file, verified }),
        _ => {}
    };
    stream_files(remote, files, &pieces, &outputs, &journal, pull_opts, &watch, &events)?;
    outputs.sync()?;
    let components = watch.components(recs)?;
    let known = recs
        .iter()
        .zip(&components)
        .map(|(r, c)| (r.key, source_digest(r.seed, c.iter().copied())))
        .collect();
    let kept = read_back(recs, &keep, &outputs, &components)?;
    Ok(Streamed {
        kept,
        known,
        verified: watch.verified(),
    })
}

/// Which records the stream writes: in layout order while `budget` has room.
fn admit(recs: &[Rec], budget: Option<u64>) -> Vec<bool> {
    let mut left = budget.unwrap_or(u64::MAX);
    recs.iter()
        .map(|r| {
            let fits = r.len <= left;
            if fits {
                left -= r.len;
            }
            fits
        })
        .collect()
}

/// Per source file, the pieces the stream writes: the spine's, and the
/// components of the records kept (sorted by source offset).
fn pieces_kept(layout: &Layout, recs: &[Rec], keep: &[bool], files: usize) -> Vec<Vec<Piece>> {
    let spine = layout.outputs.len() - 1;
    let mut pieces: Vec<Vec<Piece>> = layout
        .pieces
        .iter()
        .map(|p| p.iter().filter(|x| x.out == spine).copied().collect())
        .collect();
    pieces.resize(files, Vec::new());
    for r in recs.iter().zip(keep).filter(|(_, k)| **k).map(|(r, _)| r) {
        for (x, at) in &r.parts {
            pieces[x.file].push(Piece {
                src: x.offset,
                len: x.len,
                out: r.file,
                dst: r.offset + at,
            });
        }
    }
    for p in &mut pieces {
        p.sort_by_key(|x| x.src);
    }
    pieces
}

/// Reads every kept record back, checks each component against the digest
/// the stream computed (a failing drive, a short write) and digests the
/// record as the records log keeps it.
fn read_back(
    recs: &[Rec],
    keep: &[bool],
    outputs: &OpenOutputs,
    components: &[Vec<Digest>],
) -> Result<Vec<(Key, Digest, u64)>, StoreError> {
    let mut kept = Vec::new();
    for ((r, comps), _) in recs.iter().zip(components).zip(keep).filter(|(_, k)| **k) {
        let mut buf = AlignedBuf::new(r.len as usize);
        let path = &outputs.paths[r.file];
        outputs.files[r.file]
            .read_exact_at(buf.as_mut_slice(), r.offset)
            .map_err(|e| StoreError::io(path, e))?;
        for ((x, at), want) in r.parts.iter().zip(comps) {
            let at = *at as usize;
            if component_digest(&buf.as_ref()[at..at + x.len as usize]) != *want {
                return Err(StoreError::Invalid(format!(
                    "{}: layer {} expert {} read back after writing differs from what was streamed (is the drive failing?)",
                    path.display(),
                    r.key.0,
                    r.key.1
                )));
            }
        }
        let digest = Digest::of_parts_seeded(r.seed, [&buf.as_ref()[..r.payload as usize]]);
        kept.push((r.key, digest, r.len));
    }
    Ok(kept)
}

/// One expert component in a source file: its bytes, and which record
/// part it is.
#[derive(Debug, Clone, Copy)]
struct Component {
    src: u64,
    len: u64,
    rec: usize,
    part: usize,
}

/// A file's components and the digests of those its stream has passed.
#[derive(Default)]
struct FileWatch {
    components: Vec<Component>,
    /// The first component not digested yet, and the state of its hash
    /// when its first bytes were seen.
    next: usize,
    hasher: Option<xxhash_rust::xxh3::Xxh3>,
    /// Digests of `components[..next]`.
    got: Vec<Digest>,
    /// Bytes of a component were skipped (never when streams run in order).
    gap: bool,
    /// The stream ended: whether its sha256 matched a published one.
    verified: Option<bool>,
}

impl FileWatch {
    fn restart(&mut self) {
        self.next = 0;
        self.hasher = None;
        self.got.clear();
        self.gap = false;
        self.verified = None;
    }

    fn observe(&mut self, pos: u64, bytes: &[u8]) {
        let end = pos + bytes.len() as u64;
        while let Some(c) = self.components.get(self.next).copied() {
            if c.src >= end {
                break;
            }
            let from = c.src.max(pos);
            if self.hasher.is_none() && from > c.src {
                self.gap = true;
            }
            let to = (c.src + c.len).min(end);
            let h = self.hasher.get_or_insert_with(xxhash_rust::xxh3::Xxh3::new);
            h.update(&bytes[(from - pos) as usize..(to - pos) as usize]);
            if to < c.src + c.len {
                break;
            }
            self.got.push(Digest(h.digest128()));
            self.hasher = None;
            self.next += 1;
        }
    }
}

/// What a finished file's stream saved: its component digests in source order.
#[derive(Serialize, Deserialize)]
struct Saved {
    file: String,
    size: u64,
    verified: bool,
    /// `[offset, length, digest]` per component.
    components: Vec<(u64, u64, String)>,
}

/// The stream observer that digests every component of every file.
struct Watch {
    files: Vec<Mutex<FileWatch>>,
    names: Vec<(String, u64)>,
    dir: PathBuf,
}

impl Watch {
    fn new(files: &[PullFile], recs: &[Rec], dir: PathBuf) -> Watch {
        let mut watches: Vec<FileWatch> = files.iter().map(|_| FileWatch::default()).collect();
        for (rec, r) in recs.iter().enumerate() {
            for (part, (x, _)) in r.parts.iter().enumerate() {
                if let Some(w) = watches.get_mut(x.file) {
                    w.components.push(Component {
                        src: x.offset,
                        len: x.len,
                        rec,
                        part,
                    });
                }
            }
        }
        for w in &mut watches {
            w.components.sort_by_key(|c| c.src);
        }
        Watch {
            files: watches.into_iter().map(Mutex::new).collect(),
            names: files.iter().map(|f| (f.name.clone(), f.size)).collect(),
            dir,
        }
    }

    fn path(&self, file: usize) -> PathBuf {
        self.dir.join(format!("{file}.json"))
    }

    /// Takes the saved digests of every file the journal counts done; a
    /// done file without them (or with others) streams again.
    fn load_saved(&self, journal: &Journal) -> Result<(), StoreError> {
        for (i, (name, size)) in self.names.iter().enumerate() {
            if !journal.get(name).done {
                continue;
            }
            let saved = std::fs::read(self.path(i))
                .ok()
                .and_then(|b| serde_json::from_slice::<Saved>(&b).ok())
                .filter(|s| s.file == *name && s.size == *size);
            let mut w = lock(&self.files[i]);
            let digests: Option<Vec<Digest>> = saved.as_ref().and_then(|s| {
                let same = s.components.len() == w.components.len()
                    && s.components.iter().zip(&w.components).all(|(a, c)| a.0 == c.src && a.1 == c.len);
                same.then(|| s.components.iter().map(|a| Digest::parse(&a.2)).collect())?
            });
            match (saved, digests) {
                (Some(s), Some(got)) => {
                    w.next = got.len();
                    w.got = got;
                    w.verified = Some(s.verified);
                }
                _ => journal.set(name, FileProgress::default())?,
            }
        }
        Ok(())
    }

    /// Per record, its components' digests in part order.
    fn components(&self, recs: &[Rec]) -> Result<Vec<Vec<Digest>>, StoreError> {
        let mut out: Vec<Vec<Option<Digest>>> = recs.iter().map(|r| vec![None; r.parts.len()]).collect();
        for (i, w) in self.files.iter().enumerate() {
            let w = lock(w);
            if w.got.len() != w.components.len() {
                return Err(StoreError::Invalid(format!(
                    "{}: streamed, but {} of its {} expert components were digested",
                    self.names[i].0,
                    w.got.len(),
                    w.components.len()
                )));
            }
            for (c, d) in w.components.iter().zip(&w.got) {
                out[c.rec][c.part] = Some(*d);
            }
        }
        out.into_iter()
            .zip(recs)
            .map(|(parts, r)| {
                parts
                    .into_iter()
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| StoreError::Invalid(format!("layer {} expert {}: a component lies in no source file", r.key.0, r.key.1)))
            })
            .collect()
    }

    fn verified(&self) -> Vec<bool> {
        self.files.iter().map(|w| lock(w).verified == Some(true)).collect()
    }
}

impl StreamObserver for Watch {
    fn restart(&self, file: usize) {
        if let Some(w) = self.files.get(file) {
            lock(w).restart();
        }
    }

    fn observe(&self, file: usize, pos: u64, bytes: &[u8]) {
        if let Some(w) = self.files.get(file) {
            lock(w).observe(pos, bytes);
        }
    }

    fn finished(&self, file: usize, verified: bool) -> Result<(), StoreError> {
        let Some(w) = self.files.get(file) else { return Ok(()) };
        let mut w = lock(w);
        let (name, size) = &self.names[file];
        if w.gap || w.got.len() != w.components.len() {
            return Err(StoreError::Invalid(format!(
                "{name}: its stream ended with {} of {} expert components digested",
                w.got.len(),
                w.components.len()
            )));
        }
        w.verified = Some(verified);
        let saved = Saved {
            file: name.clone(),
            size: *size,
            verified,
            components: w
                .components
                .iter()
                .zip(&w.got)
                .map(|(c, d)| (c.src, c.len, d.to_string()))
                .collect(),
        };
        std::fs::create_dir_all(&self.dir).map_err(|e| StoreError::io(&self.dir, e))?;
        let text = serde_json::to_vec(&saved).map_err(|e| StoreError::Invalid(e.to_string()))?;
        write_atomic(&self.path(file), &text)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch_of(ranges: &[(u64, u64)]) -> FileWatch {
        FileWatch {
            components: ranges
                .iter()
                .enumerate()
                .map(|(i, &(src, len))| Component { src, len, rec: i, part: 0 })
                .collect(),
            ..FileWatch::default()
        }
    }

    #[test]
    fn components_are_digested_from_bytes_in_any_split() {
        let data: Vec<u8> = (0..64u8).collect();
        let ranges = [(4, 10), (14, 1), (20, 30)];
        let want: Vec<Digest> = ranges
            .iter()
            .map(|&(a, n)| component_digest(&data[a as usize..(a + n) as usize]))
            .collect();
        for step in [1, 3, 7, 64] {
            let mut w = watch_of(&ranges);
            let mut pos = 0;
            for chunk in data.chunks(step) {
                w.observe(pos, chunk);
                pos += chunk.len() as u64;
            }
            assert_eq!((w.got.clone(), w.gap), (want.clone(), false), "chunks of {step}");
        }
        // A stream that starts inside a component has skipped bytes of it.
        let mut w = watch_of(&ranges);
        w.observe(5, &data[5..]);
        assert!(w.gap);
    }

    #[test]
    fn admission_keeps_records_in_order_while_the_budget_has_room() {
        let rec = |len| Rec {
            key: (0, 0),
            file: 0,
            offset: 0,
            len,
            payload: len,
            seed: 0,
            parts: Vec::new(),
        };
        let recs = [rec(10), rec(20), rec(5), rec(30)];
        assert_eq!(admit(&recs, Some(35)), vec![true, true, true, false]);
        assert_eq!(admit(&recs, None), vec![true; 4]);
        assert_eq!(admit(&recs, Some(0)), vec![false; 4]);
    }
}
