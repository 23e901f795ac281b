//! The spine file of a packed store: every non-expert tensor (embeddings,
//! attention, norms, routers, shared experts) as one safetensors file,
//! written atomically with a digest per tensor taken from the source bytes
//! as they are copied, read back and checked before it is committed.
//! [`check_spine`] re-reads a spine file against its manifest entry
//! (`larder verify`); at load the engine checks each tensor as the model
//! takes it ([`crate::manifest::SpineTensorEntry::check`]).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use larder_tensor::safetensors_write::{partial_path, Finished, Header, KeyOrder, SafetensorsWriter, TensorHeader};

use crate::digest::Digest;
use crate::io::IoBackend;
use crate::location::Extent;
use crate::manifest::{SpineFile, SpineTensorEntry};
use crate::StoreError;

/// A non-expert tensor copied into the spine file.
#[derive(Debug, Clone)]
pub struct SpineTensor {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub extent: Extent,
}

impl SpineTensor {
    /// Its manifest entry, at `offset` of the spine file.
    pub(crate) fn entry(&self, offset: u64, digest: Digest) -> SpineTensorEntry {
        SpineTensorEntry {
            name: self.name.clone(),
            dtype: self.dtype.clone(),
            shape: self.shape.clone(),
            offset,
            len: self.extent.len,
            digest: digest.to_string(),
        }
    }
}

const CHUNK: usize = 8 << 20;

/// Writes `tensors` as the safetensors file `root/name` (atomically) and
/// returns its manifest entry.
pub(crate) fn write_spine(sources: &dyn IoBackend, tensors: &[SpineTensor], root: &Path, name: &str) -> Result<SpineFile, StoreError> {
    let path = root.join(name);
    match write_checked(sources, tensors, &path, name) {
        Ok((entry, done)) => {
            done.commit()?;
            Ok(entry)
        }
        Err(e) => {
            let _ = std::fs::remove_file(partial_path(&path));
            Err(e)
        }
    }
}

/// Writes the spine under its `.partial` name, digesting each tensor's
/// bytes as they are copied, and reads it back against its entry.
fn write_checked(sources: &dyn IoBackend, tensors: &[SpineTensor], path: &Path, name: &str) -> Result<(SpineFile, Finished), StoreError> {
    let header = spine_header(tensors)?;
    let mut f = SafetensorsWriter::create(path, &header)?;
    let mut entries = Vec::with_capacity(tensors.len());
    let mut at = header.data_start();
    for t in tensors {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        let mut off = 0;
        while off < t.extent.len {
            let n = (t.extent.len - off).min(CHUNK as u64);
            let piece = Extent {
                file: t.extent.file,
                offset: t.extent.offset + off,
                len: n,
            };
            let views = sources.read_blocking(&[piece])?;
            let bytes = views[0].as_slice();
            h.update(bytes);
            f.write(bytes)?;
            off += n;
        }
        entries.push(t.entry(at, Digest(h.digest128())));
        at += t.extent.len;
    }
    let done = f.finish()?;
    let entry = SpineFile {
        file: name.to_string(),
        size: at,
        header_digest: Digest::of(header.json()).to_string(),
        tensors: entries,
    };
    if let Some(first) = check_spine(done.partial(), &entry)?.first() {
        return Err(StoreError::Invalid(format!(
            "{}: read back after writing: {first} (is the drive failing?)",
            done.partial().display()
        )));
    }
    Ok((entry, done))
}

/// The safetensors header of the spine: tensors back to back in order.
pub(crate) fn spine_header(tensors: &[SpineTensor]) -> Result<Header, StoreError> {
    let list: Vec<TensorHeader> = tensors
        .iter()
        .map(|t| TensorHeader {
            name: t.name.clone(),
            dtype: t.dtype.clone(),
            shape: t.shape.clone(),
            len: t.extent.len,
        })
        .collect();
    Ok(Header::new(
        &list,
        &[("format", "pt"), ("written_by", "larder pack")],
        KeyOrder::Sorted,
    )?)
}

/// Re-reads the spine file at `path` and checks size, header and every
/// tensor's digest against `entry`; one line per problem.
pub(crate) fn check_spine(path: &Path, entry: &SpineFile) -> Result<Vec<String>, StoreError> {
    let name = path.display();
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) => return Ok(vec![format!("spine {name}: cannot open: {e}")]),
    };
    let size = f.metadata().map_err(|e| StoreError::io(path, e))?.len();
    if size != entry.size {
        return Ok(vec![format!("spine {name}: {size} bytes, the manifest says {}", entry.size)]);
    }
    let mut bad = Vec::new();
    let mut len8 = [0u8; 8];
    f.read_exact_at(&mut len8, 0).map_err(|e| StoreError::io(path, e))?;
    let header_len = u64::from_le_bytes(len8);
    let header_ok = header_len <= size.saturating_sub(8) && {
        let mut header = vec![0u8; header_len as usize];
        f.read_exact_at(&mut header, 8).map_err(|e| StoreError::io(path, e))?;
        Digest::of(&header).to_string() == entry.header_digest
    };
    if !header_ok {
        bad.push(format!("spine {name}: safetensors header differs from the one packed"));
    }
    let mut buf = vec![0u8; CHUNK];
    for t in &entry.tensors {
        if t.offset.checked_add(t.len).is_none_or(|end| end > size) {
            bad.push(format!("spine {name}: tensor `{}` lies outside the file", t.name));
            continue;
        }
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        let mut off = 0;
        while off < t.len {
            let n = (t.len - off).min(buf.len() as u64) as usize;
            f.read_exact_at(&mut buf[..n], t.offset + off)
                .map_err(|e| StoreError::io(path, e))?;
            h.update(&buf[..n]);
            off += n as u64;
        }
        if Digest(h.digest128()).to_string() != t.digest {
            bad.push(format!("spine {name}: tensor `{}` digest mismatch", t.name));
        }
    }
    Ok(bad)
}
