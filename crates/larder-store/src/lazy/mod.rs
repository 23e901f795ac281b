//! Lazy stores: a partial local copy of a remote checkpoint that grows as
//! experts are used. Opening one fetches the spine (by range, resumable)
//! and the small files; every routed expert is then fetched the first time
//! a forward pass (or a prefetch) asks for it, written as a record of the
//! store `pack` would make, at the place `pack` would put it, and kept
//! across restarts ([`LazyBackend`], `records`). With a disk quota the
//! coldest records make room. Output is bit-identical to a local run: the
//! records are the same bytes, and the model reads them the same way.
//!
//! Nothing from the source is trusted as it arrives ([`SourceCheck`]): by
//! default every source file streams once, whole, with its sha256 checked,
//! before the model loads (`stream`), and every expert fetched by range
//! later must match the digest its components had then (`known`). With
//! `FirstFetch`, a record's first fetch sets that digest instead.
//!
//! The folder holds `lazy.json` (the source, its files, the sealed spine and
//! carried files; written once the spine is complete), `lazy-records.log`,
//! `lazy-sources.log`, the spine and small files at the root, and the layer
//! files under their temporary names (sparse: only fetched records take
//! space). It has no `manifest.json`: it is never mistaken for a complete
//! store. [`verify`] checks one without the network.

mod backend;
mod known;
mod records;
mod stream;
mod verify;

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use serde::{Deserialize, Serialize};

pub use backend::{LazyBackend, LazyCounts};
pub(crate) use known::SOURCES_LOG;
pub use records::RECORDS_LOG;
pub use verify::{verify, LazyVerifyReport};

use crate::fsutil::{lock_exclusive, write_atomic, FileLock};
use crate::io::{open_backend, IoOptions};
use crate::location::{ExpertIndex, ExpertLocation, Extent};
use crate::manifest::{record_location, CarriedFile, SpineFile, MANIFEST};
use crate::pack::copy_files;
use crate::pack_plan::{load_or_make_plan, resolve, PackSource, LOCK, SPINE};
use crate::pull::journal::{FileProgress, Journal};
use crate::pull::scatter::{Layout, Piece};
use crate::pull::PullFile;
use crate::remote::{FileSource, RangeBackend};
use crate::size::format_size;
use crate::StoreError;
use backend::Rec;
use known::Known;
use records::{Key, Records};

/// The lazy store's description in its folder.
pub const LAZY_STATE: &str = "lazy.json";
const FORMAT: &str = "larder-lazy";
const VERSION: u32 = 1;

/// A source file as the cache was made from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SourceFileMeta {
    pub name: String,
    pub size: u64,
    /// As the source published it (the hub's LFS sha256), if it did.
    pub sha256: Option<String>,
    /// Whether the whole file was streamed and matched that sha256.
    #[serde(default)]
    pub verified: bool,
}

/// How bytes from the source are checked before a lazy store uses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourceCheck {
    /// Every source file streams once, whole, and is checked against the
    /// sha256 its source publishes before the model loads (a file without
    /// one is digested as it streamed, and only that is trusted); each
    /// expert component is digested on the way, and every later fetch by
    /// range must match. As trustworthy as `pull`; the first open moves
    /// the whole checkpoint once (records beyond the quota are not kept).
    #[default]
    Stream,
    /// Only the spine's ranges and the experts used are fetched; a range's
    /// first fetch is trusted (its digest recorded), every later fetch and
    /// read must match it. Files are not checked against their sha256.
    FirstFetch,
}

impl SourceCheck {
    pub fn name(self) -> &'static str {
        match self {
            SourceCheck::Stream => "stream",
            SourceCheck::FirstFetch => "first-fetch",
        }
    }

    /// Parses `stream` or `first-fetch`.
    pub fn parse(s: &str) -> Result<SourceCheck, String> {
        match s {
            "stream" => Ok(SourceCheck::Stream),
            "first-fetch" => Ok(SourceCheck::FirstFetch),
            _ => Err(format!("{s:?}: expected stream or first-fetch")),
        }
    }
}

/// Caches made before [`SourceCheck`] existed trusted first fetches.
fn legacy_check() -> SourceCheck {
    SourceCheck::FirstFetch
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct LazyState {
    format: String,
    version: u32,
    /// The SOURCE the cache was made from, as given.
    source: String,
    store_id: String,
    #[serde(default = "legacy_check")]
    check: SourceCheck,
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
    /// How the source is checked (`None`: as the cache was made; a new
    /// cache streams, [`SourceCheck::Stream`]).
    pub check: Option<SourceCheck>,
    /// After a fetch finds the source unreachable, how long fetches fail at
    /// once before the source is asked again (the circuit breaker).
    pub retry_source_after: std::time::Duration,
}

impl Default for LazyOptions {
    fn default() -> Self {
        LazyOptions {
            disk_quota: None,
            ranges: 8,
            range_bytes: 8 << 20,
            io: IoOptions::default(),
            check: None,
            retry_source_after: std::time::Duration::from_secs(30),
        }
    }
}

/// What opening a lazy store reports.
#[derive(Debug, Clone)]
pub enum LazyEvent {
    /// The bytes to fetch before the model loads (the spine's ranges, or
    /// with `whole_files` every source file), and those already in the folder.
    Started {
        total_bytes: u64,
        done_bytes: u64,
        whole_files: bool,
    },
    Advanced {
        bytes: u64,
    },
    /// A source file streamed whole: its sha256 matched the published one
    /// (`verified`), or none was published.
    FileChecked {
        file: String,
        verified: bool,
    },
    /// The spine is complete and sealed.
    Done,
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
    progress: &(dyn Fn(LazyEvent) + Sync),
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
    let recs = records_of(src, &layout);
    let reuse = saved.filter(|s| s.store_id == plan.store_id && root.join(SPINE).is_file());
    if let (Some(s), Some(want)) = (reuse.as_ref(), opts.check) {
        if s.check != want {
            return Err(StoreError::Invalid(format!(
                "{}: this cache was made with --source-check {}, not {}: drop --source-check, or use another --cache-dir",
                root.join(LAZY_STATE).display(),
                s.check.name(),
                want.name()
            )));
        }
    }
    let (state, kept) = match reuse {
        Some(s) => (s, Vec::new()),
        None => {
            let made = Making {
                remote: remote.as_ref(),
                source,
                files,
                src,
                layout: &layout,
                recs: &recs,
                budget,
                root,
                store_id: &plan.store_id,
                opts,
            };
            made.make(progress)?
        }
    };
    let backend = open_backend_of(remote, &layout, recs, &state, budget, root, opts)?;
    backend.adopt(&kept)?;
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

/// A record written to the drive: its key, the digest of its bytes as they
/// lie, and its length.
type Written = (Key, crate::digest::Digest, u64);

/// What making a lazy store's folder needs.
struct Making<'a> {
    remote: &'a dyn FileSource,
    source: &'a str,
    files: &'a [PullFile],
    src: &'a PackSource,
    layout: &'a Layout,
    recs: &'a [Rec],
    budget: Option<u64>,
    root: &'a Path,
    store_id: &'a str,
    opts: LazyOptions,
}

impl Making<'_> {
    /// Fetches and checks what the model needs before it loads (every file
    /// streamed whole, or the spine's ranges; [`SourceCheck`]), seals the
    /// spine, copies the small files and writes `lazy.json` last; the
    /// records written on the way.
    fn make(&self, progress: &(dyn Fn(LazyEvent) + Sync)) -> Result<(LazyState, Vec<Written>), StoreError> {
        let check = self.opts.check.unwrap_or_default();
        let mut metas = Vec::with_capacity(self.files.len());
        for f in self.files {
            let meta = self.remote.file_meta(&f.name).map_err(|e| StoreError::Invalid(e.to_string()))?;
            metas.push(SourceFileMeta {
                name: f.name.clone(),
                size: f.size,
                sha256: meta.sha256,
                verified: false,
            });
        }
        let kept = match check {
            SourceCheck::Stream => {
                let streamed = stream::stream_sources(
                    self.remote,
                    self.files,
                    self.layout,
                    self.recs,
                    self.budget,
                    self.root,
                    self.store_id,
                    &self.opts,
                    progress,
                )?;
                for (m, v) in metas.iter_mut().zip(&streamed.verified) {
                    m.verified = *v;
                }
                Known::write_all(self.root, &streamed.known)?;
                streamed.kept
            }
            SourceCheck::FirstFetch => {
                fetch_spine(self.remote, self.files, self.layout, self.root, self.store_id, self.opts, progress)?;
                // A cache made anew has learned nothing yet.
                Known::write_all(self.root, &[])?;
                Vec::new()
            }
        };
        let spine = crate::pull::seal::seal_spine(self.src, &self.layout.spine_header, self.root)?;
        Journal::open(self.root, self.store_id)?.remove()?;
        progress(LazyEvent::Done);
        let state = LazyState {
            format: FORMAT.into(),
            version: VERSION,
            source: self.source.to_string(),
            store_id: self.store_id.to_string(),
            check,
            files: metas,
            carried: link_files(&self.src.copy, self.root)?,
            spine,
        };
        let text = serde_json::to_vec_pretty(&state).map_err(|e| StoreError::Invalid(e.to_string()))?;
        write_atomic(&self.root.join(LAZY_STATE), &text)?;
        let _ = std::fs::remove_dir_all(self.root.join(stream::STREAM_DIR));
        Ok((state, kept))
    }
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
    progress: &(dyn Fn(LazyEvent) + Sync),
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
    progress(LazyEvent::Started {
        total_bytes: total,
        done_bytes: done,
        whole_files: false,
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
                progress(LazyEvent::Advanced { bytes: *len });
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

/// The ranges covering `pieces` from source offset `from` (the journal's
/// resume point, which may fall inside a piece: its rest is fetched):
/// adjacent pieces joined, each range at most `max` bytes.
fn chunks(pieces: &[Piece], from: u64, max: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for p in pieces.iter().filter(|p| p.src + p.len > from) {
        let (mut at, end) = (p.src.max(from), p.src + p.len);
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

/// Every record of the store `layout` places: its key, place, digest seed
/// and where its components lie in the source files.
fn records_of(src: &PackSource, layout: &Layout) -> Vec<Rec> {
    let mut recs = Vec::new();
    for (f, lo) in layout.layers.iter().enumerate() {
        let layer = &src.layers[lo.layer];
        for (i, &e) in lo.mine.iter().enumerate() {
            recs.push(Rec {
                key: (layer.layer, e),
                file: f,
                offset: crate::layer_file::record_offset(i, lo.record_len),
                len: lo.record_len,
                payload: lo.parts.iter().map(|p| p.len).sum(),
                seed: lo.seeds[e],
                parts: layer.experts[e].iter().copied().zip(lo.parts.iter().map(|p| p.offset)).collect(),
            });
        }
    }
    recs
}

/// Opens the layer files (made at full length, sparse, where missing),
/// replays the records log and opens the local backend.
fn open_backend_of(
    remote: Arc<dyn FileSource>,
    layout: &Layout,
    recs: Vec<Rec>,
    state: &LazyState,
    budget: Option<u64>,
    root: &Path,
    opts: LazyOptions,
) -> Result<LazyBackend, StoreError> {
    let mut writers = Vec::new();
    let mut paths = Vec::new();
    let mut remade = std::collections::HashSet::new();
    for f in 0..layout.layers.len() {
        let out = &layout.outputs[f];
        let (file, created) = out.open()?;
        writers.push(file);
        paths.push(out.path.clone());
        if created {
            remade.extend(recs.iter().filter(|r| r.file == f).map(|r| r.key));
        }
    }
    let by_key: HashMap<_, _> = recs.iter().enumerate().map(|(i, r)| (r.key, i)).collect();
    let by_extent = recs.iter().enumerate().map(|(i, r)| ((r.file, r.offset), i)).collect();
    let size = |k| by_key.get(&k).map(|&i: &usize| recs[i].len);
    let mut records = Records::open(root, budget, &size, &|k| remade.contains(&k))?;
    // A smaller quota than last time: evict down to it.
    let victims = records.reserve(0, &Default::default())?.unwrap_or_default();
    let sources = state.files.clone();
    let names = sources.iter().map(|s| s.name.clone()).collect();
    let backend = LazyBackend {
        local: open_backend(&paths, opts.io)?,
        source: RangeBackend::new(remote.clone(), names, opts.ranges),
        writers,
        paths,
        checked: sources.iter().map(|_| OnceLock::new()).collect(),
        sources,
        check: state.check,
        recs,
        by_extent,
        by_key,
        records: Mutex::new(records),
        known: Mutex::new(Known::open(root)?),
        fetching: Mutex::new(Default::default()),
        fetched: Condvar::new(),
        remote,
        counts: Mutex::new(LazyCounts::default()),
        problems: Mutex::new(Default::default()),
        breaker: Mutex::new(Default::default()),
        cooldown: opts.retry_source_after,
    };
    backend.punch(&victims)?;
    note_free_space(&backend, root, budget);
    Ok(backend)
}

/// Notes (for the caller to report) when the cache's file system has no
/// room for another record, or less than the quota leaves records: fetched
/// experts would then be used from RAM and not kept.
fn note_free_space(backend: &LazyBackend, root: &Path, budget: Option<u64>) {
    let Ok(space) = crate::drive::fs_space(root) else { return };
    let record = backend.recs.iter().map(|r| r.len).max().unwrap_or(0);
    let held = backend.records.lock().map(|r| r.held().1).unwrap_or(0);
    let room = budget.map(|b| b.saturating_sub(held));
    if space.free < room.unwrap_or(record).min(record).max(1) {
        backend.note(format!(
            "lazy cache {}: only {} free on its drive, less than one expert record ({}): fetched experts will be \
             used from RAM and not kept; free space there, or use another --cache-dir",
            root.display(),
            format_size(space.free),
            format_size(record)
        ));
    } else if let Some(room) = room.filter(|r| space.free < *r) {
        backend.note(format!(
            "lazy cache {}: --disk-quota leaves {} for expert records but only {} is free on its drive: the cache \
             stops keeping experts when the drive fills",
            root.display(),
            format_size(room),
            format_size(space.free)
        ));
    }
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

    #[test]
    fn a_resume_point_inside_a_piece_fetches_the_rest_of_that_piece() {
        let pieces = [piece(10, 5), piece(15, 5), piece(30, 25), piece(60, 1)];
        // Every byte at or after the resume point, in each piece, exactly once.
        for from in 0..62 {
            let got = chunks(&pieces, from, 7);
            let covered: Vec<u64> = got.iter().flat_map(|&(a, n)| a..a + n).collect();
            let want: Vec<u64> = pieces.iter().flat_map(|p| p.src..p.src + p.len).filter(|&b| b >= from).collect();
            assert_eq!(covered, want, "resume at {from}");
        }
    }
}
