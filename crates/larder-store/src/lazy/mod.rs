//! Lazy stores: a partial local copy of a remote checkpoint that grows as
//! experts are used. Opening one fetches the spine (by range, resumable)
//! and the small files; every routed expert is then fetched the first time
//! a forward pass (or a prefetch) asks for it, written as a record of the
//! store `pack` would make, at the place `pack` would put it, and kept
//! across restarts ([`LazyBackend`], [`records`]). With a disk quota the
//! coldest records make room. Output is bit-identical to a local run: the
//! records are the same bytes, and the model reads them the same way.
//!
//! The folder holds `lazy.json` (the source, its files, the sealed spine and
//! carried files; written once the spine is complete), `lazy-records.log`,
//! the spine and small files at the root, and the layer files under their
//! temporary names (sparse: only fetched records take space). It has no
//! `manifest.json`: it is never mistaken for a complete store.

mod backend;
mod records;

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use serde::{Deserialize, Serialize};

pub use backend::{LazyBackend, LazyCounts};
pub use records::RECORDS_LOG;

use crate::fsutil::{lock_exclusive, write_atomic, FileLock};
use crate::io::{open_backend, IoOptions};
use crate::location::{ExpertIndex, ExpertLocation, Extent};
use crate::manifest::{record_location, CarriedFile, SpineFile, MANIFEST};
use crate::pack::{copy_files, load_or_make_plan, resolve, PackSource, LOCK, SPINE};
use crate::pull::journal::{FileProgress, Journal};
use crate::pull::scatter::{Layout, Piece};
use crate::pull::PullFile;
use crate::remote::{FileSource, RangeBackend};
use crate::size::format_size;
use crate::StoreError;
use backend::Rec;
use records::Records;

/// The lazy store's description in its folder.
pub const LAZY_STATE: &str = "lazy.json";
const FORMAT: &str = "larder-lazy";
const VERSION: u32 = 1;

/// A source file as the cache was made from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFileMeta {
    pub name: String,
    pub size: u64,
    /// As the source published it (the hub's LFS sha256), if it did.
    pub sha256: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct LazyState {
    format: String,
    version: u32,
    /// The SOURCE the cache was made from, as given.
    source: String,
    store_id: String,
    files: Vec<SourceFileMeta>,
    carried: Vec<CarriedFile>,
    spine: SpineFile,
}

/// How to open a lazy store.
#[derive(Debug, Clone, Copy)]
pub struct LazyOptions {
    /// Most bytes the folder may hold: spine, small files and expert
    /// records (`None`: no limit).
    pub disk_quota: Option<u64>,
    /// Range requests in flight (spine chunks, or components of the
    /// experts one batch misses).
    pub ranges: usize,
    /// Bytes per spine request.
    pub range_bytes: u64,
    /// How records on the drive are read.
    pub io: IoOptions,
}

impl Default for LazyOptions {
    fn default() -> Self {
        LazyOptions {
            disk_quota: None,
            ranges: 8,
            range_bytes: 8 << 20,
            io: IoOptions::default(),
        }
    }
}

/// What opening a lazy store reports.
#[derive(Debug, Clone)]
pub enum LazyEvent {
    /// The spine's bytes, and those already in the folder.
    SpineStarted {
        total_bytes: u64,
        done_bytes: u64,
    },
    SpineAdvanced {
        bytes: u64,
    },
    /// The spine is complete and sealed.
    SpineDone,
}

/// An open lazy store: the index its experts are read by, its backend, and
/// what the spine and small files must be.
pub struct LazyStore {
    pub root: PathBuf,
    pub index: ExpertIndex,
    pub spine: Vec<SpineFile>,
    pub carried: Vec<CarriedFile>,
    pub backend: Arc<LazyBackend>,
    /// The folder's lock: one process uses a cache at a time.
    pub lock: FileLock,
}

/// Whether `dir` holds a lazy store.
pub fn is_lazy(dir: &Path) -> bool {
    dir.join(LAZY_STATE).is_file()
}

/// Opens (making it on first use) the lazy store of `src` in `root`,
/// fetched from `remote`; `source` is the SOURCE as given and `files[i]`
/// describes `src.files[i]`.
pub fn open(
    remote: Arc<dyn FileSource>,
    source: &str,
    files: &[PullFile],
    src: &PackSource,
    root: &Path,
    opts: LazyOptions,
    progress: &dyn Fn(LazyEvent),
) -> Result<LazyStore, StoreError> {
    std::fs::create_dir_all(root).map_err(|e| StoreError::io(root, e))?;
    let lock = lock_exclusive(&root.join(LOCK), "another larder using this --cache-dir")?;
    if root.join(MANIFEST).exists() {
        return Err(StoreError::Invalid(format!(
            "{}: a packed store, not a lazy cache: use `--model {}` without --cache-dir, or another --cache-dir",
            root.display(),
            root.display()
        )));
    }
    let saved = read_state(root)?;
    if let Some(s) = saved.as_ref().filter(|s| s.source != source) {
        return Err(StoreError::Invalid(format!(
            "{}: a lazy cache of {}, not {source}: use another --cache-dir",
            root.join(LAZY_STATE).display(),
            s.source
        )));
    }
    let plan = load_or_make_plan(src, root, &[], &mut |_| {})?;
    let drives: Vec<PathBuf> = plan.drives.iter().map(|d| resolve(root, &d.path)).collect();
    let layout = Layout::new(src, &plan, &drives, root.join(SPINE))?;
    let budget = records_budget(src, &layout, opts.disk_quota)?;
    let state = match saved.filter(|s| s.store_id == plan.store_id && root.join(SPINE).is_file()) {
        Some(s) => s,
        None => make_state(remote.as_ref(), source, files, src, &layout, root, &plan.store_id, opts, progress)?,
    };
    let backend = open_backend_of(remote, &layout, src, state.files.clone(), budget, root, opts)?;
    Ok(LazyStore {
        root: root.to_path_buf(),
        index: index_of(src, &layout, &backend),
        spine: vec![state.spine],
        carried: state.carried,
        backend: Arc::new(backend),
        lock,
    })
}

fn read_state(root: &Path) -> Result<Option<LazyState>, StoreError> {
    let path = root.join(LAZY_STATE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            let s: LazyState = serde_json::from_slice(&bytes).map_err(|e| StoreError::manifest(&path, format!("unreadable: {e}")))?;
            if s.format != FORMAT || s.version != VERSION {
                return Err(StoreError::manifest(
                    &path,
                    format!(
                        "a {} v{} cache; this larder reads {FORMAT} v{VERSION}: use another --cache-dir",
                        s.format, s.version
                    ),
                ));
            }
            Ok(Some(s))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError::io(&path, e)),
    }
}

/// The bytes records may take under `quota`: what the spine and small
/// files leave; an error when that is less than one record.
fn records_budget(src: &PackSource, layout: &Layout, quota: Option<u64>) -> Result<Option<u64>, StoreError> {
    let Some(quota) = quota else { return Ok(None) };
    let spine = layout.outputs.last().map_or(0, |o| o.len);
    let small: u64 = src.copy.iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum();
    let record = layout.layers.iter().map(|l| l.record_len).max().unwrap_or(0);
    let least = spine + small + record;
    if quota < least {
        return Err(StoreError::Invalid(format!(
            "--disk-quota {} is too small: the spine takes {}, the small files {} and one expert record {}; \
             give at least {}",
            format_size(quota),
            format_size(spine),
            format_size(small),
            format_size(record),
            format_size(least)
        )));
    }
    Ok(Some(quota - spine - small))
}

/// Fetches and seals the spine, copies the small files and writes `lazy.json`.
#[allow(clippy::too_many_arguments)]
fn make_state(
    remote: &dyn FileSource,
    source: &str,
    files: &[PullFile],
    src: &PackSource,
    layout: &Layout,
    root: &Path,
    store_id: &str,
    opts: LazyOptions,
    progress: &dyn Fn(LazyEvent),
) -> Result<LazyState, StoreError> {
    let mut metas = Vec::with_capacity(files.len());
    for f in files {
        let meta = remote.file_meta(&f.name).map_err(|e| StoreError::Invalid(e.to_string()))?;
        metas.push(SourceFileMeta {
            name: f.name.clone(),
            size: f.size,
            sha256: meta.sha256,
        });
    }
    fetch_spine(remote, files, layout, root, store_id, opts, progress)?;
    let spine = crate::pull::seal::seal_spine(src, &layout.spine_header, root)?;
    Journal::open(root, store_id)?.remove()?;
    progress(LazyEvent::SpineDone);
    let state = LazyState {
        format: FORMAT.into(),
        version: VERSION,
        source: source.to_string(),
        store_id: store_id.to_string(),
        files: metas,
        carried: link_files(&src.copy, root)?,
        spine,
    };
    let text = serde_json::to_vec_pretty(&state).map_err(|e| StoreError::Invalid(e.to_string()))?;
    write_atomic(&root.join(LAZY_STATE), &text)?;
    Ok(state)
}

/// Puts the small files fetched into the staging folder at the root as
/// hard links (one copy on the drive; a copy where links are refused).
fn link_files(files: &[PathBuf], root: &Path) -> Result<Vec<CarriedFile>, StoreError> {
    let mut carried = Vec::with_capacity(files.len());
    for f in files {
        let Some(name) = f.file_name() else { continue };
        let dst = root.join(name);
        let _ = std::fs::remove_file(&dst);
        if std::fs::hard_link(f, &dst).is_err() {
            carried.extend(copy_files(std::slice::from_ref(f), root)?);
            continue;
        }
        let bytes = std::fs::read(&dst).map_err(|e| StoreError::io(&dst, e))?;
        carried.push(CarriedFile {
            name: name.to_string_lossy().into_owned(),
            size: bytes.len() as u64,
            digest: crate::digest::Digest::of(&bytes).to_string(),
        });
    }
    Ok(carried)
}

/// Fetches every spine tensor into the spine file (under its temporary
/// name), `opts.ranges` requests in flight; progress per source file is
/// saved after the bytes it counts are synced, so a rerun resumes.
fn fetch_spine(
    remote: &dyn FileSource,
    files: &[PullFile],
    layout: &Layout,
    root: &Path,
    store_id: &str,
    opts: LazyOptions,
    progress: &dyn Fn(LazyEvent),
) -> Result<(), StoreError> {
    let out = layout.outputs.len() - 1;
    let spine = &layout.outputs[out];
    if spine.final_path.exists() {
        return Ok(());
    }
    let journal = Journal::open(root, store_id)?;
    let (file, created) = spine.open()?;
    if created {
        journal.reset()?;
    }
    let pieces: Vec<Vec<Piece>> = layout
        .pieces
        .iter()
        .map(|p| p.iter().filter(|x| x.out == out).copied().collect())
        .collect();
    let total: u64 = pieces.iter().flatten().map(|p| p.len).sum();
    let done: u64 = files
        .iter()
        .zip(&pieces)
        .map(|(f, p)| {
            let from = journal.get(&f.name).offset;
            p.iter().filter(|x| x.src + x.len <= from).map(|x| x.len).sum::<u64>()
        })
        .sum();
    progress(LazyEvent::SpineStarted {
        total_bytes: total,
        done_bytes: done,
    });
    let fail = |e: crate::remote::RemoteError| StoreError::Invalid(format!("{e}; the spine fetched so far is kept: run again to resume"));
    for (f, pieces) in files.iter().zip(&pieces) {
        let from = journal.get(&f.name).offset;
        let chunks = chunks(pieces, from, opts.range_bytes.max(1));
        for group in chunks.chunks(opts.ranges.max(1)) {
            let ranges: Vec<(u64, u64)> = group.iter().map(|c| (c.0, c.1)).collect();
            let got = remote.read_ranges(&f.name, &ranges, ranges.len()).map_err(fail)?;
            for ((at, len), bytes) in ranges.iter().zip(got) {
                if bytes.len() as u64 != *len {
                    return Err(StoreError::Invalid(format!(
                        "{}: {} bytes came for the {len} at offset {at} asked",
                        f.name,
                        bytes.len()
                    )));
                }
                scatter(&file, &spine.path, pieces, *at, &bytes)?;
                progress(LazyEvent::SpineAdvanced { bytes: *len });
            }
            file.sync_data().map_err(|e| StoreError::io(&spine.path, e))?;
            let reached = ranges.last().map_or(from, |r| r.0 + r.1);
            journal.set(
                &f.name,
                FileProgress {
                    offset: reached,
                    done: false,
                    verified: false,
                },
            )?;
        }
    }
    Ok(())
}

/// The ranges covering `pieces` from source offset `from`: adjacent pieces
/// joined, each range at most `max` bytes.
fn chunks(pieces: &[Piece], from: u64, max: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for p in pieces.iter().filter(|p| p.src >= from) {
        let (mut at, end) = (p.src, p.src + p.len);
        while at < end {
            match out.last_mut() {
                Some(last) if last.0 + last.1 == at && last.1 < max => {
                    let n = (max - last.1).min(end - at);
                    last.1 += n;
                    at += n;
                }
                _ => {
                    let n = max.min(end - at);
                    out.push((at, n));
                    at += n;
                }
            }
        }
    }
    out
}

/// Writes the bytes of source range `at..` to where its pieces land.
fn scatter(file: &File, path: &Path, pieces: &[Piece], at: u64, bytes: &[u8]) -> Result<(), StoreError> {
    let end = at + bytes.len() as u64;
    for p in pieces.iter().filter(|p| p.src < end && p.src + p.len > at) {
        let (from, to) = (p.src.max(at), (p.src + p.len).min(end));
        let slice = &bytes[(from - at) as usize..(to - at) as usize];
        file.write_all_at(slice, p.dst + (from - p.src))
            .map_err(|e| StoreError::io(path, e))?;
    }
    Ok(())
}

/// Opens the layer files (made at full length, sparse, where missing),
/// replays the records log and opens the local backend.
fn open_backend_of(
    remote: Arc<dyn FileSource>,
    layout: &Layout,
    src: &PackSource,
    sources: Vec<crate::lazy::SourceFileMeta>,
    budget: Option<u64>,
    root: &Path,
    opts: LazyOptions,
) -> Result<LazyBackend, StoreError> {
    let mut writers = Vec::new();
    let mut paths = Vec::new();
    let mut recs = Vec::new();
    let mut remade = Vec::new();
    for (f, lo) in layout.layers.iter().enumerate() {
        let out = &layout.outputs[f];
        let (file, created) = out.open()?;
        writers.push(file);
        paths.push(out.path.clone());
        let layer = &src.layers[lo.layer];
        for (i, &e) in lo.mine.iter().enumerate() {
            let key = (layer.layer, e);
            if created {
                remade.push(key);
            }
            recs.push(Rec {
                key,
                file: f,
                offset: crate::layer_file::record_offset(i, lo.record_len),
                len: lo.record_len,
                payload: lo.parts.iter().map(|p| p.len).sum(),
                seed: lo.seeds[e],
                parts: layer.experts[e].iter().copied().zip(lo.parts.iter().map(|p| p.offset)).collect(),
            });
        }
    }
    let by_key: HashMap<_, _> = recs.iter().enumerate().map(|(i, r)| (r.key, i)).collect();
    let by_extent = recs.iter().enumerate().map(|(i, r)| ((r.file, r.offset), i)).collect();
    let remade: std::collections::HashSet<_> = remade.into_iter().collect();
    let size = |k| by_key.get(&k).map(|&i: &usize| recs[i].len);
    let mut records = Records::open(root, budget, &size, &|k| remade.contains(&k))?;
    // A smaller quota than last time: evict down to it.
    let victims = records.reserve(0, &Default::default())?.unwrap_or_default();
    let names = sources.iter().map(|s| s.name.clone()).collect();
    let backend = LazyBackend {
        local: open_backend(&paths, opts.io)?,
        source: RangeBackend::new(remote.clone(), names, opts.ranges),
        writers,
        paths,
        checked: sources.iter().map(|_| OnceLock::new()).collect(),
        sources,
        recs,
        by_extent,
        by_key,
        records: Mutex::new(records),
        fetching: Mutex::new(Default::default()),
        fetched: Condvar::new(),
        remote,
        counts: Mutex::new(LazyCounts::default()),
        problem: Mutex::new(None),
    };
    backend.punch(&victims)?;
    Ok(backend)
}

/// The index the store reads experts by: one record per expert, as the
/// manifest of the packed store would give it (without digests: the
/// backend checks records against the digests they were written with).
fn index_of(src: &PackSource, layout: &Layout, backend: &LazyBackend) -> ExpertIndex {
    let layers = src.layers.iter().map(|l| l.layer + 1).max().unwrap_or(0);
    let mut index = ExpertIndex {
        files: backend.paths.clone(),
        parts: vec![Vec::new(); layers],
        layers: vec![Vec::new(); layers],
        ..Default::default()
    };
    for l in &src.layers {
        index.layers[l.layer] = vec![ExpertLocation::default(); l.experts.len()];
    }
    for (f, lo) in layout.layers.iter().enumerate() {
        let layer = src.layers[lo.layer].layer;
        index.parts[layer] = lo.parts.iter().map(|p| p.desc.clone()).collect();
        for (i, &e) in lo.mine.iter().enumerate() {
            let record = Extent {
                file: f,
                offset: crate::layer_file::record_offset(i, lo.record_len),
                len: lo.record_len,
            };
            index.layers[layer][e] = record_location(record, &lo.parts, None, lo.seeds[e]);
        }
    }
    index
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(src: u64, len: u64) -> Piece {
        Piece { src, len, out: 0, dst: 0 }
    }

    #[test]
    fn spine_chunks_join_adjacent_pieces_and_split_long_ones() {
        let pieces = [piece(10, 5), piece(15, 5), piece(30, 25), piece(60, 1)];
        assert_eq!(chunks(&pieces, 0, 10), vec![(10, 10), (30, 10), (40, 10), (50, 5), (60, 1)]);
        assert_eq!(chunks(&pieces, 30, 100), vec![(30, 25), (60, 1)]);
    }
}
