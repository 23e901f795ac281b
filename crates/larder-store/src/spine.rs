//! The spine file of a packed store: every non-expert tensor (embeddings,
//! attention, norms, routers, shared experts) as one safetensors file,
//! written atomically with a digest per tensor taken from the source bytes
//! as they are copied, read back and checked before it is committed.
//! [`check_spine`] re-reads a spine file against its manifest entry
//! (`larder verify`); at load the engine checks each tensor as the model
//! takes it ([`crate::manifest::SpineTensorEntry::check`]).

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::digest::Digest;
use crate::fsutil::{commit, temp_path};
use crate::io::FileTable;
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

const CHUNK: usize = 8 << 20;

/// Writes `tensors` as the safetensors file `root/name` (atomically) and
/// returns its manifest entry.
pub fn write_spine(sources: &FileTable, tensors: &[SpineTensor], root: &Path, name: &str) -> Result<SpineFile, StoreError> {
    let path = root.join(name);
    let header = spine_header(tensors)?;
    let data_start = 8 + header.len() as u64;
    let tmp = temp_path(&path);
    let result = (|| {
        let mut f = std::io::BufWriter::with_capacity(CHUNK, File::create(&tmp).map_err(|e| StoreError::io(&tmp, e))?);
        f.write_all(&(header.len() as u64).to_le_bytes())
            .map_err(|e| StoreError::io(&tmp, e))?;
        f.write_all(&header).map_err(|e| StoreError::io(&tmp, e))?;
        let mut buf = vec![0u8; CHUNK];
        let mut entries = Vec::with_capacity(tensors.len());
        let mut at = data_start;
        for t in tensors {
            let mut h = xxhash_rust::xxh3::Xxh3::new();
            let mut off = 0;
            while off < t.extent.len {
                let n = (t.extent.len - off).min(buf.len() as u64) as usize;
                sources.files[t.extent.file]
                    .read_exact_at(&mut buf[..n], t.extent.offset + off)
                    .map_err(|e| sources.read_error(t.extent.file, t.extent.offset + off, n as u64, e))?;
                h.update(&buf[..n]);
                f.write_all(&buf[..n]).map_err(|e| StoreError::io(&tmp, e))?;
                off += n as u64;
            }
            entries.push(SpineTensorEntry {
                name: t.name.clone(),
                dtype: t.dtype.clone(),
                shape: t.shape.clone(),
                offset: at,
                len: t.extent.len,
                digest: Digest(h.digest128()).to_string(),
            });
            at += t.extent.len;
        }
        let f = f.into_inner().map_err(|e| StoreError::io(&tmp, e.into_error()))?;
        f.sync_all().map_err(|e| StoreError::io(&tmp, e))?;
        let entry = SpineFile {
            file: name.to_string(),
            size: at,
            header_digest: Digest::of(&header).to_string(),
            tensors: entries,
        };
        let bad = check_spine(&tmp, &entry)?;
        if let Some(first) = bad.first() {
            return Err(StoreError::Invalid(format!(
                "{}: read back after writing: {first} (is the drive failing?)",
                tmp.display()
            )));
        }
        Ok(entry)
    })();
    match result {
        Ok(entry) => {
            commit(&tmp, &path)?;
            Ok(entry)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// The safetensors header of the spine: tensors back to back in order.
fn spine_header(tensors: &[SpineTensor]) -> Result<Vec<u8>, StoreError> {
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
    Ok(text)
}

/// Re-reads the spine file at `path` and checks size, header and every
/// tensor's digest against `entry`; one line per problem.
pub fn check_spine(path: &Path, entry: &SpineFile) -> Result<Vec<String>, StoreError> {
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
