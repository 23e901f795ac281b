//! `WeightMatrix`: a 2-D weight kept in the dtype its checkpoint ships in.
//!
//! The bytes are shared (an `Arc` over an mmap, a file buffer or a Vec), never
//! converted on load: kernels widen them to f32 as they stream through.

use std::sync::Arc;

use crate::dtype::WeightDType;

/// Errors building a weight from raw bytes.
#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    #[error("weight {name}: {len} bytes do not hold {rows}x{cols} {dtype} values")]
    Size {
        name: String,
        len: usize,
        rows: usize,
        cols: usize,
        dtype: WeightDType,
    },
}

/// An immutable byte range shared between owners.
#[derive(Clone)]
pub struct SharedBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    len: usize,
}

impl SharedBytes {
    /// A view of `owner[start..start + len]`.
    ///
    /// # Panics
    /// If the range is out of bounds (callers validate ranges from file headers first).
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, start: usize, len: usize) -> Self {
        let total = (*owner).as_ref().len();
        assert!(start.checked_add(len).is_some_and(|end| end <= total), "SharedBytes out of range");
        SharedBytes { owner, start, len }
    }

    /// Takes ownership of a vector.
    pub fn from_vec(v: Vec<u8>) -> Self {
        let len = v.len();
        SharedBytes {
            owner: Arc::new(v),
            start: 0,
            len,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBytes({} bytes)", self.len)
    }
}

/// A `rows x cols` weight (`rows` = output features, `cols` = input features,
/// the layout of a torch `nn.Linear.weight`).
#[derive(Debug, Clone)]
pub struct WeightMatrix {
    dtype: WeightDType,
    rows: usize,
    cols: usize,
    bytes: SharedBytes,
}

impl WeightMatrix {
    /// Checks that `bytes` holds exactly `rows x cols` values of `dtype`.
    pub fn new(name: &str, dtype: WeightDType, rows: usize, cols: usize, bytes: SharedBytes) -> Result<Self, WeightError> {
        let want = rows.checked_mul(cols).and_then(|n| n.checked_mul(dtype.size()));
        if want != Some(bytes.len()) {
            return Err(WeightError::Size {
                name: name.to_string(),
                len: bytes.len(),
                rows,
                cols,
                dtype,
            });
        }
        Ok(WeightMatrix { dtype, rows, cols, bytes })
    }

    /// Builds a weight by encoding f32 values (tests and synthetic tools).
    pub fn from_f32(dtype: WeightDType, rows: usize, cols: usize, values: &[f32]) -> Self {
        assert_eq!(values.len(), rows * cols);
        WeightMatrix {
            dtype,
            rows,
            cols,
            bytes: SharedBytes::from_vec(crate::dtype::encode(dtype, values)),
        }
    }

    pub fn dtype(&self) -> WeightDType {
        self.dtype
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Raw bytes of the whole matrix.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// Size in bytes.
    pub fn byte_len(&self) -> usize {
        self.bytes.len()
    }

    /// Widens row `r` into `out` (length `cols`).
    pub fn decode_row(&self, r: usize, out: &mut [f32]) {
        let rb = self.cols * self.dtype.size();
        self.dtype.decode_into(&self.bytes.as_slice()[r * rb..(r + 1) * rb], out);
    }

    /// Widens the whole matrix (tests, embeddings lookups of single rows use `decode_row`).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.rows * self.cols];
        self.dtype.decode_into(self.bytes.as_slice(), &mut out);
        out
    }
}
