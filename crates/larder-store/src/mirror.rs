//! Mirrored hot experts: copies of a store's most demanded records on a
//! fast drive, so with several drives the hottest reads can go to whichever
//! copy finishes first (`crate::drive_load`).
//!
//! `mirrors.json` beside the manifest lists them: the store id and the
//! manifest digest they were copied under, the drive (path and GB/s), a
//! generation, and per layer one file (`mirror-g<N>-layer-LLL.experts`
//! under the drive's `larder-<id>/`, a `LayerHeader` block then 4 KiB-aligned
//! records) with each record's expert, offset and length; a digest over its
//! content seals it. A copy is the primary's bytes under the same bound
//! digest, so every read of it is checked exactly as the primary's would be.
//!
//! Opening a store attaches the copies to its index ([`Manifest::index`] is
//! defined here, over the manifest's primary records); a mirrors.json that is
//! damaged, edited, from another store or an earlier pack, or whose drive
//! or files are missing is refused with the file named and the fix
//! (`larder mirror STORE --size 0` removes them). Writing is atomic: new
//! files under a new generation, then mirrors.json, then the old files go.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::fsutil::{commit, lock_exclusive, temp_path, write_atomic};
use crate::heat::{hottest, Heat};
use crate::layer_file::record_offset;
use crate::location::{ExpertIndex, Extent};
use crate::manifest::{check_sizes, DriveEntry, Manifest};
use crate::pack_plan::{drive_path_string, resolve, store_folder, LOCK};
use crate::StoreError;

/// The file name beside a store's manifest.
pub(crate) const MIRRORS: &str = "mirrors.json";
const FORMAT: &str = "larder-mirrors";
const VERSION: u32 = 1;
const PREFIX: &str = "mirror-g";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Mirrors {
    format: String,
    version: u32,
    store_id: String,
    /// The manifest digest of the store the copies were made from.
    manifest: String,
    drive: DriveEntry,
    generation: u64,
    layers: Vec<MirrorLayer>,
    digest: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct MirrorLayer {
    layer: usize,
    /// Relative to the drive's `larder-<id>/` folder.
    file: String,
    experts: Vec<MirrorRecord>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct MirrorRecord {
    expert: usize,
    offset: u64,
    len: u64,
}

impl Mirrors {
    fn sealed_digest(&self) -> String {
        let mut bare = self.clone();
        bare.digest.clear();
        Digest::of(&serde_json::to_vec(&bare).unwrap_or_default()).to_string()
    }

    /// Reads and checks `root/mirrors.json` against `m` (None: there is none).
    fn read(root: &Path, m: &Manifest) -> Result<Option<Mirrors>, StoreError> {
        let path = root.join(MIRRORS);
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::io(&path, e)),
        };
        let bad = |what: String| {
            StoreError::manifest(
                &path,
                format!("{what}; `larder mirror STORE --size 0` removes the mirrors, `--size SIZE` makes them again"),
            )
        };
        let x: Mirrors = serde_json::from_slice(&text).map_err(|e| bad(format!("malformed ({e})")))?;
        if x.format != FORMAT || x.version != VERSION {
            return Err(bad(format!(
                "format {:?} version {}, this larder reads {FORMAT:?} version {VERSION}",
                x.format, x.version
            )));
        }
        if x.digest != x.sealed_digest() {
            return Err(bad("changed after it was written (its digest does not match its content)".into()));
        }
        if x.store_id != m.store_id || x.manifest != m.digest {
            return Err(bad("made for another store, or before this store was packed again".into()));
        }
        Ok(Some(x))
    }

    fn write(mut self, root: &Path) -> Result<(), StoreError> {
        self.digest = self.sealed_digest();
        let text = serde_json::to_vec_pretty(&self).map_err(|e| StoreError::Invalid(format!("{MIRRORS}: {e}")))?;
        write_atomic(&root.join(MIRRORS), &text)
    }
}

/// The drive id of `dir` in `m`: a store drive, or the next id.
fn drive_id(m: &Manifest, root: &Path, dir: &Path) -> usize {
    m.drive_of(root, dir).unwrap_or(m.drives.len())
}

impl Manifest {
    /// The location index of every expert, mirrored copies included,
    /// checking drives and files exist and are long enough
    /// (`index_without_mirrors` leaves the copies out).
    pub fn index(&self, root: &Path) -> Result<ExpertIndex, StoreError> {
        let mut index = self.primary_index(root)?;
        attach(self, root, &mut index)?;
        check_sizes(&index)?;
        Ok(index)
    }
}

/// Adds the copies `root/mirrors.json` lists to `index` (files, drive and copies).
fn attach(m: &Manifest, root: &Path, index: &mut ExpertIndex) -> Result<(), StoreError> {
    let Some(x) = Mirrors::read(root, m)? else { return Ok(()) };
    let path = root.join(MIRRORS);
    let dir = resolve(root, &x.drive.path).join(store_folder(&m.store_id));
    if !dir.is_dir() {
        return Err(StoreError::manifest(
            &path,
            format!(
                "the mirror folder {} is missing (is the drive mounted?); `larder mirror STORE --size 0` removes the mirrors",
                dir.display()
            ),
        ));
    }
    let drive = drive_id(m, root, &resolve(root, &x.drive.path));
    if index.drive_gbps.len() <= drive {
        index.drive_gbps.resize(drive + 1, 0.0);
        index.drive_gbps[drive] = x.drive.gbps;
    }
    for ml in &x.layers {
        if ml.file.contains('/') || ml.file.contains("..") || !ml.file.starts_with(PREFIX) {
            return Err(StoreError::manifest(
                &path,
                format!("layer {}: bad file name {:?}", ml.layer, ml.file),
            ));
        }
        let file_path = dir.join(&ml.file);
        m.layer_header(ml.layer, drive).check(&file_path)?;
        let file = index.files.len();
        index.files.push(file_path);
        index.file_drive.push(drive);
        for r in &ml.experts {
            let loc = index
                .layers
                .get_mut(ml.layer)
                .and_then(|l| l.get_mut(r.expert))
                .ok_or_else(|| StoreError::manifest(&path, format!("layer {} expert {}: not in the store", ml.layer, r.expert)))?;
            if loc.extents.len() != 1 || loc.read_len() != r.len {
                return Err(StoreError::manifest(
                    &path,
                    format!(
                        "layer {} expert {}: the copy is {} bytes, the record {}",
                        ml.layer,
                        r.expert,
                        r.len,
                        loc.read_len()
                    ),
                ));
            }
            loc.copies.push(vec![Extent {
                file,
                offset: r.offset,
                len: r.len,
            }]);
        }
    }
    Ok(())
}

/// What to mirror: onto `drive` (read at `gbps`), the hottest records up to `bytes`.
#[derive(Debug, Clone)]
pub struct MirrorPlan {
    pub drive: PathBuf,
    pub gbps: f64,
    /// Bytes of records to copy at most (0: remove the mirrors).
    pub bytes: u64,
}

/// What [`mirror`] did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MirrorReport {
    pub experts: usize,
    /// Record bytes copied (4 KiB-padded, as read).
    pub bytes: u64,
    pub layers: usize,
    /// Hot records left out because their primary is already on the drive.
    pub already_on_drive: usize,
    /// Files of earlier mirrors removed.
    pub removed_files: usize,
}

/// Copies the hottest records of `heat` (hottest first, while they fit
/// `plan.bytes`) from the store at `root` onto `plan.drive`, each checked
/// against its digest as it is read, and replaces any earlier mirrors.
/// `progress(bytes)` as records are copied.
pub fn mirror(root: &Path, heat: &Heat, plan: &MirrorPlan, progress: &mut dyn FnMut(u64)) -> Result<MirrorReport, StoreError> {
    let _lock = lock_exclusive(&root.join(LOCK), "a `larder pack` or `larder mirror` of this store")?;
    let m = Manifest::read(root)?;
    let index = m.index_without_mirrors(root)?;
    let old = Mirrors::read(root, &m).ok().flatten();
    let drive = drive_id(&m, root, &plan.drive);
    let mut report = MirrorReport::default();
    let mut chosen: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    if plan.bytes > 0 {
        for (l, e) in hottest(heat) {
            let Some(loc) = index.get(l, e) else { continue };
            if index.file_drive.get(loc.extents[0].file) == Some(&drive) {
                report.already_on_drive += 1;
                continue;
            }
            if report.bytes + loc.read_len() > plan.bytes {
                break;
            }
            report.bytes += loc.read_len();
            report.experts += 1;
            chosen.entry(l).or_default().push(e);
        }
    }
    let dir = plan.drive.join(store_folder(&m.store_id));
    let generation = old.as_ref().map_or(1, |o| o.generation + 1);
    let mut layers = Vec::new();
    if !chosen.is_empty() {
        std::fs::create_dir_all(&dir).map_err(|e| StoreError::io(&dir, e))?;
        for (layer, mut experts) in chosen {
            experts.sort_unstable();
            let file = format!("{PREFIX}{generation}-layer-{layer:03}.experts");
            let records = write_layer(&index, &m, layer, drive, &experts, &dir.join(&file), progress)?;
            layers.push(MirrorLayer {
                layer,
                file,
                experts: records,
            });
        }
    }
    report.layers = layers.len();
    if layers.is_empty() {
        let path = root.join(MIRRORS);
        if path.exists() {
            std::fs::remove_file(&path).map_err(|e| StoreError::io(&path, e))?;
        }
    } else {
        let drive_path = drive_path_string(root, &plan.drive)?;
        Mirrors {
            format: FORMAT.into(),
            version: VERSION,
            store_id: m.store_id.clone(),
            manifest: m.digest.clone(),
            drive: DriveEntry {
                path: drive_path,
                gbps: plan.gbps,
            },
            generation,
            layers: layers.clone(),
            digest: String::new(),
        }
        .write(root)?;
    }
    // Files of earlier generations (and of interrupted runs) on this drive and the old one.
    let keep: Vec<&str> = layers.iter().map(|l| l.file.as_str()).collect();
    let mut dirs = vec![dir];
    if let Some(o) = &old {
        dirs.push(resolve(root, &o.drive.path).join(store_folder(&m.store_id)));
    }
    for d in dirs {
        report.removed_files += sweep(&d, &keep);
    }
    Ok(report)
}

/// Writes one layer's copies to `path` (temp name, fsync, rename); returns where each lies.
fn write_layer(
    index: &ExpertIndex,
    m: &Manifest,
    layer: usize,
    drive: usize,
    experts: &[usize],
    path: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<Vec<MirrorRecord>, StoreError> {
    let tmp = temp_path(path);
    let out = std::fs::File::create(&tmp).map_err(|e| StoreError::io(&tmp, e))?;
    out.write_all_at(&m.layer_header(layer, drive).to_block(), 0)
        .map_err(|e| StoreError::io(&tmp, e))?;
    let mut records = Vec::with_capacity(experts.len());
    let mut buf = Vec::new();
    let mut sources: std::collections::HashMap<usize, std::fs::File> = Default::default();
    for (i, &e) in experts.iter().enumerate() {
        let loc = index.get(layer, e).ok_or(StoreError::MissingExpert { layer, expert: e })?;
        let x = loc.extents[0];
        let src = &index.files[x.file];
        buf.resize(x.len as usize, 0);
        let f = match sources.entry(x.file) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(std::fs::File::open(src).map_err(|err| StoreError::io(src, err))?),
        };
        f.read_exact_at(&mut buf, x.offset).map_err(|err| StoreError::io(src, err))?;
        let got = Digest::of_parts_seeded(
            loc.digest_seed,
            loc.parts.iter().map(|p| &buf[p.offset as usize..(p.offset + p.len) as usize]),
        );
        if Some(got) != loc.digest {
            return Err(StoreError::Digest {
                layer,
                expert: e,
                path: src.clone(),
                offset: x.offset,
                expected: loc.digest.map(|d| d.to_string()).unwrap_or_default(),
                got: got.to_string(),
            });
        }
        let offset = record_offset(i, x.len);
        out.write_all_at(&buf, offset).map_err(|err| StoreError::io(&tmp, err))?;
        records.push(MirrorRecord {
            expert: e,
            offset,
            len: x.len,
        });
        progress(x.len);
    }
    out.sync_all().map_err(|e| StoreError::io(&tmp, e))?;
    drop(out);
    commit(&tmp, path)?;
    Ok(records)
}

/// Removes mirror files in `dir` not named in `keep`; returns how many.
fn sweep(dir: &Path, keep: &[&str]) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(PREFIX) && !keep.contains(&name.as_str())
        })
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

/// The (layer, expert) of every copy `root/mirrors.json` lists, unchecked
/// (for progress totals; opening the store checks it): empty without one.
pub fn listed(root: &Path) -> Vec<(usize, usize)> {
    let Ok(text) = std::fs::read(root.join(MIRRORS)) else {
        return Vec::new();
    };
    let Ok(x) = serde_json::from_slice::<Mirrors>(&text) else {
        return Vec::new();
    };
    x.layers
        .iter()
        .flat_map(|l| l.experts.iter().map(|r| (l.layer, r.expert)))
        .collect()
}
