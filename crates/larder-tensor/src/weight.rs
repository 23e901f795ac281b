//! `WeightMatrix`: a 2-D weight kept in the dtype its checkpoint ships in.
//!
//! The bytes are a [`SharedBytes`] view (over an mmap, a store read buffer or
//! a Vec), never converted on load: kernels widen them to f32 as they stream through.

use std::sync::Arc;

pub(crate) use crate::bytes::SharedBytes;
use crate::dtype::WeightDType;
use crate::formats;
pub(crate) use crate::formats::RowView;

/// Errors building a weight from raw bytes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WeightError {
    #[error("weight {name}: {message}")]
    Layout { name: String, message: String },
}

/// How a weight's values are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    /// Plain f32 / f16 / bf16 elements.
    Dense(WeightDType),
    /// fp8 e4m3fn codes with one f32 scale per `block_rows x block_cols` block
    /// (DeepSeek-V3 `weight_scale_inv`; edge blocks may be ragged).
    Fp8Block { block_rows: usize, block_cols: usize },
    /// OCP MX fp4 e2m1 codes (two per byte) with one e8m0 scale per 32 columns.
    Mxfp4,
    /// Signed int4 (pack-quantized, 8 per i32) with one scale per `group` columns.
    Int4Group { group: usize },
}

impl std::fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WeightFormat::Dense(d) => write!(f, "{d}"),
            WeightFormat::Fp8Block { block_rows, block_cols } => write!(f, "fp8-e4m3[{block_rows}x{block_cols}]"),
            WeightFormat::Mxfp4 => write!(f, "mxfp4"),
            WeightFormat::Int4Group { group } => write!(f, "int4[g{group}]"),
        }
    }
}

/// A weight's storage, resolved: row views in a few index computations
/// (kernels take one per register block of rows).
#[derive(Debug, Clone, Copy)]
pub struct WeightRows<'a> {
    format: WeightFormat,
    /// Dense values, fp8 codes, mxfp4 blocks or int4 words.
    data: &'a [u8],
    /// fp8 and int4 scales.
    scales_f32: &'a [f32],
    /// mxfp4 e8m0 scales.
    scales_u8: &'a [u8],
    /// Bytes of `data` per row.
    stride: usize,
    /// fp8 scales per block-row, int4 scales per row.
    scales_per_row: usize,
}

impl<'a> WeightRows<'a> {
    /// The stored bytes (and scales) of row `r`.
    ///
    /// # Panics
    /// If `r` is not a row of the weight.
    #[inline(always)]
    pub fn row(&self, r: usize) -> RowView<'a> {
        let (bytes, per) = (self.row_bytes(r), self.scales_per_row);
        match self.format {
            WeightFormat::Dense(dtype) => RowView::Dense { dtype, bytes },
            WeightFormat::Fp8Block { block_rows, block_cols } => {
                let block_row = r / block_rows;
                RowView::Fp8 {
                    codes: bytes,
                    scales: &self.scales_f32[block_row * per..(block_row + 1) * per],
                    block_cols,
                    lead: 0,
                }
            }
            WeightFormat::Mxfp4 => RowView::Mxfp4 {
                blocks: bytes,
                scales: &self.scales_u8[r * per..(r + 1) * per],
            },
            WeightFormat::Int4Group { group } => RowView::Int4 {
                packed: bytes,
                scales: &self.scales_f32[r * per..(r + 1) * per],
                group,
                lead: 0,
            },
        }
    }

    /// Bytes from a stored row to the next (the same for every row).
    pub(crate) fn stride(&self) -> usize {
        self.stride
    }

    /// The stored bytes of row `r` without its scales (dense values, fp8
    /// codes, mxfp4 blocks or int4 words): what [`row`](Self::row) puts in
    /// its view, for callers that need no view.
    ///
    /// # Panics
    /// If `r` is not a row of the weight.
    #[inline(always)]
    pub(crate) fn row_bytes(&self, r: usize) -> &'a [u8] {
        &self.data[r * self.stride..(r + 1) * self.stride]
    }
}

#[derive(Debug, Clone)]
enum Storage {
    Dense(SharedBytes),
    Fp8 { codes: SharedBytes, scales: Arc<[f32]> },
    Mxfp4 { blocks: SharedBytes, scales: SharedBytes },
    Int4 { packed: SharedBytes, scales: Arc<[f32]> },
}

/// A `rows x cols` weight (`rows` = output features, `cols` = input features,
/// the layout of a torch `nn.Linear.weight`), in its shipped format.
#[derive(Debug, Clone)]
pub struct WeightMatrix {
    format: WeightFormat,
    rows: usize,
    cols: usize,
    storage: Storage,
}

fn size_error(name: &str, what: &str, len: usize, want: Option<usize>, rows: usize, cols: usize, format: WeightFormat) -> WeightError {
    WeightError::Layout {
        name: name.to_string(),
        message: match want {
            Some(w) => format!("{what}: {len} bytes/values, {rows}x{cols} {format} needs {w}"),
            None => format!("{what}: {rows}x{cols} overflows"),
        },
    }
}

impl WeightMatrix {
    /// A dense weight: checks that `bytes` holds exactly `rows x cols` values of `dtype`.
    pub fn new(name: &str, dtype: WeightDType, rows: usize, cols: usize, bytes: SharedBytes) -> Result<Self, WeightError> {
        let format = WeightFormat::Dense(dtype);
        let want = rows.checked_mul(cols).and_then(|n| n.checked_mul(dtype.size()));
        if want != Some(bytes.len()) {
            return Err(size_error(name, "data", bytes.len(), want, rows, cols, format));
        }
        Ok(WeightMatrix {
            format,
            rows,
            cols,
            storage: Storage::Dense(bytes),
        })
    }

    /// fp8 e4m3fn codes `[rows, cols]` with f32 scales
    /// `[ceil(rows / block_rows), ceil(cols / block_cols)]` (row-major).
    pub fn fp8_block(
        name: &str,
        rows: usize,
        cols: usize,
        codes: SharedBytes,
        scales: Vec<f32>,
        block_rows: usize,
        block_cols: usize,
    ) -> Result<Self, WeightError> {
        let format = WeightFormat::Fp8Block { block_rows, block_cols };
        if block_rows == 0 || block_cols == 0 {
            return Err(WeightError::Layout {
                name: name.into(),
                message: "fp8 block size must be positive".into(),
            });
        }
        let want = rows.checked_mul(cols);
        if want != Some(codes.len()) {
            return Err(size_error(name, "fp8 codes", codes.len(), want, rows, cols, format));
        }
        let nscales = rows.div_ceil(block_rows) * cols.div_ceil(block_cols);
        if scales.len() != nscales {
            return Err(size_error(name, "fp8 scales", scales.len(), Some(nscales), rows, cols, format));
        }
        Ok(WeightMatrix {
            format,
            rows,
            cols,
            storage: Storage::Fp8 {
                codes,
                scales: scales.into(),
            },
        })
    }

    /// mxfp4: `blocks` `[rows, cols / 32, 16]` bytes, `scales` `[rows, cols / 32]` e8m0 bytes.
    pub fn mxfp4(name: &str, rows: usize, cols: usize, blocks: SharedBytes, scales: SharedBytes) -> Result<Self, WeightError> {
        let format = WeightFormat::Mxfp4;
        if !cols.is_multiple_of(32) {
            return Err(WeightError::Layout {
                name: name.into(),
                message: format!("mxfp4 needs columns in multiples of 32, got {cols}"),
            });
        }
        let want = rows.checked_mul(cols / 2);
        if want != Some(blocks.len()) {
            return Err(size_error(name, "mxfp4 blocks", blocks.len(), want, rows, cols, format));
        }
        let want = rows.checked_mul(cols / 32);
        if want != Some(scales.len()) {
            return Err(size_error(name, "mxfp4 scales", scales.len(), want, rows, cols, format));
        }
        Ok(WeightMatrix {
            format,
            rows,
            cols,
            storage: Storage::Mxfp4 { blocks, scales },
        })
    }

    /// Pack-quantized int4: `packed` `[rows, cols / 8]` little-endian i32,
    /// `scales` `[rows, cols / group]` f32.
    pub fn int4_group(
        name: &str,
        rows: usize,
        cols: usize,
        packed: SharedBytes,
        scales: Vec<f32>,
        group: usize,
    ) -> Result<Self, WeightError> {
        let format = WeightFormat::Int4Group { group };
        if group == 0 || !group.is_multiple_of(8) || !cols.is_multiple_of(group) {
            return Err(WeightError::Layout {
                name: name.into(),
                message: format!("int4 needs a group size that is a multiple of 8 ({group}) and divides the columns ({cols})"),
            });
        }
        let want = rows.checked_mul(cols / 2);
        if want != Some(packed.len()) {
            return Err(size_error(name, "int4 packed", packed.len(), want, rows, cols, format));
        }
        let want = rows * (cols / group);
        if want != scales.len() {
            return Err(size_error(name, "int4 scales", scales.len(), Some(want), rows, cols, format));
        }
        Ok(WeightMatrix {
            format,
            rows,
            cols,
            storage: Storage::Int4 {
                packed,
                scales: scales.into(),
            },
        })
    }

    /// Builds a dense weight by encoding f32 values (tests and synthetic tools).
    pub fn from_f32(dtype: WeightDType, rows: usize, cols: usize, values: &[f32]) -> Self {
        assert_eq!(values.len(), rows * cols);
        WeightMatrix {
            format: WeightFormat::Dense(dtype),
            rows,
            cols,
            storage: Storage::Dense(SharedBytes::from_vec(crate::dtype::encode(dtype, values))),
        }
    }

    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// The element dtype of a dense weight (`None` for quantized formats).
    pub fn dense_dtype(&self) -> Option<WeightDType> {
        match self.format {
            WeightFormat::Dense(d) => Some(d),
            _ => None,
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes the weight occupies (codes plus scales).
    pub fn byte_len(&self) -> usize {
        match &self.storage {
            Storage::Dense(b) => b.len(),
            Storage::Fp8 { codes, scales } => codes.len() + scales.len() * 4,
            Storage::Mxfp4 { blocks, scales } => blocks.len() + scales.len(),
            Storage::Int4 { packed, scales } => packed.len() + scales.len() * 4,
        }
    }

    /// The stored bytes (and scales) of row `r`.
    pub fn row_view(&self, r: usize) -> RowView<'_> {
        self.rows_source().row(r)
    }

    /// The storage resolved once, for taking many rows' views cheaply.
    pub(crate) fn rows_source(&self) -> WeightRows<'_> {
        let (data, scales_f32, scales_u8): (&[u8], &[f32], &[u8]) = match &self.storage {
            Storage::Dense(b) => (b.as_slice(), &[], &[]),
            Storage::Fp8 { codes, scales } => (codes.as_slice(), scales, &[]),
            Storage::Mxfp4 { blocks, scales } => (blocks.as_slice(), &[], scales.as_slice()),
            Storage::Int4 { packed, scales } => (packed.as_slice(), scales, &[]),
        };
        let c = self.cols;
        let (stride, scales_per_row) = match self.format {
            WeightFormat::Dense(dtype) => (c * dtype.size(), 0),
            WeightFormat::Fp8Block { block_cols, .. } => (c, c.div_ceil(block_cols)),
            WeightFormat::Mxfp4 => (c / 2, c / formats::MXFP4_BLOCK),
            WeightFormat::Int4Group { group } => (c / 2, c / group),
        };
        WeightRows {
            format: self.format,
            data,
            scales_f32,
            scales_u8,
            stride,
            scales_per_row,
        }
    }

    /// Decodes row `r` into `out` (length `cols`), exactly.
    pub fn decode_row(&self, r: usize, out: &mut [f32]) {
        formats::decode_row(self.row_view(r), out);
    }

    /// Decodes the whole matrix (tests and reference paths).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.rows * self.cols];
        let rows = self.rows_source();
        for (r, row) in out.chunks_exact_mut(self.cols.max(1)).enumerate().take(self.rows) {
            formats::decode_row(rows.row(r), row);
        }
        out
    }
}
