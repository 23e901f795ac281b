//! Where every byte of a source file goes in the store being pulled: the
//! [`Layout`] of the store's files (each layer file per drive and the spine,
//! written in place under their temporary names) and, per source file, the
//! [`Piece`]s of it that land in them. [`ScatterSink`] writes a file's byte
//! stream to its pieces as it arrives; [`GatherReader`] reads the bytes of a
//! file back from where they landed, so a resumed stream can hash the
//! prefix it does not fetch again.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use larder_tensor::safetensors_write::Header;

use crate::fsutil::temp_path;
use crate::layer_file::{layer_outs, record_offset, LayerOut};
use crate::pack_plan::{PackSource, Plan};
use crate::spine::spine_header;
use crate::StoreError;

/// A file being written: its temporary path, final path and full length.
pub(crate) struct Output {
    pub path: PathBuf,
    pub final_path: PathBuf,
    pub len: u64,
    /// What goes first (a layer header block, the spine's safetensors header).
    pub head: Vec<u8>,
}

impl Output {
    /// Opens the file for reading and writing, creating it at full length
    /// (sparse) with its head written when it is missing or does not start
    /// with its head; whether it was (then nothing in it is kept).
    pub(crate) fn open(&self) -> Result<(File, bool), StoreError> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| StoreError::io(dir, e))?;
        }
        let io = |e| StoreError::io(&self.path, e);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.path)
            .map_err(io)?;
        let mut head = vec![0u8; self.head.len()];
        let same = f.metadata().map_err(io)?.len() == self.len && f.read_exact_at(&mut head, 0).is_ok() && head == self.head;
        if !same {
            f.set_len(0).map_err(io)?;
            f.set_len(self.len).map_err(io)?;
            f.write_all_at(&self.head, 0).map_err(io)?;
        }
        Ok((f, !same))
    }
}

/// `len` bytes at `src` of a source file land at `dst` of output `out`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Piece {
    pub src: u64,
    pub len: u64,
    pub out: usize,
    pub dst: u64,
}

/// Every output file and, per source file, its pieces sorted by offset.
pub(crate) struct Layout {
    pub layers: Vec<LayerOut>,
    /// Layer files first (in `layers` order), the spine last.
    pub outputs: Vec<Output>,
    pub pieces: Vec<Vec<Piece>>,
    pub spine_header: Header,
}

impl Layout {
    /// The store `plan` makes of `src`, every record and spine tensor placed
    /// as `pack` places them; `drive_dirs` are the plan's drives resolved.
    pub(crate) fn new(src: &PackSource, plan: &Plan, drive_dirs: &[PathBuf], spine_path: PathBuf) -> Result<Layout, StoreError> {
        let layers = layer_outs(src, plan, drive_dirs)?;
        let mut outputs = Vec::new();
        let mut pieces: Vec<Vec<Piece>> = vec![Vec::new(); src.files.len()];
        for (out, lo) in layers.iter().enumerate() {
            let layer = &src.layers[lo.layer];
            for (i, &e) in lo.mine.iter().enumerate() {
                let record = record_offset(i, lo.record_len);
                for (x, p) in layer.experts[e].iter().zip(&lo.parts) {
                    pieces[x.file].push(Piece {
                        src: x.offset,
                        len: x.len,
                        out,
                        dst: record + p.offset,
                    });
                }
            }
            outputs.push(Output {
                path: temp_path(&lo.path),
                final_path: lo.path.clone(),
                len: record_offset(lo.mine.len(), lo.record_len),
                head: lo.header.to_block(),
            });
        }
        let header = spine_header(&src.spine)?;
        let out = outputs.len();
        let mut at = header.data_start();
        for t in &src.spine {
            pieces[t.extent.file].push(Piece {
                src: t.extent.offset,
                len: t.extent.len,
                out,
                dst: at,
            });
            at += t.extent.len;
        }
        let mut head = (header.json().len() as u64).to_le_bytes().to_vec();
        head.extend_from_slice(header.json());
        outputs.push(Output {
            path: temp_path(&spine_path),
            final_path: spine_path,
            len: at,
            head,
        });
        for p in &mut pieces {
            p.sort_by_key(|x| x.src);
            if let Some(w) = p.windows(2).find(|w| w[0].src + w[0].len > w[1].src) {
                return Err(StoreError::Invalid(format!(
                    "source tensors overlap at byte {} (a malformed safetensors header)",
                    w[1].src
                )));
            }
        }
        Ok(Layout {
            layers,
            outputs,
            pieces,
            spine_header: header,
        })
    }
}

impl Layout {
    /// Whether every output is on the drive, written (under its temporary
    /// name, at full length) or already sealed.
    pub(crate) fn all_on_drive(&self) -> bool {
        self.outputs
            .iter()
            .all(|o| std::fs::metadata(&o.path).is_ok_and(|m| m.len() == o.len) || o.final_path.exists())
    }
}

/// The output files, opened for writing.
pub(crate) struct OpenOutputs {
    pub files: Vec<File>,
    pub paths: Vec<PathBuf>,
}

impl OpenOutputs {
    /// Opens every output of `layout`, creating it at full length (sparse)
    /// with its head written when it is missing or does not start with its
    /// head; says whether any was (then no earlier progress is on disk).
    pub(crate) fn open(layout: &Layout) -> Result<(OpenOutputs, bool), StoreError> {
        let mut files = Vec::with_capacity(layout.outputs.len());
        let mut paths = Vec::with_capacity(layout.outputs.len());
        let mut created = false;
        for o in &layout.outputs {
            let (f, new) = o.open()?;
            created |= new;
            files.push(f);
            paths.push(o.path.clone());
        }
        Ok((OpenOutputs { files, paths }, created))
    }

    /// Flushes every output to the drive (before progress is recorded).
    pub(crate) fn sync(&self) -> Result<(), StoreError> {
        for (f, p) in self.files.iter().zip(&self.paths) {
            f.sync_data().map_err(|e| StoreError::io(p, e))?;
        }
        Ok(())
    }
}

/// The piece of `pieces` holding byte `pos`, or the index of the first
/// piece after it.
fn find(pieces: &[Piece], pos: u64) -> Result<usize, usize> {
    let i = pieces.partition_point(|p| p.src + p.len <= pos);
    match pieces.get(i) {
        Some(p) if p.src <= pos => Ok(i),
        _ => Err(i),
    }
}

/// Writes one source file's byte stream (from `pos`) to its pieces;
/// checks the bytes of its safetensors header against the ones read
/// before (the file did not change since); calls `advanced` with the
/// offset reached after each write.
pub(crate) struct ScatterSink<'a> {
    pub head: &'a [u8],
    pub pieces: &'a [Piece],
    pub outputs: &'a OpenOutputs,
    pub pos: u64,
    pub advanced: &'a mut dyn FnMut(u64) -> std::io::Result<()>,
}

impl Write for ScatterSink<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut rest = buf;
        while !rest.is_empty() {
            let n = if self.pos < self.head.len() as u64 {
                let at = self.pos as usize;
                let n = rest.len().min(self.head.len() - at);
                if rest[..n] != self.head[at..at + n] {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "its safetensors header differs from the one read before the download: the file changed at the source",
                    ));
                }
                n
            } else {
                match find(self.pieces, self.pos) {
                    Ok(i) => {
                        let p = self.pieces[i];
                        let n = rest.len().min((p.src + p.len - self.pos) as usize);
                        let file = &self.outputs.files[p.out];
                        file.write_all_at(&rest[..n], p.dst + (self.pos - p.src))
                            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", self.outputs.paths[p.out].display())))?;
                        n
                    }
                    // Bytes no tensor claims (padding): hashed, not kept.
                    Err(i) => {
                        let next = self.pieces.get(i).map_or(u64::MAX, |p| p.src);
                        rest.len().min((next - self.pos).min(usize::MAX as u64) as usize)
                    }
                }
            };
            rest = &rest[n..];
            self.pos += n as u64;
        }
        (self.advanced)(self.pos)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Reads a source file's bytes `0..end` back from where they were
/// scattered; an error at bytes no piece kept (they cannot be re-hashed).
pub(crate) struct GatherReader<'a> {
    pub head: &'a [u8],
    pub pieces: &'a [Piece],
    pub outputs: &'a OpenOutputs,
    pub pos: u64,
    pub end: u64,
}

impl Read for GatherReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let want = (buf.len() as u64).min(self.end.saturating_sub(self.pos)) as usize;
        if want == 0 {
            return Ok(0);
        }
        let n = if self.pos < self.head.len() as u64 {
            let at = self.pos as usize;
            let n = want.min(self.head.len() - at);
            buf[..n].copy_from_slice(&self.head[at..at + n]);
            n
        } else {
            let i = find(self.pieces, self.pos)
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::NotFound, format!("byte {} was not kept", self.pos)))?;
            let p = self.pieces[i];
            let n = want.min((p.src + p.len - self.pos) as usize);
            self.outputs.files[p.out].read_exact_at(&mut buf[..n], p.dst + (self.pos - p.src))?;
            n
        };
        self.pos += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outputs(dir: &std::path::Path) -> OpenOutputs {
        let path = dir.join("out.bin");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(6).unwrap();
        OpenOutputs {
            files: vec![file],
            paths: vec![path],
        }
    }

    /// Bytes `HEAD` | `abcd` -> out[0..4] | 2 bytes no tensor claims | `ef` -> out[4..6].
    const PIECES: [Piece; 2] = [
        Piece {
            src: 4,
            len: 4,
            out: 0,
            dst: 0,
        },
        Piece {
            src: 10,
            len: 2,
            out: 0,
            dst: 4,
        },
    ];

    #[test]
    fn scatter_writes_each_piece_where_it_lands_and_gather_reads_it_back() {
        let dir = std::env::temp_dir().join(format!("larder-scatter-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = outputs(&dir);
        let mut reached = Vec::new();
        let mut advanced = |pos: u64| {
            reached.push(pos);
            Ok(())
        };
        let mut sink = ScatterSink {
            head: b"HEAD",
            pieces: &PIECES,
            outputs: &out,
            pos: 0,
            advanced: &mut advanced,
        };
        // In uneven writes, across the header, pieces and the gap.
        for part in [&b"HE"[..], b"ADab", b"cdXX", b"e", b"f"] {
            sink.write_all(part).unwrap();
        }
        assert_eq!(reached, vec![2, 6, 10, 11, 12]);
        assert_eq!(std::fs::read(&out.paths[0]).unwrap(), b"abcdef");
        let mut back = Vec::new();
        GatherReader {
            head: b"HEAD",
            pieces: &PIECES,
            outputs: &out,
            pos: 0,
            end: 8,
        }
        .read_to_end(&mut back)
        .unwrap();
        assert_eq!(back, b"HEADabcd");
        // Bytes no piece kept cannot be read back (the prefix is fetched again).
        let mut gap = GatherReader {
            head: b"HEAD",
            pieces: &PIECES,
            outputs: &out,
            pos: 0,
            end: 11,
        };
        assert!(gap.read_to_end(&mut Vec::new()).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_stream_whose_header_differs_is_refused() {
        let dir = std::env::temp_dir().join(format!("larder-scatter-head-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = outputs(&dir);
        let mut advanced = |_| Ok(());
        let mut sink = ScatterSink {
            head: b"HEAD",
            pieces: &PIECES,
            outputs: &out,
            pos: 0,
            advanced: &mut advanced,
        };
        let err = sink.write_all(b"HEAT").unwrap_err();
        assert!(err.to_string().contains("changed at the source"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
