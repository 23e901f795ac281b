//! `pack`: turns a checkpoint's routed experts into a packed store.
//!
//! Each expert becomes **one contiguous record** (its components, bytes as
//! shipped, back to back) starting on a 4 KiB boundary, so one O_DIRECT read
//! fetches it whole. Records are grouped per layer per drive
//! (`<drive>/drive-K/layer-LLL.experts`) and each layer's experts are spread
//! over drives in proportion to their read bandwidth.
//!
//! Atomic and resumable: the plan (drives, bandwidths, placement) is saved
//! first; each layer file is written under a `.partial` name, read back and
//! digest-checked, then renamed, and a sidecar listing its records is saved
//! next to it; the spine, the copied config files and finally
//! `manifest.json` come last. An interrupted pack leaves no manifest (so
//! nothing mistakes it for a store) and a re-run skips finished layer files.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::buf::{align_up, AlignedBuf};
use crate::digest::Digest;
use crate::drive::{measure_read_gbps, place};
use crate::fsutil::{commit, temp_path, write_atomic};
use crate::io::FileTable;
use crate::location::{Extent, PartDesc};
use crate::manifest::{DriveEntry, ExpertEntry, LayerEntry, Manifest, PartEntry, SourceIdentity, FORMAT, MANIFEST, VERSION};
use crate::StoreError;

/// The saved plan of a pack in progress.
pub const PLAN: &str = "pack-plan.json";
/// The spine's file in the store root.
pub const SPINE: &str = "spine.safetensors";

/// A non-expert tensor copied into the spine file.
#[derive(Debug, Clone)]
pub struct SpineTensor {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub extent: Extent,
}

/// One layer's routed experts in the source.
#[derive(Debug, Clone)]
pub struct PackLayer {
    pub layer: usize,
    pub parts: Vec<PartDesc>,
    /// Per expert, one extent per part (in part order).
    pub experts: Vec<Vec<Extent>>,
}

/// Everything pack needs to know about the source checkpoint.
#[derive(Debug, Clone)]
pub struct PackSource {
    pub model_type: String,
    pub identity: SourceIdentity,
    /// Source files the extents index.
    pub files: Vec<PathBuf>,
    pub spine: Vec<SpineTensor>,
    pub layers: Vec<PackLayer>,
    /// Small files copied into the store root (config.json, tokenizer, ...).
    pub copy: Vec<PathBuf>,
}

/// A drive directory, with its bandwidth if the user gave it.
#[derive(Debug, Clone)]
pub struct DriveSpec {
    pub dir: PathBuf,
    pub gbps: Option<f64>,
}

impl DriveSpec {
    /// Parses `DIR` or `DIR:GBps`.
    pub fn parse(s: &str) -> Result<DriveSpec, String> {
        if let Some((dir, bw)) = s.rsplit_once(':') {
            if let Ok(g) = bw.parse::<f64>() {
                if !(g.is_finite() && g > 0.0) {
                    return Err(format!("drive {s:?}: bandwidth must be a positive number of GB/s"));
                }
                return Ok(DriveSpec {
                    dir: PathBuf::from(dir),
                    gbps: Some(g),
                });
            }
        }
        Ok(DriveSpec {
            dir: PathBuf::from(s),
            gbps: None,
        })
    }
}

/// What pack reports as it goes.
#[derive(Debug, Clone)]
pub enum PackEvent {
    MeasuringDrive {
        dir: PathBuf,
    },
    DriveMeasured {
        dir: PathBuf,
        gbps: f64,
    },
    /// Expert bytes to write in total (resumed layers included).
    Started {
        total_bytes: u64,
    },
    /// More expert bytes are done (written and verified, or found done).
    Advanced {
        bytes: u64,
    },
    LayerDone {
        layer: usize,
        resumed: bool,
    },
}

/// The outcome of a pack.
#[derive(Debug, Clone, Serialize)]
pub struct PackReport {
    pub out: PathBuf,
    pub layers: usize,
    pub experts: usize,
    pub expert_bytes: u64,
    pub resumed_layers: usize,
    pub drives: Vec<DriveEntry>,
    pub seconds: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Plan {
    identity: SourceIdentity,
    drives: Vec<DriveEntry>,
    /// Per packed layer: drive of each expert.
    placement: Vec<(usize, Vec<usize>)>,
}

/// Packs `src` into `out`, layer files on `drives` (the store root when empty).
pub fn pack(src: &PackSource, out: &Path, drives: &[DriveSpec], progress: &mut dyn FnMut(PackEvent)) -> Result<PackReport, StoreError> {
    let started = Instant::now();
    std::fs::create_dir_all(out).map_err(|e| StoreError::io(out, e))?;
    if Manifest::is_store(out) {
        let m = Manifest::read(out)?;
        if m.source == src.identity {
            return Err(StoreError::Invalid(format!(
                "{} already holds a complete store of this model (`larder verify` checks it)",
                out.display()
            )));
        }
        return Err(StoreError::Invalid(format!(
            "{} already holds a store of another model; choose another --out",
            out.display()
        )));
    }
    let plan = load_or_make_plan(src, out, drives, progress)?;
    let drive_dirs: Vec<PathBuf> = plan.drives.iter().map(|d| resolve(out, &d.path)).collect();
    for (k, dir) in drive_dirs.iter().enumerate() {
        let sub = dir.join(format!("drive-{k}"));
        std::fs::create_dir_all(&sub).map_err(|e| StoreError::io(&sub, e))?;
    }
    let sources = FileTable::open(&src.files, false)?;
    let total: u64 = src
        .layers
        .iter()
        .map(|l| l.experts.iter().flatten().map(|x| x.len).sum::<u64>())
        .sum();
    progress(PackEvent::Started { total_bytes: total });

    let mut layers = Vec::with_capacity(src.layers.len());
    let mut resumed = 0;
    for (layer, (_, placement)) in src.layers.iter().zip(&plan.placement) {
        let (parts, record_len) = record_layout(&layer.parts, &layer.experts);
        let mut entries: Vec<Option<ExpertEntry>> = vec![None; layer.experts.len()];
        let mut layer_resumed = true;
        for (k, drive_dir) in drive_dirs.iter().enumerate() {
            let mine: Vec<usize> = (0..layer.experts.len()).filter(|&e| placement[e] == k).collect();
            if mine.is_empty() {
                continue;
            }
            let name = format!("drive-{k}/layer-{:03}.experts", layer.layer);
            let path = drive_dir.join(&name);
            let done = match read_sidecar(&path, &mine, record_len) {
                Some(list) => {
                    progress(PackEvent::Advanced {
                        bytes: mine.iter().map(|&e| layer.experts[e].iter().map(|x| x.len).sum::<u64>()).sum(),
                    });
                    list
                }
                None => {
                    layer_resumed = false;
                    write_layer_file(&sources, layer, &mine, &parts, record_len, k, &name, &path, progress)?
                }
            };
            for entry in done {
                let slot = entry.expert;
                entries[slot] = Some(entry);
            }
        }
        resumed += layer_resumed as usize;
        progress(PackEvent::LayerDone {
            layer: layer.layer,
            resumed: layer_resumed,
        });
        layers.push(LayerEntry {
            layer: layer.layer,
            parts,
            experts: entries
                .into_iter()
                .map(|e| e.ok_or_else(|| StoreError::Invalid(format!("layer {}: an expert was not placed", layer.layer))))
                .collect::<Result<_, _>>()?,
        });
    }

    write_spine(&sources, &src.spine, &out.join(SPINE))?;
    for f in &src.copy {
        let name = f
            .file_name()
            .ok_or_else(|| StoreError::Invalid(format!("{}: not a file", f.display())))?;
        let bytes = std::fs::read(f).map_err(|e| StoreError::io(f, e))?;
        write_atomic(&out.join(name), &bytes)?;
    }
    let manifest = Manifest {
        format: FORMAT.into(),
        version: VERSION,
        model_type: src.model_type.clone(),
        source: src.identity.clone(),
        spine: vec![SPINE.into()],
        drives: plan.drives.clone(),
        layers,
    };
    manifest.write(out)?;
    let _ = std::fs::remove_file(out.join(PLAN));
    Ok(PackReport {
        out: out.to_path_buf(),
        layers: manifest.layers.len(),
        experts: manifest.layers.iter().map(|l| l.experts.len()).sum(),
        expert_bytes: total,
        resumed_layers: resumed,
        drives: plan.drives,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn resolve(root: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        root.join(p)
    }
}

fn load_or_make_plan(src: &PackSource, out: &Path, drives: &[DriveSpec], progress: &mut dyn FnMut(PackEvent)) -> Result<Plan, StoreError> {
    let path = out.join(PLAN);
    let wanted: Vec<String> = if drives.is_empty() {
        vec![".".into()]
    } else {
        drives.iter().map(|d| drive_path_string(out, &d.dir)).collect::<Result<_, _>>()?
    };
    if path.exists() {
        let text = std::fs::read_to_string(&path).map_err(|e| StoreError::io(&path, e))?;
        let plan: Plan = serde_json::from_str(&text).map_err(|e| StoreError::manifest(&path, format!("unreadable pack plan: {e}")))?;
        if plan.identity != src.identity {
            return Err(StoreError::manifest(
                &path,
                "an unfinished pack of another model is in this folder; choose another --out or remove it",
            ));
        }
        let have: Vec<&str> = plan.drives.iter().map(|d| d.path.as_str()).collect();
        if have != wanted.iter().map(|s| s.as_str()).collect::<Vec<_>>() {
            return Err(StoreError::manifest(
                &path,
                format!("an unfinished pack with drives {have:?} is in this folder; resume it with the same --drive list"),
            ));
        }
        return Ok(plan);
    }
    let specs: Vec<DriveSpec> = if drives.is_empty() {
        vec![DriveSpec {
            dir: out.to_path_buf(),
            gbps: None,
        }]
    } else {
        drives.to_vec()
    };
    let mut entries = Vec::new();
    for (spec, p) in specs.iter().zip(&wanted) {
        if !spec.dir.is_dir() {
            return Err(StoreError::io(
                &spec.dir,
                std::io::Error::new(std::io::ErrorKind::NotFound, "drive directory does not exist"),
            ));
        }
        let gbps = match spec.gbps {
            Some(g) => g,
            // One drive: placement does not depend on its speed.
            None if specs.len() == 1 => 1.0,
            None => {
                progress(PackEvent::MeasuringDrive { dir: spec.dir.clone() });
                let g = measure_read_gbps(&spec.dir)?;
                progress(PackEvent::DriveMeasured {
                    dir: spec.dir.clone(),
                    gbps: g,
                });
                g
            }
        };
        entries.push(DriveEntry { path: p.clone(), gbps });
    }
    let weights: Vec<f64> = entries.iter().map(|d| d.gbps).collect();
    let plan = Plan {
        identity: src.identity.clone(),
        drives: entries,
        placement: src.layers.iter().map(|l| (l.layer, place(l.experts.len(), &weights))).collect(),
    };
    let text = serde_json::to_vec_pretty(&plan).map_err(|e| StoreError::Invalid(e.to_string()))?;
    write_atomic(&path, &text)?;
    Ok(plan)
}

/// Drives inside the store root are recorded relative to it (the store can move).
fn drive_path_string(out: &Path, dir: &Path) -> Result<String, StoreError> {
    let abs_out = std::fs::canonicalize(out).map_err(|e| StoreError::io(out, e))?;
    let abs = std::fs::canonicalize(dir).map_err(|e| StoreError::io(dir, e))?;
    Ok(match abs.strip_prefix(&abs_out) {
        Ok(rel) if rel.as_os_str().is_empty() => ".".into(),
        Ok(rel) => rel.to_string_lossy().into_owned(),
        Err(_) => abs.to_string_lossy().into_owned(),
    })
}

/// Components back to back (as shipped); the record padded to 4 KiB.
fn record_layout(parts: &[PartDesc], experts: &[Vec<Extent>]) -> (Vec<PartEntry>, u64) {
    let lens: Vec<u64> = experts.first().map(|x| x.iter().map(|e| e.len).collect()).unwrap_or_default();
    let mut at = 0;
    let entries = parts
        .iter()
        .zip(&lens)
        .map(|(d, &len)| {
            let p = PartEntry {
                desc: d.clone(),
                offset: at,
                len,
            };
            at += len;
            p
        })
        .collect();
    (entries, align_up(at))
}

/// The sidecar of a finished layer file, if it matches what we would write.
fn read_sidecar(path: &Path, mine: &[usize], record_len: u64) -> Option<Vec<ExpertEntry>> {
    let side = sidecar(path);
    let list: Vec<ExpertEntry> = serde_json::from_slice(&std::fs::read(side).ok()?).ok()?;
    let size = std::fs::metadata(path).ok()?.len();
    let ok = list.len() == mine.len()
        && list.iter().zip(mine).all(|(e, &m)| e.expert == m && e.len == record_len)
        && size == record_len * mine.len() as u64;
    ok.then_some(list)
}

fn sidecar(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".json");
    path.with_file_name(name)
}

/// Writes one layer file (temp name), reads it back to verify, commits it.
#[allow(clippy::too_many_arguments)]
fn write_layer_file(
    sources: &FileTable,
    layer: &PackLayer,
    mine: &[usize],
    parts: &[PartEntry],
    record_len: u64,
    drive: usize,
    name: &str,
    path: &Path,
    progress: &mut dyn FnMut(PackEvent),
) -> Result<Vec<ExpertEntry>, StoreError> {
    let tmp = temp_path(path);
    let result = (|| {
        let mut f = File::create(&tmp).map_err(|e| StoreError::io(&tmp, e))?;
        let mut buf = AlignedBuf::new(record_len as usize);
        let mut entries = Vec::with_capacity(mine.len());
        for (i, &e) in mine.iter().enumerate() {
            let extents = &layer.experts[e];
            if extents.len() != parts.len() || extents.iter().zip(parts).any(|(x, p)| x.len != p.len) {
                return Err(StoreError::Invalid(format!(
                    "layer {} expert {e}: components differ in size from expert 0's",
                    layer.layer
                )));
            }
            let b = buf.as_mut_slice();
            b.fill(0);
            for (x, p) in extents.iter().zip(parts) {
                let dst = &mut b[p.offset as usize..(p.offset + p.len) as usize];
                sources.files[x.file]
                    .read_exact_at(dst, x.offset)
                    .map_err(|err| sources.read_error(x.file, x.offset, x.len, err))?;
            }
            let payload: u64 = parts.iter().map(|p| p.len).sum();
            let digest = Digest::of(&buf.as_ref()[..payload as usize]);
            f.write_all(&buf.as_ref()[..record_len as usize])
                .map_err(|err| StoreError::io(&tmp, err))?;
            entries.push(ExpertEntry {
                expert: e,
                drive,
                file: name.to_string(),
                offset: i as u64 * record_len,
                len: record_len,
                digest: digest.to_string(),
            });
            progress(PackEvent::Advanced { bytes: payload });
        }
        f.sync_all().map_err(|e| StoreError::io(&tmp, e))?;
        drop(f);
        verify_file(&tmp, &entries, parts, layer.layer)?;
        Ok(entries)
    })();
    match result {
        Ok(entries) => {
            commit(&tmp, path)?;
            let text = serde_json::to_vec(&entries).map_err(|e| StoreError::Invalid(e.to_string()))?;
            write_atomic(&sidecar(path), &text)?;
            Ok(entries)
        }
        Err(e) => {
            // Do not leave a half-written file (it also frees the space of a full disk).
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Reads a layer file back (O_DIRECT where the file system allows) and
/// checks every record's digest.
fn verify_file(path: &Path, entries: &[ExpertEntry], parts: &[PartEntry], layer: usize) -> Result<(), StoreError> {
    let files = FileTable::open(&[path.to_path_buf()], true).or_else(|_| FileTable::open(&[path.to_path_buf()], false))?;
    let payload: u64 = parts.iter().map(|p| p.len).sum();
    let mut buf = AlignedBuf::new(entries.first().map_or(0, |e| e.len) as usize);
    for e in entries {
        let dst = &mut buf.as_mut_slice()[..e.len as usize];
        files.files[0]
            .read_exact_at(dst, e.offset)
            .map_err(|err| files.read_error(0, e.offset, e.len, err))?;
        let got = Digest::of(&buf.as_ref()[..payload as usize]);
        if got.to_string() != e.digest {
            return Err(StoreError::Digest {
                layer,
                expert: e.expert,
                path: path.to_path_buf(),
                offset: e.offset,
                expected: e.digest.clone(),
                got: got.to_string(),
            });
        }
    }
    Ok(())
}

/// Writes the spine tensors as one safetensors file (atomically).
fn write_spine(sources: &FileTable, tensors: &[SpineTensor], path: &Path) -> Result<(), StoreError> {
    let mut header = serde_json::Map::new();
    let mut at = 0u64;
    for t in tensors {
        header.insert(
            t.name.clone(),
            serde_json::json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [at, at + t.extent.len]}),
        );
        at += t.extent.len;
    }
    header.insert(
        "__metadata__".into(),
        serde_json::json!({"format": "pt", "written_by": "larder pack"}),
    );
    let mut text = serde_json::to_vec(&serde_json::Value::Object(header)).map_err(|e| StoreError::Invalid(e.to_string()))?;
    while text.len() % 8 != 0 {
        text.push(b' ');
    }
    let tmp = temp_path(path);
    let result = (|| {
        let mut f = std::io::BufWriter::with_capacity(8 << 20, File::create(&tmp).map_err(|e| StoreError::io(&tmp, e))?);
        f.write_all(&(text.len() as u64).to_le_bytes())
            .map_err(|e| StoreError::io(&tmp, e))?;
        f.write_all(&text).map_err(|e| StoreError::io(&tmp, e))?;
        let mut buf = vec![0u8; 8 << 20];
        for t in tensors {
            let mut off = 0;
            while off < t.extent.len {
                let n = (t.extent.len - off).min(buf.len() as u64) as usize;
                sources.files[t.extent.file]
                    .read_exact_at(&mut buf[..n], t.extent.offset + off)
                    .map_err(|e| sources.read_error(t.extent.file, t.extent.offset + off, n as u64, e))?;
                f.write_all(&buf[..n]).map_err(|e| StoreError::io(&tmp, e))?;
                off += n as u64;
            }
        }
        let f = f.into_inner().map_err(|e| StoreError::io(&tmp, e.into_error()))?;
        f.sync_all().map_err(|e| StoreError::io(&tmp, e))?;
        Ok(())
    })();
    match result {
        Ok(()) => commit(&tmp, path),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Whether `dir` holds an unfinished pack (a plan but no manifest).
pub fn is_unfinished(dir: &Path) -> bool {
    dir.join(PLAN).exists() && !dir.join(MANIFEST).exists()
}
