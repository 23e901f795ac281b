//! Sequence states on disk: a versioned little-endian binary format for a
//! [`SequenceState`], the tokens it holds and the [`StateSnapshot`]s it can
//! return to (larder-engine's prefix-cache disk tier writes and reads them).
//!
//! Layout (every integer little-endian; `f32`s as their LE bits):
//!
//! ```text
//! header  "LARDSTAT" | version u32 | model identity u128
//!         | n_tokens u64 | tokens u32 x n | n_snapshots u32 | snapshot lengths u64 x n
//! state   len u64 | n_layers u32 | per layer:
//!           tag u8 = 0 (KV): k_dim u64 | v_dim u64 | keys f32 x len*k_dim | values f32 x len*v_dim
//!           tag u8 = 1 (recurrent): heads u64 | head_dim u64 | channels u64 | kernel u64
//!                                   | matrix f32 x heads*head_dim^2 | window f32 x (kernel-1)*channels
//! snaps   per snapshot: len u64 | n u32 | per recurrent layer: layer u32 | matrix_len u64
//!           | window_len u64 | matrix f32 x | window f32 x
//! trailer XXH3-128 of every byte before it (u128)
//! ```
//!
//! Dims are stored per layer and nothing is assumed about them (a KV layer
//! may hold a compressed latent, `v_dim` 0); [`read_state`] refuses a file
//! whose identity is not the caller's, whose layers do not fit the model
//! ([`DecoderModel::fits`]), whose digest does not match (corrupt or cut
//! short), or whose lengths exceed the file (no allocation beyond its size).

use std::io::{Read, Write};

use crate::decoder::DecoderModel;
use crate::kv_cache::KvLayer;
use crate::state::{LayerState, RecurrentLayer, RecurrentValues, SequenceState, StateSnapshot};

/// The format's first bytes.
pub(crate) const STATE_MAGIC: &[u8; 8] = b"LARDSTAT";
/// The version this build writes and reads.
pub(crate) const STATE_FORMAT_VERSION: u32 = 1;
/// Bytes of the trailing digest.
const TRAILER: u64 = 16;

/// Why a state file cannot be written or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateIoError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not a larder state file (no LARDSTAT magic)")]
    Magic,
    #[error("state format version {0}; this build reads version {STATE_FORMAT_VERSION}")]
    Version(u32),
    #[error("truncated: {0}")]
    Truncated(String),
    #[error("digest mismatch: the file is corrupt")]
    Digest,
    #[error("saved for another model (identity {found:032x}, this model is {wanted:032x})")]
    OtherModel { found: u128, wanted: u128 },
    #[error("malformed: {0}")]
    Malformed(String),
    #[error("does not fit this model: {0}")]
    Shape(String),
}

/// What a file's header says: whose state it is and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateHeader {
    pub identity: u128,
    /// The tokens the state holds, one per position.
    pub tokens: Vec<u32>,
    /// Lengths of the snapshots saved with it, ascending.
    pub snapshot_lens: Vec<usize>,
}

/// A whole file read back.
#[derive(Debug, Clone)]
pub struct SavedState {
    pub header: StateHeader,
    pub state: SequenceState,
    pub snapshots: Vec<StateSnapshot>,
}

/// Bytes [`write_state`] writes for these arguments.
pub fn encoded_len(tokens: &[u32], state: &SequenceState, snapshots: &[StateSnapshot]) -> u64 {
    let header = 8 + 4 + 16 + 8 + 4 * tokens.len() as u64 + 4 + 8 * snapshots.len() as u64;
    let layers: u64 = (0..state.num_layers())
        .filter_map(|l| state.layer(l))
        .map(|l| match l {
            LayerState::Kv(kv) => 1 + 16 + kv_floats(kv, state.len()) * 4,
            LayerState::Recurrent(r) => 1 + 32 + values_floats(r.values()) * 4,
        })
        .sum();
    let snaps: u64 = snapshots
        .iter()
        .map(|s| 12 + s.recurrent().iter().map(|(_, v)| 20 + values_floats(v) * 4).sum::<u64>())
        .sum();
    header + 12 + layers + snaps + TRAILER
}

fn kv_floats(kv: &KvLayer, len: usize) -> u64 {
    let (k, v) = kv.dims();
    ((k + v) * len) as u64
}

fn values_floats(v: &RecurrentValues) -> u64 {
    (v.matrix.len() + v.window.len()) as u64
}

/// Writes `state` (holding `tokens`, one per position) and `snapshots` for
/// the model `identity`; returns the bytes written. The digest comes last,
/// so a file cut short anywhere never reads back as valid.
pub fn write_state<W: Write>(
    w: W,
    identity: u128,
    tokens: &[u32],
    state: &SequenceState,
    snapshots: &[StateSnapshot],
) -> Result<u64, StateIoError> {
    if tokens.len() != state.len() {
        return Err(StateIoError::Malformed(format!(
            "{} tokens for a state of {} positions",
            tokens.len(),
            state.len()
        )));
    }
    let mut d = Dst::new(w);
    d.put(STATE_MAGIC)?;
    d.u32(STATE_FORMAT_VERSION)?;
    d.put(&identity.to_le_bytes())?;
    d.u64(tokens.len() as u64)?;
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    d.put(&bytes)?;
    d.u32(snapshots.len() as u32)?;
    for s in snapshots {
        d.u64(s.len() as u64)?;
    }
    write_layers(&mut d, state)?;
    for s in snapshots {
        d.u64(s.len() as u64)?;
        d.u32(s.recurrent().len() as u32)?;
        for (layer, v) in s.recurrent() {
            d.u32(*layer as u32)?;
            d.u64(v.matrix.len() as u64)?;
            d.u64(v.window.len() as u64)?;
            d.f32s(&v.matrix)?;
            d.f32s(&v.window)?;
        }
    }
    d.finish()
}

fn write_layers<W: Write>(d: &mut Dst<W>, state: &SequenceState) -> Result<(), StateIoError> {
    let len = state.len();
    d.u64(len as u64)?;
    d.u32(state.num_layers() as u32)?;
    for l in (0..state.num_layers()).filter_map(|l| state.layer(l)) {
        match l {
            LayerState::Kv(kv) => {
                let (k_dim, v_dim) = kv.dims();
                let (keys, values) = kv.parts();
                d.put(&[0])?;
                d.u64(k_dim as u64)?;
                d.u64(v_dim as u64)?;
                let (Some(keys), Some(values)) = (keys.get(..len * k_dim), values.get(..len * v_dim)) else {
                    return Err(StateIoError::Malformed("a KV layer holds fewer positions than the state".into()));
                };
                d.f32s(keys)?;
                d.f32s(values)?;
            }
            LayerState::Recurrent(r) => {
                let (heads, head_dim, channels, kernel) = r.dims();
                d.put(&[1])?;
                for x in [heads, head_dim, channels, kernel] {
                    d.u64(x as u64)?;
                }
                d.f32s(&r.values().matrix)?;
                d.f32s(&r.values().window)?;
            }
        }
    }
    Ok(())
}

/// Reads only the header of a file of `file_len` bytes (the digest is not
/// checked: [`read_state`] does, before anything is used).
pub fn read_header<R: Read>(r: R, file_len: u64) -> Result<StateHeader, StateIoError> {
    header(&mut Src::new(r, file_len)?)
}

/// Reads a whole file of `file_len` bytes for `model`, whose identity is
/// `identity`; see the module docs for what is refused.
pub fn read_state<R: Read>(r: R, file_len: u64, model: &DecoderModel, identity: u128) -> Result<SavedState, StateIoError> {
    let mut s = Src::new(r, file_len)?;
    let header = header(&mut s)?;
    if header.identity != identity {
        return Err(StateIoError::OtherModel {
            found: header.identity,
            wanted: identity,
        });
    }
    let state = read_layers(&mut s)?;
    let mut snapshots = Vec::with_capacity(header.snapshot_lens.len());
    for _ in 0..header.snapshot_lens.len() {
        snapshots.push(read_snapshot(&mut s)?);
    }
    s.finish()?;
    check(&header, &state, &snapshots, model)?;
    Ok(SavedState { header, state, snapshots })
}

fn header<R: Read>(s: &mut Src<R>) -> Result<StateHeader, StateIoError> {
    if s.take(8)? != STATE_MAGIC {
        return Err(StateIoError::Magic);
    }
    let version = s.u32()?;
    if version != STATE_FORMAT_VERSION {
        return Err(StateIoError::Version(version));
    }
    let identity = u128::from_le_bytes(s.array()?);
    let n = s.u64()?;
    let tokens = s
        .take(n.saturating_mul(4))?
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let snaps = s.u32()? as u64;
    let snapshot_lens = (0..snaps).map(|_| s.usize()).collect::<Result<_, _>>()?;
    Ok(StateHeader {
        identity,
        tokens,
        snapshot_lens,
    })
}

fn read_layers<R: Read>(s: &mut Src<R>) -> Result<SequenceState, StateIoError> {
    let len = s.usize()?;
    let n = s.u32()?;
    let mut layers = Vec::new();
    for _ in 0..n {
        let layer = match s.take(1)?[0] {
            0 => {
                let (k_dim, v_dim) = (s.usize()?, s.usize()?);
                let keys = s.f32s(mul(&[len, k_dim])?)?;
                let values = s.f32s(mul(&[len, v_dim])?)?;
                LayerState::Kv(KvLayer::from_parts(k_dim, v_dim, keys, values))
            }
            1 => {
                let [heads, head_dim, channels, kernel] = [s.usize()?, s.usize()?, s.usize()?, s.usize()?];
                let values = RecurrentValues {
                    matrix: s.f32s(mul(&[heads, head_dim, head_dim])?)?,
                    window: s.f32s(mul(&[kernel.saturating_sub(1), channels])?)?,
                };
                LayerState::Recurrent(RecurrentLayer::with_values(heads, head_dim, channels, kernel, &values))
            }
            tag => return Err(StateIoError::Malformed(format!("layer tag {tag}"))),
        };
        layers.push(layer);
    }
    Ok(SequenceState::from_layers(layers, len))
}

fn read_snapshot<R: Read>(s: &mut Src<R>) -> Result<StateSnapshot, StateIoError> {
    let len = s.usize()?;
    let n = s.u32()?;
    let mut recurrent = Vec::new();
    for _ in 0..n {
        let layer = s.u32()? as usize;
        let (m, w) = (s.usize()?, s.usize()?);
        let values = RecurrentValues {
            matrix: s.f32s(m)?,
            window: s.f32s(w)?,
        };
        recurrent.push((layer, values));
    }
    Ok(StateSnapshot::from_parts(len, recurrent))
}

/// Checks the decoded parts agree with each other and fit `model`.
fn check(h: &StateHeader, state: &SequenceState, snaps: &[StateSnapshot], model: &DecoderModel) -> Result<(), StateIoError> {
    if h.tokens.len() != state.len() {
        return Err(StateIoError::Malformed(format!(
            "{} tokens for {} positions",
            h.tokens.len(),
            state.len()
        )));
    }
    if !model.fits(state) {
        return Err(StateIoError::Shape(format!("layers {}", describe(state))));
    }
    for (s, &len) in snaps.iter().zip(&h.snapshot_lens) {
        let fits = s.len() == len
            && len <= state.len()
            && s.recurrent().iter().all(|(l, v)| match state.layer(*l) {
                Some(LayerState::Recurrent(r)) => r.values().matrix.len() == v.matrix.len() && r.values().window.len() == v.window.len(),
                _ => false,
            });
        if !fits {
            return Err(StateIoError::Shape(format!("a snapshot at {} positions", s.len())));
        }
    }
    Ok(())
}

/// The layers' kinds and dims, for an error message.
fn describe(state: &SequenceState) -> String {
    let dims: Vec<String> = (0..state.num_layers())
        .filter_map(|l| state.layer(l))
        .map(|l| match l {
            LayerState::Kv(kv) => format!("kv{:?}", kv.dims()),
            LayerState::Recurrent(r) => format!("recurrent{:?}", r.dims()),
        })
        .collect();
    dims.join(", ")
}

fn mul(xs: &[usize]) -> Result<usize, StateIoError> {
    xs.iter()
        .try_fold(1usize, |a, &x| a.checked_mul(x))
        .ok_or_else(|| StateIoError::Malformed(format!("dims {xs:?} overflow")))
}

/// A writer that digests and counts what it writes.
struct Dst<W: Write> {
    w: W,
    h: xxhash_rust::xxh3::Xxh3,
    n: u64,
}

impl<W: Write> Dst<W> {
    fn new(w: W) -> Self {
        Dst {
            w,
            h: xxhash_rust::xxh3::Xxh3::new(),
            n: 0,
        }
    }

    fn put(&mut self, b: &[u8]) -> Result<(), StateIoError> {
        self.h.update(b);
        self.w.write_all(b)?;
        self.n += b.len() as u64;
        Ok(())
    }

    fn u32(&mut self, x: u32) -> Result<(), StateIoError> {
        self.put(&x.to_le_bytes())
    }

    fn u64(&mut self, x: u64) -> Result<(), StateIoError> {
        self.put(&x.to_le_bytes())
    }

    fn f32s(&mut self, xs: &[f32]) -> Result<(), StateIoError> {
        let mut buf = Vec::with_capacity(xs.len().min(1 << 16) * 4);
        for chunk in xs.chunks(1 << 16) {
            buf.clear();
            buf.extend(chunk.iter().flat_map(|x| x.to_le_bytes()));
            self.put(&buf)?;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<u64, StateIoError> {
        let digest = self.h.digest128();
        self.w.write_all(&digest.to_le_bytes())?;
        self.w.flush()?;
        Ok(self.n + TRAILER)
    }
}

/// A reader that digests what it reads and never reads (or allocates)
/// beyond the body of a file of known length.
struct Src<R: Read> {
    r: R,
    h: xxhash_rust::xxh3::Xxh3,
    /// Body bytes not read yet (the trailer excluded).
    left: u64,
}

impl<R: Read> Src<R> {
    fn new(r: R, file_len: u64) -> Result<Self, StateIoError> {
        let left = file_len
            .checked_sub(TRAILER)
            .ok_or_else(|| StateIoError::Truncated(format!("{file_len} bytes: shorter than the digest")))?;
        Ok(Src {
            r,
            h: xxhash_rust::xxh3::Xxh3::new(),
            left,
        })
    }

    fn take(&mut self, n: u64) -> Result<Vec<u8>, StateIoError> {
        if n > self.left {
            return Err(StateIoError::Truncated(format!("{n} bytes wanted, {} left", self.left)));
        }
        let mut b = vec![0; n as usize];
        self.r.read_exact(&mut b).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => StateIoError::Truncated("the file ended early".into()),
            _ => StateIoError::Io(e),
        })?;
        self.h.update(&b);
        self.left -= n;
        Ok(b)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], StateIoError> {
        let b = self.take(N as u64)?;
        let mut a = [0; N];
        a.copy_from_slice(&b);
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32, StateIoError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, StateIoError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn usize(&mut self) -> Result<usize, StateIoError> {
        let x = self.u64()?;
        usize::try_from(x).map_err(|_| StateIoError::Malformed(format!("{x} does not fit usize")))
    }

    fn f32s(&mut self, n: usize) -> Result<Vec<f32>, StateIoError> {
        let bytes = (n as u64).saturating_mul(4);
        let b = self.take(bytes)?;
        Ok(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    /// Checks nothing is left before the trailer and the trailer matches.
    fn finish(mut self) -> Result<(), StateIoError> {
        if self.left != 0 {
            return Err(StateIoError::Malformed(format!("{} bytes after the last snapshot", self.left)));
        }
        let mut t = [0; 16];
        self.r.read_exact(&mut t)?;
        if u128::from_le_bytes(t) != self.h.digest128() {
            return Err(StateIoError::Digest);
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "state_io_tests.rs"]
mod tests;
