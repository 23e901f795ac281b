//! Opening a checkpoint's safetensors files.
//!
//! A checkpoint folder holds either `model.safetensors`, or shards listed by
//! `model.safetensors.index.json`, or (older exports) any number of
//! `*.safetensors` files. Each file's header is read and validated at open
//! (offsets inside the file, so a truncated download is caught at open time).
//!
//! Weights are never memory-mapped: each tensor the model asks for is read
//! (`pread`, in large chunks) into memory the process owns, so a weight file
//! truncated or overwritten while larder runs cannot kill it with SIGBUS (a
//! read of a changed file is an error naming it; weights already loaded
//! keep working). Only the tensors asked for are read: in streaming mode the
//! same shards hold experts that must stay on disk.
//!
//! A multimodal wrapper's text model (Kimi K3: `language_model.model.*`,
//! `language_model.lm_head.*`) is known by the names the text model uses
//! (`model.*`, `lm_head.*`); the vision tower and projector beside it
//! (`vision_tower.*`, `mm_projector.*`) are recognised and never read
//! ([`Checkpoint::skipped`]).
//!
//! [`Checkpoint::open_unread`] opens a checkpoint without reading weight
//! bytes at all: every accessor checks names, shapes and dtypes as usual but
//! hands out zeros (matrices over an anonymous mapping, which costs no RAM
//! until touched), so loading a model over it validates a whole checkpoint
//! (`pack` does this before writing anything).

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use larder_tensor::{SharedBytes, WeightDType, WeightMatrix};
use safetensors::tensor::Dtype;

use crate::assemble::{self, PartKind, PartMeta};
use crate::error::ModelError;
use crate::quant::{CompressedTensors, ModuleRule};
use crate::spec::ModelSpec;

/// Where one tensor lives.
#[derive(Debug, Clone)]
struct TensorEntry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    start: usize,
    len: usize,
}

struct SourceFile {
    path: PathBuf,
    /// The file's length in bytes.
    size: u64,
    /// `None` for a checkpoint opened with [`Checkpoint::open_unread`].
    file: Option<File>,
    /// The JSON header as read at open.
    header: Vec<u8>,
}

/// The prefix of a multimodal wrapper's text-model tensors (Kimi K3).
const WRAPPED_TEXT: &str = "language_model.";

/// Tensors of a wrapper's other towers, never read (Kimi K3's vision tower
/// and projector).
pub const SKIPPED_PREFIXES: [&str; 2] = ["vision_tower.", "mm_projector."];

/// A tensor a checkpoint holds that the text model does not use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedTensor {
    pub name: String,
    /// The file holding it.
    pub file: PathBuf,
    pub bytes: u64,
}

/// Bytes per `pread` call when reading a tensor.
const READ_CHUNK: usize = 64 << 20;

/// Where a tensor's bytes are (for streaming and packing experts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Index into [`Checkpoint::file_paths`].
    pub file: usize,
    /// As safetensors names it (`BF16`, `F32`, `F8_E4M3`, ...).
    pub dtype: String,
    pub shape: Vec<usize>,
    /// Absolute byte range in the file.
    pub offset: u64,
    pub len: u64,
}

/// One shipped tensor of a weight (see [`Checkpoint::weight_parts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightPart {
    pub kind: PartKind,
    pub name: String,
    pub info: TensorInfo,
}

/// A check run on every tensor's bytes as the model takes them (a packed
/// store's spine digests): `Err(message)` refuses the tensor.
pub type TensorCheck = dyn Fn(&str, &TensorInfo, &[u8]) -> Result<(), String> + Send + Sync;

/// Told the size of every tensor as it is handed out (read, or zeros when
/// unread): a load's progress, or (over an unread checkpoint) its total.
pub(crate) type ReadProgress = dyn Fn(u64) + Send + Sync;

/// A safetensors file known by its header (see [`Checkpoint::from_headers`]).
#[derive(Debug, Clone)]
pub struct ShardHeader {
    /// Where the file is, or would be (errors name it).
    pub path: PathBuf,
    pub size: u64,
    /// The JSON header (without the 8-byte length before it).
    pub header: Vec<u8>,
}

/// All tensors of a checkpoint folder, by name.
pub struct Checkpoint {
    files: Vec<SourceFile>,
    tensors: HashMap<String, TensorEntry>,
    /// Block size of fp8 weights' `*_scale_inv` scales (from the config).
    fp8_block: std::sync::OnceLock<(usize, usize)>,
    /// The compressed-tensors scheme of 4-bit packed weights (from the config).
    compressed: std::sync::OnceLock<CompressedTensors>,
    /// Tensors of a wrapper that are not the text model's (the vision tower):
    /// never read. See [`Checkpoint::skipped`].
    skipped: Vec<SkippedTensor>,
    /// Run on every tensor handed out (see [`Checkpoint::set_tensor_check`]).
    check: Option<Arc<TensorCheck>>,
    /// Told each tensor's bytes (see [`Checkpoint::set_read_progress`]).
    progress: Option<Arc<ReadProgress>>,
}

impl Checkpoint {
    /// Opens every safetensors file of `dir`; weights are read as asked for.
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        Self::open_with(dir, true)
    }

    /// Opens `dir` like [`open`](Self::open) (headers read and validated),
    /// but never reads weight bytes: [`matrix`](Self::matrix) hands out
    /// zero-filled weights over anonymous memory (no RAM until touched),
    /// [`vector`](Self::vector) zeros, after the same name, shape and dtype
    /// checks. Loading a model over it validates the whole checkpoint. The
    /// tensor check (see [`set_tensor_check`](Self::set_tensor_check)) is not
    /// run (there are no bytes to check), and [`tensor_bytes`](Self::tensor_bytes)
    /// is an error.
    pub fn open_unread(dir: &Path) -> Result<Self, ModelError> {
        Self::open_with(dir, false)
    }

    /// No files yet.
    fn empty() -> Checkpoint {
        Checkpoint {
            files: Vec::new(),
            tensors: HashMap::new(),
            fp8_block: std::sync::OnceLock::new(),
            compressed: std::sync::OnceLock::new(),
            skipped: Vec::new(),
            check: None,
            progress: None,
        }
    }

    fn open_with(dir: &Path, read: bool) -> Result<Self, ModelError> {
        let paths = shard_paths(dir)?;
        let mut ckpt = Checkpoint::empty();
        for path in paths {
            ckpt.add_file(path, read)?;
        }
        ckpt.unwrap_text_model()?;
        Ok(ckpt)
    }

    /// Renames a wrapper's text-model tensors to the text model's names and
    /// sets its vision tensors aside (module docs); a wrapped checkpoint
    /// with a tensor that is neither is an error naming it.
    fn unwrap_text_model(&mut self) -> Result<(), ModelError> {
        if !self.tensors.keys().any(|n| n.starts_with(WRAPPED_TEXT)) {
            return Ok(());
        }
        let mut tensors = HashMap::with_capacity(self.tensors.len());
        for (name, entry) in std::mem::take(&mut self.tensors) {
            if let Some(rest) = name.strip_prefix(WRAPPED_TEXT) {
                if rest.starts_with("model.") || rest.starts_with("lm_head.") {
                    tensors.insert(rest.to_string(), entry);
                    continue;
                }
            } else if SKIPPED_PREFIXES.iter().any(|p| name.starts_with(p)) {
                self.skipped.push(SkippedTensor {
                    name,
                    file: self.files[entry.file].path.clone(),
                    bytes: entry.len as u64,
                });
                continue;
            }
            return Err(ModelError::Safetensors {
                path: self.files[entry.file].path.clone(),
                message: format!(
                    "tensor `{name}` is neither the text model's (language_model.model.*, language_model.lm_head.*) nor \
                     the vision tower's ({}) in a checkpoint that wraps its text model",
                    SKIPPED_PREFIXES.join(", ")
                ),
            });
        }
        self.skipped.sort_by(|a, b| a.name.cmp(&b.name));
        // Files holding no text-model tensor (the vision tower's shards) are
        // not part of the text model's checkpoint at all.
        let used: BTreeSet<usize> = tensors.values().map(|e| e.file).collect();
        let mut new_index = vec![usize::MAX; self.files.len()];
        let mut files = Vec::with_capacity(used.len());
        for (i, f) in std::mem::take(&mut self.files).into_iter().enumerate() {
            if used.contains(&i) {
                new_index[i] = files.len();
                files.push(f);
            }
        }
        for e in tensors.values_mut() {
            e.file = new_index[e.file];
        }
        self.files = files;
        self.tensors = tensors;
        Ok(())
    }

    /// The tensors set aside as not the text model's (a wrapper's vision
    /// tower), by name: never read. A file holding only such tensors is
    /// not among [`file_paths`](Self::file_paths).
    pub fn skipped(&self) -> &[SkippedTensor] {
        &self.skipped
    }

    /// The config.json beside the checkpoint's files (where errors about a
    /// tensor that a config field sets point).
    pub(crate) fn config_json_path(&self) -> PathBuf {
        self.file_paths()
            .first()
            .and_then(|p| p.parent().map(|dir| dir.join("config.json")))
            .unwrap_or_default()
    }

    /// Whether weights are read from the files (false: [`open_unread`](Self::open_unread)).
    pub fn reads_weights(&self) -> bool {
        self.files.iter().all(|f| f.file.is_some())
    }

    fn add_file(&mut self, path: PathBuf, read: bool) -> Result<(), ModelError> {
        let io = |source| ModelError::Io {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io)?;
        let size = file.metadata().map_err(io)?.len();
        let (_, header) = read_header(&file, size).map_err(|message| ModelError::Safetensors {
            path: path.clone(),
            message,
        })?;
        self.add_header(path, size, header, read.then_some(file))
    }

    /// A checkpoint known from its files' headers alone (a remote one, read
    /// by range): like [`open_unread`](Self::open_unread), with each file's
    /// `path` (where errors point), size and JSON header given.
    pub fn from_headers(shards: Vec<ShardHeader>) -> Result<Self, ModelError> {
        let mut ckpt = Checkpoint::empty();
        for s in shards {
            ckpt.add_header(s.path, s.size, s.header, None)?;
        }
        ckpt.unwrap_text_model()?;
        Ok(ckpt)
    }

    /// Adds the tensors of the file at `path` (`size` bytes) whose JSON
    /// header is `header`, after checking it against the size.
    fn add_header(&mut self, path: PathBuf, size: u64, header: Vec<u8>, file: Option<File>) -> Result<(), ModelError> {
        let header_len = header.len();
        let bad = |message: String| ModelError::Safetensors {
            path: path.clone(),
            message,
        };
        let meta: safetensors::tensor::Metadata = serde_json::from_slice(&header).map_err(|e| {
            bad(format!(
                "invalid safetensors header ({e}); the file may be truncated or not a safetensors file"
            ))
        })?;
        let data_start = 8 + header_len;
        let data_len = (size as usize).saturating_sub(data_start);
        if meta.data_len() < data_len {
            return Err(bad(format!(
                "the header describes {} data bytes but the file holds {data_len}; not a complete safetensors file",
                meta.data_len()
            )));
        }
        let index = self.files.len();
        for (name, info) in meta.tensors() {
            let (s, e) = info.data_offsets;
            if e > data_len || s > e {
                return Err(bad(format!(
                    "tensor `{name}` claims bytes {s}..{e} but the file holds only {data_len} data bytes (truncated?)"
                )));
            }
            if let Some(prev) = self.tensors.get(&name) {
                return Err(bad(format!(
                    "tensor `{name}` appears twice (also in {})",
                    self.files[prev.file].path.display()
                )));
            }
            self.tensors.insert(
                name,
                TensorEntry {
                    file: index,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start: data_start + s,
                    len: e - s,
                },
            );
        }
        self.files.push(SourceFile { path, size, file, header });
        Ok(())
    }

    /// Runs `check` on the bytes of every tensor [`matrix`](Self::matrix),
    /// [`vector`](Self::vector) or [`tensor_bytes`](Self::tensor_bytes) hands
    /// out from now on (fp8 scales included); a failed check is an error
    /// naming the tensor and its file.
    pub fn set_tensor_check(&mut self, check: Arc<TensorCheck>) {
        self.check = Some(check);
    }

    /// Calls `progress(bytes)` for every tensor handed out from now on, once
    /// its bytes are read (and checked); over an unread checkpoint, with the
    /// bytes it would have read, so a load over one counts a real load's total.
    pub fn set_read_progress(&mut self, progress: Arc<ReadProgress>) {
        self.progress = Some(progress);
    }

    fn report(&self, bytes: usize) {
        if let Some(p) = &self.progress {
            p(bytes as u64);
        }
    }

    /// The bytes of tensor `name` as stored (read now, into memory this call
    /// owns), after the tensor check.
    pub fn tensor_bytes(&self, name: &str) -> Result<Vec<u8>, ModelError> {
        let e = self.entry(name)?;
        if !self.reads_weights() {
            return Err(ModelError::Safetensors {
                path: self.files[e.file].path.clone(),
                message: format!("tensor `{name}`: the checkpoint was opened without reading weights (open_unread)"),
            });
        }
        self.checked_bytes(name, e)
    }

    /// A tensor's stored bytes, read into owned memory, after the tensor
    /// check (if any); zeros (and no check) when the checkpoint is unread.
    fn checked_bytes(&self, name: &str, e: &TensorEntry) -> Result<Vec<u8>, ModelError> {
        let f = &self.files[e.file];
        let Some(file) = &f.file else {
            self.report(e.len);
            return Ok(vec![0; e.len]);
        };
        let mut bytes = vec![0u8; e.len];
        read_range(file, &mut bytes, e.start as u64).map_err(|source| ModelError::Io {
            path: f.path.clone(),
            source: std::io::Error::new(
                source.kind(),
                format!(
                    "reading tensor `{name}` (bytes {}..{}): {source}; was the file changed or truncated after larder opened it?",
                    e.start,
                    e.start + e.len
                ),
            ),
        })?;
        if let Some(check) = &self.check {
            let info = self.tensor_info(name)?;
            check(name, &info, &bytes).map_err(|message| ModelError::Safetensors {
                path: f.path.clone(),
                message: format!("tensor `{name}`: {message}"),
            })?;
        }
        self.report(e.len);
        Ok(bytes)
    }

    /// A weight's bytes as shared memory: read and checked, or (unread) a
    /// zero-filled anonymous mapping that costs no RAM until touched.
    fn weight_bytes(&self, name: &str, e: &TensorEntry) -> Result<SharedBytes, ModelError> {
        if self.files[e.file].file.is_some() || e.len == 0 {
            return Ok(SharedBytes::from_vec(self.checked_bytes(name, e)?));
        }
        let map = memmap2::MmapMut::map_anon(e.len)
            .and_then(|m| m.make_read_only())
            .map_err(|source| ModelError::Io {
                path: self.files[e.file].path.clone(),
                source,
            })?;
        self.report(e.len);
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(map);
        Ok(SharedBytes::new(owner, 0, e.len))
    }

    /// Whether a tensor of this name exists.
    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Names of all tensors (sorted).
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.tensors.keys().map(|s| s.as_str()).collect();
        v.sort_unstable();
        v
    }

    /// The checkpoint's safetensors files, in index order.
    pub fn file_paths(&self) -> Vec<PathBuf> {
        self.files.iter().map(|f| f.path.clone()).collect()
    }

    /// The length in bytes of file `file`.
    pub fn file_size(&self, file: usize) -> u64 {
        self.files[file].size
    }

    /// The JSON header of file `file` (its identity: names, dtypes, shapes, offsets).
    pub fn file_header(&self, file: usize) -> &[u8] {
        &self.files[file].header
    }

    /// Where a tensor's bytes are.
    pub fn tensor_info(&self, name: &str) -> Result<TensorInfo, ModelError> {
        let e = self.entry(name)?;
        Ok(TensorInfo {
            file: e.file,
            dtype: format!("{:?}", e.dtype),
            shape: e.shape.clone(),
            offset: e.start as u64,
            len: e.len as u64,
        })
    }

    /// Where slice `index` along the first axis of tensor `name` is: one
    /// expert of a fused per-layer tensor (gpt-oss
    /// `mlp.experts.gate_up_proj_blocks` `[E, ...]`), shape without that
    /// axis. Direct streaming reads it where it lies; pack copies the range.
    pub fn slice_info(&self, name: &str, index: usize) -> Result<TensorInfo, ModelError> {
        let whole = self.tensor_info(name)?;
        let e = self.entry(name)?;
        let count = whole.shape.first().copied().unwrap_or(0);
        if index >= count || !e.len.is_multiple_of(count) {
            return Err(self.bad(
                e,
                format!("tensor `{name}` {:?}: no slice {index} along its first axis", whole.shape),
            ));
        }
        let len = (e.len / count) as u64;
        Ok(TensorInfo {
            shape: whole.shape[1..].to_vec(),
            offset: whole.offset + index as u64 * len,
            len,
            ..whole
        })
    }

    /// A tensor's stored bytes as shared memory (read and checked once; zeros
    /// over anonymous memory when unread): slice it for every expert of a
    /// fused per-layer tensor without copying.
    pub(crate) fn shared_tensor(&self, name: &str) -> Result<SharedBytes, ModelError> {
        self.weight_bytes(name, self.entry(name)?)
    }

    /// The bytes of slice `index` along the first axis of tensor `name`
    /// (see [`slice_info`](Self::slice_info)). Reads the whole tensor: for
    /// many slices, take `shared_tensor` once.
    pub fn slice_bytes(&self, name: &str, index: usize) -> Result<SharedBytes, ModelError> {
        let slice = self.slice_info(name, index)?;
        let start = self.entry(name)?.start as u64;
        let whole = self.shared_tensor(name)?;
        Ok(whole.slice((slice.offset - start) as usize, slice.len as usize))
    }

    /// Where the shipped parts of linear weight `name` (`[rows, cols]`) are,
    /// after the checks [`matrix`](Self::matrix) makes: codes, then scales
    /// and `weight_shape` where the format ships them, each with its name.
    pub fn weight_parts(&self, name: &str, rows: usize, cols: usize) -> Result<Vec<WeightPart>, ModelError> {
        let shipped = self.shipped(name, rows, cols, true)?;
        shipped
            .parts
            .into_iter()
            .map(|(kind, tensor)| {
                Ok(WeightPart {
                    kind,
                    info: self.tensor_info(&tensor)?,
                    name: tensor,
                })
            })
            .collect()
    }

    /// The fp8 block size set from the config, if any.
    pub fn fp8_block(&self) -> Option<(usize, usize)> {
        self.fp8_block.get().copied()
    }

    /// The stored shape of a tensor.
    pub fn shape(&self, name: &str) -> Result<&[usize], ModelError> {
        Ok(&self.entry(name)?.shape)
    }

    fn entry(&self, name: &str) -> Result<&TensorEntry, ModelError> {
        self.tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor { name: name.to_string() })
    }

    fn check(&self, name: &str, expected: &[usize]) -> Result<(&TensorEntry, WeightDType), ModelError> {
        let e = self.entry(name)?;
        let path = &self.files[e.file].path;
        if e.shape != expected {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                path: path.clone(),
                got: e.shape.clone(),
                expected: expected.to_vec(),
            });
        }
        let dtype = match e.dtype {
            Dtype::F32 => WeightDType::F32,
            Dtype::F16 => WeightDType::F16,
            Dtype::BF16 => WeightDType::BF16,
            other => {
                return Err(ModelError::TensorDType {
                    name: name.to_string(),
                    path: path.clone(),
                    dtype: format!("{other:?}"),
                })
            }
        };
        let want = expected.iter().product::<usize>() * dtype.size();
        if want != e.len {
            return Err(ModelError::Safetensors {
                path: path.clone(),
                message: format!("tensor `{name}`: {} bytes for shape {:?} {dtype}", e.len, e.shape),
            });
        }
        Ok((e, dtype))
    }

    /// Sets the block size of fp8 weights (`quantization_config.weight_block_size`).
    pub fn set_fp8_block(&self, block: Option<(usize, usize)>) {
        if let Some(b) = block {
            let _ = self.fp8_block.set(b);
        }
    }

    /// Sets the fp8 block size and the compressed-tensors scheme of `spec`.
    pub(crate) fn configure(&self, spec: &ModelSpec) {
        self.set_fp8_block(spec.fp8_block);
        if let Some(c) = &spec.compressed {
            let _ = self.compressed.set(c.clone());
        }
    }

    /// A 2-D weight `[rows, cols]` of a linear layer, in its shipped format
    /// (no copy of codes): dense, fp8 with block scales, or compressed-tensors
    /// 4-bit packed, as [`crate::assemble`] describes.
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<WeightMatrix, ModelError> {
        self.load_weight(name, rows, cols, true)
    }

    /// A 2-D parameter that is not a linear layer's weight (embedding, MoE
    /// router): never targeted by a compressed-tensors scheme.
    pub(crate) fn param_matrix(&self, name: &str, rows: usize, cols: usize) -> Result<WeightMatrix, ModelError> {
        self.load_weight(name, rows, cols, false)
    }

    fn load_weight(&self, name: &str, rows: usize, cols: usize, linear: bool) -> Result<WeightMatrix, ModelError> {
        let shipped = self.shipped(name, rows, cols, linear)?;
        let mut codes = None;
        let mut scales = None;
        for (kind, tensor) in &shipped.parts {
            let e = self.entry(tensor)?;
            match kind {
                PartKind::Codes => codes = Some(self.weight_bytes(tensor, e)?),
                PartKind::Scales => scales = Some((tensor, SharedBytes::from_vec(self.checked_bytes(tensor, e)?))),
                PartKind::Shape => {
                    let bytes = self.checked_bytes(tensor, e)?;
                    if self.reads_weights() {
                        assemble::check_weight_shape(&format!("{:?}", e.dtype), &bytes, rows, cols)
                            .map_err(|m| self.bad(e, format!("tensor `{tensor}`: {m}")))?;
                    }
                }
            }
        }
        let codes_entry = self.entry(&shipped.parts[0].1)?;
        let codes = codes.ok_or_else(|| ModelError::MissingTensor { name: name.to_string() })?;
        let scale_dtype = scales
            .as_ref()
            .map(|(t, _)| self.entry(t).map(|e| format!("{:?}", e.dtype)))
            .transpose()?;
        let scales = scales.map(|(_, b)| (scale_dtype.as_deref().unwrap_or(""), b));
        assemble::weight_matrix(name, rows, cols, shipped.format, codes, scales).map_err(|err| self.bad(codes_entry, err.to_string()))
    }

    fn bad(&self, e: &TensorEntry, message: String) -> ModelError {
        ModelError::Safetensors {
            path: self.files[e.file].path.clone(),
            message,
        }
    }

    /// Which tensors weight `name` ships in and the format they make, after
    /// checking them against each other and against the compressed-tensors
    /// scheme: the stored tensors decide (`weight_packed` + `weight_scale`, or
    /// `weight`); a packed tensor the scheme does not describe is an error.
    fn shipped(&self, name: &str, rows: usize, cols: usize, linear: bool) -> Result<Shipped, ModelError> {
        let module = name.strip_suffix(".weight").unwrap_or(name);
        let packed_names = assemble::shipped_names(name, true);
        let ships_packed = self.has(&packed_names[0].1);
        let cfg = self.config_json_path();
        let rule = self
            .compressed
            .get()
            .filter(|_| linear)
            .map(|c| (c.field().to_string(), c.rule(module)));
        let packed_name = &packed_names[0].1;
        let packed = if ships_packed {
            match rule {
                Some((_, ModuleRule::Packed(f))) => Some(f),
                Some((_, ModuleRule::Plain { field, reason })) => {
                    return Err(ModelError::config(
                        &cfg,
                        &field,
                        format!("tensor `{packed_name}` ships packed but module `{module}` must ship unquantized ({reason})"),
                    ))
                }
                None => {
                    return Err(ModelError::config(
                        &cfg,
                        "quantization_config",
                        format!("tensor `{packed_name}` ships packed but no compressed-tensors scheme packs `{module}`"),
                    ))
                }
            }
        } else {
            // What is stored decides: a module the scheme's targets cover may
            // still ship unquantized (Kimi K3's latent projections and
            // attention-residual vectors are bf16 `Linear`s its `ignore` list
            // does not name), as compressed-tensors loads it.
            None
        };
        if packed.is_some() && self.has(name) {
            return Err(ModelError::config(
                &cfg,
                "quantization_config",
                format!("module `{module}` ships both `{name}` and `{packed_name}`"),
            ));
        }
        let names = assemble::shipped_names(name, packed.is_some());
        let codes_name = &names[0].1;
        let codes = self.entry(codes_name)?;
        let codes_dtype = format!("{:?}", codes.dtype);
        let needs_scales = packed.is_some() || codes.dtype == Dtype::F8_E4M3;
        let mut parts = vec![(PartKind::Codes, codes_name.clone())];
        let mut scale_meta = None;
        for (kind, tensor) in &names[1..] {
            let present = self.has(tensor);
            let required = match kind {
                PartKind::Scales => needs_scales,
                PartKind::Shape => matches!(packed, Some(crate::quant::PackedFormat::Int4 { .. })),
                PartKind::Codes => true,
            };
            if required && !present {
                return Err(ModelError::MissingTensor { name: tensor.clone() });
            }
            if present && (required || *kind == PartKind::Shape) {
                parts.push((*kind, tensor.clone()));
                if *kind == PartKind::Scales {
                    scale_meta = Some(self.entry(tensor)?);
                }
            }
        }
        let scale_dtype = scale_meta.map(|e| format!("{:?}", e.dtype));
        let scales = scale_meta
            .zip(scale_dtype.as_deref())
            .map(|(e, d)| PartMeta { dtype: d, shape: &e.shape });
        let codes_meta = PartMeta {
            dtype: &codes_dtype,
            shape: &codes.shape,
        };
        let format = assemble::shipped_format(module, rows, cols, codes_meta, scales, packed, self.fp8_block())
            .map_err(|m| self.bad(codes, format!("weight `{name}`: {m}")))?;
        for (_, tensor) in &parts {
            self.check_len(tensor)?;
        }
        Ok(Shipped { format, parts })
    }

    /// Checks a tensor's byte length matches its dtype and shape.
    fn check_len(&self, name: &str) -> Result<(), ModelError> {
        let e = self.entry(name)?;
        let want = e.shape.iter().product::<usize>() * e.dtype.bitsize() / 8;
        if want != e.len {
            return Err(self.bad(
                e,
                format!(
                    "tensor `{name}`: {} bytes for shape {:?} {:?} ({want} expected)",
                    e.len, e.shape, e.dtype
                ),
            ));
        }
        Ok(())
    }

    /// A 1-D tensor of length `len`, widened to f32 (norm weights, biases).
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        self.tensor_f32(name, &[len])
    }

    /// A tensor of exactly `shape`, widened to f32 in row-major order (small
    /// parameters: convolution taps, gate parameters).
    pub(crate) fn tensor_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        let (e, dtype) = self.check(name, shape)?;
        let mut out = vec![0.0f32; shape.iter().product()];
        dtype.decode_into(&self.checked_bytes(name, e)?, &mut out);
        Ok(out)
    }

    /// An optional 1-D tensor: `None` when absent, an error when present but wrong.
    pub fn optional_vector(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>, ModelError> {
        if self.has(name) {
            self.vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// The tensors one weight ships in and the format they make.
struct Shipped {
    format: larder_tensor::WeightFormat,
    /// Codes first, then scales and `weight_shape` where shipped.
    parts: Vec<(PartKind, String)>,
}

/// Reads a safetensors file's header: its length and JSON bytes.
fn read_header(file: &File, size: u64) -> Result<(usize, Vec<u8>), String> {
    let mut len = [0u8; 8];
    if size >= 8 {
        file.read_exact_at(&mut len, 0)
            .map_err(|e| format!("reading the header length: {e}; the file may be truncated or not a safetensors file"))?;
    }
    let n = header_len(len, size)?;
    let mut header = vec![0u8; n as usize];
    file.read_exact_at(&mut header, 8)
        .map_err(|e| format!("reading the header: {e}; the file may be truncated or not a safetensors file"))?;
    Ok((n as usize, header))
}

/// The JSON header's length from a safetensors file's first 8 bytes
/// (`prefix`), checked against the file's `size` and a 100 MiB limit.
pub fn header_len(prefix: [u8; 8], size: u64) -> Result<u64, String> {
    let truncated = |what: &str| format!("{what}; the file may be truncated or not a safetensors file");
    if size < 8 {
        return Err(truncated(&format!("only {size} bytes, less than the 8-byte header length")));
    }
    let n = u64::from_le_bytes(prefix);
    if n > size - 8 || n > 100 << 20 {
        return Err(truncated(&format!("header length {n} does not fit in a {size}-byte file")));
    }
    Ok(n)
}

/// Fills `buf` from `file` at `offset`, [`READ_CHUNK`] bytes per `pread`.
fn read_range(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    for (i, chunk) in buf.chunks_mut(READ_CHUNK).enumerate() {
        file.read_exact_at(chunk, offset + (i * READ_CHUNK) as u64)?;
    }
    Ok(())
}

/// The safetensors files of a checkpoint folder, in a stable order.
/// The index of a sharded checkpoint.
pub const INDEX: &str = "model.safetensors.index.json";

/// The files a `model.safetensors.index.json` names (sorted, each once),
/// refusing names that leave the folder.
pub fn index_shards(index: &Path) -> Result<Vec<String>, ModelError> {
    let text = std::fs::read_to_string(index).map_err(|source| ModelError::Io {
        path: index.to_path_buf(),
        source,
    })?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| ModelError::Json {
        path: index.to_path_buf(),
        message: e.to_string(),
    })?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| ModelError::config(index, "weight_map", "missing or not an object"))?;
    let mut files = BTreeSet::new();
    for (tensor, file) in map {
        let f = file
            .as_str()
            .ok_or_else(|| ModelError::config(index, "weight_map", format!("entry for `{tensor}` is not a file name")))?;
        if f.contains('/') || f.contains('\\') || f == ".." {
            return Err(ModelError::config(
                index,
                "weight_map",
                format!("file name {f:?} leaves the folder"),
            ));
        }
        files.insert(f.to_string());
    }
    Ok(files.into_iter().collect())
}

fn shard_paths(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let index = dir.join(INDEX);
    if index.exists() {
        let files = index_shards(&index)?;
        let paths: Vec<PathBuf> = files.into_iter().map(|f| dir.join(f)).collect();
        for p in &paths {
            if !p.exists() {
                return Err(ModelError::Io {
                    path: p.clone(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "shard listed in model.safetensors.index.json is missing",
                    ),
                });
            }
        }
        return Ok(paths);
    }
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let mut paths = Vec::new();
    let rd = std::fs::read_dir(dir).map_err(|source| ModelError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    for entry in rd.flatten() {
        let p = entry.path();
        if p.extension().is_some_and(|e| e == "safetensors") {
            paths.push(p);
        }
    }
    paths.sort();
    if paths.is_empty() {
        return Err(ModelError::Io {
            path: dir.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no *.safetensors files in the checkpoint folder"),
        });
    }
    Ok(paths)
}
