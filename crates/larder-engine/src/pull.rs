//! What `larder pull` pulls: a remote checkpoint (hub repo, base URL or
//! folder, any [`FileSource`]) described for [`larder_store::pull`] from
//! its small files and its shards' safetensors headers, read by range, and
//! checked as `larder run` would load it before a byte of weights moves.
//! Shards holding only a wrapper's vision tower (Kimi K3's `vision_tower.*`,
//! `mm_projector.*`) are never fetched; they and the vision tensors inside
//! text shards are reported as skipped ([`RemoteCheckpoint::skipped`]).

use std::path::Path;

use larder_model::arch::read_spec;
use larder_model::checkpoint::{header_len, index_shards, Checkpoint, ShardHeader, INDEX, SKIPPED_PREFIXES};
use larder_model::DecoderModel;
use larder_store::fsutil::write_atomic;
use larder_store::pack::PackSource;
use larder_store::pull::PullFile;
use larder_store::remote::{FileSource, Listing, StreamState};

use crate::error::store_err;
use crate::error::EngineError;
use crate::pack::{describe, CARRIED_FILES};

/// Folder in a pull's --out holding the fetched config, tokenizer and
/// index files until the store is complete.
pub const STAGING: &str = crate::store_folder::PULL_STAGING;

/// Small files larger than this are refused (a listing that calls a
/// weight file `tokenizer.json` must not be read into memory).
const SMALL_FILE_LIMIT: u64 = 256 << 20;

/// A remote checkpoint ready to pull: its pack description and its shards.
pub struct RemoteCheckpoint {
    pub source: PackSource,
    /// The shards to fetch (those holding text-model tensors).
    pub files: Vec<PullFile>,
    /// What is never read: shards holding only vision tensors (never
    /// fetched; their tensor bytes), then vision tensors inside fetched
    /// shards, as (name, bytes).
    pub skipped: Vec<(String, u64)>,
    /// The text model's tensors, known from the shard headers alone.
    pub checkpoint: Checkpoint,
}

impl RemoteCheckpoint {
    /// Bytes never read (see [`skipped`](Self::skipped)).
    pub fn skipped_bytes(&self) -> u64 {
        self.skipped.iter().map(|(_, b)| b).sum()
    }
}

/// The tensor bytes of a shard whose JSON header names only tensors of a
/// wrapper's other towers (at least one): such a shard is never fetched.
/// `None` for any other shard.
fn only_skipped_tensors(header: &[u8]) -> Option<u64> {
    let Ok(serde_json::Value::Object(m)) = serde_json::from_slice::<serde_json::Value>(header) else {
        return None;
    };
    let tensors: Vec<(&String, &serde_json::Value)> = m.iter().filter(|(k, _)| *k != "__metadata__").collect();
    if tensors.is_empty() || !tensors.iter().all(|(n, _)| SKIPPED_PREFIXES.iter().any(|p| n.starts_with(p))) {
        return None;
    }
    let bytes = |t: &serde_json::Value| -> u64 {
        let offsets = t["data_offsets"].as_array();
        let at = |i: usize| offsets.and_then(|o| o.get(i)).and_then(serde_json::Value::as_u64).unwrap_or(0);
        at(1).saturating_sub(at(0))
    };
    Some(tensors.iter().map(|(_, t)| bytes(t)).sum())
}

/// Fetches `remote`'s config, tokenizer, template and index files into
/// `staging` (their sha256 checked where the source publishes one), reads
/// every shard's header by range, and checks the whole model loads from
/// them (names, shapes, dtypes, every tensor the architecture needs).
pub fn describe_remote(remote: &dyn FileSource, staging: &Path) -> Result<RemoteCheckpoint, EngineError> {
    let listing = remote.list_files()?;
    std::fs::create_dir_all(staging).map_err(|source| EngineError::Io {
        path: staging.to_path_buf(),
        source,
    })?;
    if listing.get("config.json").is_none() {
        return Err(EngineError::Invalid {
            field: "SOURCE",
            message: "the source has no config.json at its root; is it a Hugging Face checkpoint?".into(),
        });
    }
    for name in CARRIED_FILES.iter().chain([&INDEX]) {
        if listing.get(name).is_some() {
            fetch_small(remote, &listing, name, staging)?;
        }
    }
    let spec = read_spec(staging)?;
    let mut files = Vec::new();
    let mut headers = Vec::new();
    let mut skipped = Vec::new();
    for name in shard_names(&listing, staging)? {
        let (file, header) = read_head(remote, &name, staging)?;
        if let Some(bytes) = only_skipped_tensors(&header.header) {
            skipped.push((name, bytes));
            continue;
        }
        headers.push(header);
        files.push(file);
    }
    save_heads(staging, &files, &skipped)?;
    describe_headers(staging, spec, headers, files, skipped)
}

/// The description [`describe_remote`] left in `staging` (its small files
/// and shard headers), read again without the network: how a lazy cache
/// reopens offline. `None` when `staging` holds no complete description.
pub(crate) fn describe_staged(staging: &Path) -> Result<Option<RemoteCheckpoint>, EngineError> {
    let Ok(listed) = std::fs::read(staging.join(HEADS)) else {
        return Ok(None);
    };
    let Ok((names, skipped)) = serde_json::from_slice::<(Vec<(String, u64)>, Vec<(String, u64)>)>(&listed) else {
        return Ok(None);
    };
    let spec = read_spec(staging)?;
    let mut files = Vec::new();
    let mut headers = Vec::new();
    for (name, size) in names {
        let path = staging.join(&name);
        let Ok(head) = std::fs::read(head_path(staging, &name)) else {
            return Ok(None);
        };
        if head.len() < 8 {
            return Ok(None);
        }
        headers.push(ShardHeader {
            path,
            size,
            header: head[8..].to_vec(),
        });
        files.push(PullFile { name, size, head });
    }
    describe_headers(staging, spec, headers, files, skipped).map(Some)
}

/// The shards (name, size) whose heads are saved in the staging folder, and
/// the vision-only shards never fetched.
const HEADS: &str = "shard-heads.json";

fn head_path(staging: &Path, name: &str) -> std::path::PathBuf {
    staging.join(format!("{name}.head"))
}

/// Saves each shard's head beside the small files, the list last.
fn save_heads(staging: &Path, files: &[PullFile], skipped: &[(String, u64)]) -> Result<(), EngineError> {
    for f in files {
        let path = head_path(staging, &f.name);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| EngineError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        write_atomic(&path, &f.head).map_err(store_err)?;
    }
    let names: Vec<(&str, u64)> = files.iter().map(|f| (f.name.as_str(), f.size)).collect();
    let text = serde_json::to_vec(&(names, skipped)).map_err(|e| EngineError::Invalid {
        field: "SOURCE",
        message: e.to_string(),
    })?;
    write_atomic(&staging.join(HEADS), &text).map_err(store_err)
}

/// Checks the model loads from the shard headers and describes it for pack.
fn describe_headers(
    staging: &Path,
    spec: larder_model::ModelSpec,
    headers: Vec<ShardHeader>,
    files: Vec<PullFile>,
    mut skipped: Vec<(String, u64)>,
) -> Result<RemoteCheckpoint, EngineError> {
    let ckpt = Checkpoint::from_headers(headers)?;
    DecoderModel::load(spec.clone(), &ckpt, None)?;
    let source = describe(staging, &spec, &ckpt)?;
    skipped.extend(ckpt.skipped().iter().map(|t| (t.name.clone(), t.bytes)));
    Ok(RemoteCheckpoint {
        source,
        files,
        skipped,
        checkpoint: ckpt,
    })
}

/// The checkpoint's shards: those its index names, or `model.safetensors`,
/// or every `*.safetensors` at the root (as a local folder is read).
fn shard_names(listing: &Listing, staging: &Path) -> Result<Vec<String>, EngineError> {
    let names = if listing.get(INDEX).is_some() {
        index_shards(&staging.join(INDEX))?
    } else if listing.get("model.safetensors").is_some() {
        vec!["model.safetensors".to_string()]
    } else {
        let mut n: Vec<String> = listing
            .files
            .iter()
            .filter(|f| !f.name.contains('/') && f.name.ends_with(".safetensors"))
            .map(|f| f.name.clone())
            .collect();
        n.sort();
        n
    };
    if names.is_empty() {
        return Err(EngineError::Invalid {
            field: "SOURCE",
            message: "the source lists no *.safetensors files".into(),
        });
    }
    if let Some(missing) = names.iter().find(|n| listing.get(n).is_none()) {
        return Err(EngineError::File {
            path: staging.join(INDEX),
            message: format!("names shard `{missing}`, which the source does not list: its files disagree with its index"),
        });
    }
    Ok(names)
}

/// Shard `name`'s size and safetensors header, read by range.
fn read_head(remote: &dyn FileSource, name: &str, staging: &Path) -> Result<(PullFile, ShardHeader), EngineError> {
    let path = staging.join(name);
    let size = remote.file_meta(name)?.size;
    let bad = |message: String| {
        EngineError::Model(larder_model::ModelError::Safetensors {
            path: path.clone(),
            message,
        })
    };
    if size < 8 {
        return Err(bad(format!("only {size} bytes, less than the 8-byte header length")));
    }
    let prefix = remote.read_range(name, 0, 8)?;
    let prefix: [u8; 8] = prefix.try_into().map_err(|_| bad("short read of the header length".into()))?;
    let n = header_len(prefix, size).map_err(bad)?;
    let header = remote.read_range(name, 8, n)?;
    let mut head = prefix.to_vec();
    head.extend_from_slice(&header);
    Ok((
        PullFile {
            name: name.to_string(),
            size,
            head,
        },
        ShardHeader {
            path: path.clone(),
            size,
            header,
        },
    ))
}

/// Fetches small file `name` into `staging` (sha256 checked where published).
fn fetch_small(remote: &dyn FileSource, listing: &Listing, name: &str, staging: &Path) -> Result<(), EngineError> {
    let path = staging.join(name);
    if let Some(size) = listing.get(name).and_then(|f| f.size).filter(|s| *s > SMALL_FILE_LIMIT) {
        return Err(EngineError::File {
            path,
            message: format!("the source lists it at {size} bytes; a config or tokenizer file is far smaller"),
        });
    }
    let mut bytes = Vec::new();
    remote.stream_file(name, &mut bytes, &mut StreamState::default())?;
    write_atomic(&path, &bytes).map_err(store_err)
}
