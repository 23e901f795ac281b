//! The one safetensors writer of larder (synthetic and upcycled checkpoints,
//! a packed store's spine, the demo's GGUF conversion).
//!
//! A [`Header`] is built from the list of tensors (name, dtype, shape, byte
//! length), data laid out back to back in list order, the JSON padded with
//! spaces to a multiple of 8 bytes as safetensors does. A [`SafetensorsWriter`]
//! then streams the data in that order into `<name>.partial`; [`finish`]
//! checks every tensor got exactly its bytes and syncs the file, and
//! [`Finished::commit`] renames it into place (and syncs the folder), so a
//! crash never leaves a half-written file under its final name.
//!
//! Two header layouts exist, both kept byte for byte: [`KeyOrder::Sorted`]
//! (tensor names and keys in sorted order, as a `serde_json` map prints
//! them: what synth, upcycle and pack write) and [`KeyOrder::AsGiven`]
//! (tensors in list order, keys `dtype`, `shape`, `data_offsets`, metadata
//! last, non-ASCII escaped: Python's `json.dumps` in the reference
//! conversion script, which the demo's GGUF conversion matches byte for byte).
//!
//! [`finish`]: SafetensorsWriter::finish

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Errors writing a safetensors file; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum SafetensorsWriteError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: tensor `{name}`: {message}")]
    Data { path: PathBuf, name: String, message: String },
    #[error("safetensors header: {0}")]
    Header(String),
}

/// One tensor of a header: its data is `len` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorHeader {
    pub name: String,
    /// The safetensors dtype name (`BF16`, `F32`, `U8`, ...).
    pub dtype: String,
    pub shape: Vec<usize>,
    pub len: u64,
}

/// How the header JSON is laid out (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyOrder {
    /// Names and keys sorted (`serde_json` map order).
    Sorted,
    /// Tensors in list order, keys `dtype`, `shape`, `data_offsets`,
    /// `__metadata__` last, non-ASCII and DEL escaped as `\uXXXX` (Python).
    AsGiven,
}

/// A safetensors header: the padded JSON and the tensors' byte lengths.
#[derive(Debug, Clone)]
pub struct Header {
    json: Vec<u8>,
    tensors: Vec<(String, u64)>,
}

impl Header {
    /// The header of `tensors` (data back to back in this order) with the
    /// string pairs `metadata` as `__metadata__`.
    pub fn new(tensors: &[TensorHeader], metadata: &[(&str, &str)], order: KeyOrder) -> Result<Header, SafetensorsWriteError> {
        let mut json = match order {
            KeyOrder::Sorted => sorted_json(tensors, metadata)?,
            KeyOrder::AsGiven => as_given_json(tensors, metadata),
        };
        json.resize(json.len().div_ceil(8) * 8, b' ');
        Ok(Header {
            json,
            tensors: tensors.iter().map(|t| (t.name.clone(), t.len)).collect(),
        })
    }

    /// The padded JSON (without the 8-byte length before it).
    pub fn json(&self) -> &[u8] {
        &self.json
    }

    /// Where the data starts in the file.
    pub fn data_start(&self) -> u64 {
        8 + self.json.len() as u64
    }

    /// The size of the whole file.
    pub fn file_len(&self) -> u64 {
        self.data_start() + self.tensors.iter().map(|t| t.1).sum::<u64>()
    }
}

/// Names and keys sorted explicitly (`BTreeMap`s), whatever order
/// `serde_json::Map` keeps (another crate may turn on its `preserve_order`).
fn sorted_json(tensors: &[TensorHeader], metadata: &[(&str, &str)]) -> Result<Vec<u8>, SafetensorsWriteError> {
    use std::collections::BTreeMap;
    let mut map: BTreeMap<String, BTreeMap<&str, serde_json::Value>> = BTreeMap::new();
    let mut at = 0u64;
    for t in tensors {
        let entry = BTreeMap::from([
            ("dtype", serde_json::json!(t.dtype)),
            ("shape", serde_json::json!(t.shape)),
            ("data_offsets", serde_json::json!([at, at + t.len])),
        ]);
        map.insert(t.name.clone(), entry);
        at += t.len;
    }
    let meta: BTreeMap<&str, serde_json::Value> = metadata.iter().map(|(k, v)| (*k, (*v).into())).collect();
    map.insert("__metadata__".into(), meta);
    serde_json::to_vec(&map).map_err(|e| SafetensorsWriteError::Header(e.to_string()))
}

fn as_given_json(tensors: &[TensorHeader], metadata: &[(&str, &str)]) -> Vec<u8> {
    let mut s = String::from("{");
    let mut at = 0u64;
    for t in tensors {
        let shape: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
        push_python_str(&mut s, &t.name);
        s.push_str(":{\"dtype\":");
        push_python_str(&mut s, &t.dtype);
        s.push_str(&format!(
            ",\"shape\":[{}],\"data_offsets\":[{at},{}]}},",
            shape.join(","),
            at + t.len
        ));
        at += t.len;
    }
    s.push_str("\"__metadata__\":{");
    for (i, (k, v)) in metadata.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        push_python_str(&mut s, k);
        s.push(':');
        push_python_str(&mut s, v);
    }
    s.push_str("}}");
    s.into_bytes()
}

/// A JSON string as Python's `json.dumps` (`ensure_ascii`) prints it.
fn push_python_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
    }
    out.push('"');
}

/// `path` with `.partial` appended to its file name: where it is written.
pub fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".partial");
    path.with_file_name(name)
}

/// Bytes buffered between the data and the file.
const BUFFER: usize = 16 << 20;

/// Streams a safetensors file: the header at creation, then every tensor's
/// bytes in header order (in as many pieces as the caller likes).
pub struct SafetensorsWriter {
    path: PathBuf,
    tmp: PathBuf,
    out: BufWriter<File>,
    tensors: Vec<(String, u64)>,
    /// The tensor being written and its bytes so far.
    current: usize,
    done: u64,
}

impl SafetensorsWriter {
    /// Creates `<path>.partial` and writes `header` into it.
    pub fn create(path: &Path, header: &Header) -> Result<Self, SafetensorsWriteError> {
        let tmp = partial_path(path);
        let file = File::create(&tmp).map_err(|e| io(&tmp, e))?;
        let mut out = BufWriter::with_capacity(BUFFER, file);
        out.write_all(&(header.json.len() as u64).to_le_bytes()).map_err(|e| io(&tmp, e))?;
        out.write_all(&header.json).map_err(|e| io(&tmp, e))?;
        let mut w = SafetensorsWriter {
            path: path.to_path_buf(),
            tmp,
            out,
            tensors: header.tensors.clone(),
            current: 0,
            done: 0,
        };
        w.skip_empty();
        Ok(w)
    }

    /// Appends `bytes` to the data: the rest of the current tensor and then
    /// the next ones. Errors if they run past the last tensor.
    pub fn write(&mut self, mut bytes: &[u8]) -> Result<(), SafetensorsWriteError> {
        while !bytes.is_empty() {
            let Some((_, len)) = self.tensors.get(self.current) else {
                let (name, _) = self.tensors.last().cloned().unwrap_or_default();
                return Err(self.data_error(&name, format!("{} bytes past the end of the data", bytes.len())));
            };
            let n = (len - self.done).min(bytes.len() as u64) as usize;
            self.out.write_all(&bytes[..n]).map_err(|e| io(&self.tmp, e))?;
            self.done += n as u64;
            bytes = &bytes[n..];
            self.skip_empty();
        }
        Ok(())
    }

    /// Moves past finished (and empty) tensors.
    fn skip_empty(&mut self) {
        while self.tensors.get(self.current).is_some_and(|t| self.done == t.1) {
            self.current += 1;
            self.done = 0;
        }
    }

    fn data_error(&self, name: &str, message: String) -> SafetensorsWriteError {
        SafetensorsWriteError::Data {
            path: self.tmp.clone(),
            name: name.to_string(),
            message,
        }
    }

    /// Checks every tensor is complete, flushes and syncs the file. The
    /// file is still under its `.partial` name.
    pub fn finish(mut self) -> Result<Finished, SafetensorsWriteError> {
        if let Some((name, len)) = self.tensors.get(self.current) {
            return Err(self.data_error(name, format!("{} of {len} bytes written", self.done)));
        }
        self.out.flush().map_err(|e| io(&self.tmp, e))?;
        let file = self.out.into_inner().map_err(|e| io(&self.tmp, e.into_error()))?;
        file.sync_all().map_err(|e| io(&self.tmp, e))?;
        Ok(Finished {
            path: self.path,
            tmp: self.tmp,
        })
    }
}

/// A complete file under its `.partial` name, to check, then commit or discard.
#[derive(Debug)]
pub struct Finished {
    path: PathBuf,
    tmp: PathBuf,
}

impl Finished {
    /// Where the file is now (`<path>.partial`).
    pub fn partial(&self) -> &Path {
        &self.tmp
    }

    /// Renames the file to its final name and syncs the folder.
    pub fn commit(self) -> Result<PathBuf, SafetensorsWriteError> {
        std::fs::rename(&self.tmp, &self.path).map_err(|e| io(&self.path, e))?;
        if let Some(dir) = self.path.parent() {
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(self.path)
    }

    /// Removes the partial file.
    pub fn discard(self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
}

fn io(path: &Path, source: std::io::Error) -> SafetensorsWriteError {
    SafetensorsWriteError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
#[path = "safetensors_write_tests.rs"]
mod tests;
