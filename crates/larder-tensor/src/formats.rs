//! The stored form of one weight row in each format checkpoints ship
//! ([`RowView`], borrowed; [`WeightMatrix`](crate::WeightMatrix) hands them out) and the exact
//! element decoders of the quantized ones: every code maps to the f32 value
//! the format defines, and a weight is that value times its block scale
//! computed in f32 (as the reference implementations dequantize).
//!
//! - **fp8 e4m3fn** (DeepSeek-V3 / Kimi-K2): 1 sign, 4 exponent (bias 7),
//!   3 mantissa bits; no infinities; `0x7f`/`0xff` are NaN; max 448.
//! - **fp4 e2m1** (OCP MX, gpt-oss `mxfp4`): 1 sign, 2 exponent, 1 mantissa
//!   bits; 16 codes; scales are **e8m0** (a power of two `2^(s-127)`, `0xff` NaN).
//! - **int4** (compressed-tensors `pack-quantized`): 8 signed 4-bit values per
//!   little-endian i32, stored offset by 8 (`q = nibble - 8`), lowest nibble first.

use std::sync::OnceLock;

use crate::dtype::WeightDType;

/// The stored form of one weight row, borrowed.
#[derive(Debug, Clone, Copy)]
pub enum RowView<'a> {
    Dense {
        dtype: WeightDType,
        bytes: &'a [u8],
    },
    /// fp8 codes and the scales of this row's block-row (one per `block_cols`
    /// columns); the first `lead` columns of the first block are not in the view.
    Fp8 {
        codes: &'a [u8],
        scales: &'a [f32],
        block_cols: usize,
        lead: usize,
    },
    /// Two fp4 codes per byte (low nibble first) and one e8m0 scale per 32 columns.
    Mxfp4 {
        blocks: &'a [u8],
        scales: &'a [u8],
    },
    /// Little-endian i32 words of 8 offset int4 values, one scale per `group`
    /// columns; the first `lead` columns of the first group are not in the view.
    Int4 {
        packed: &'a [u8],
        scales: &'a [f32],
        group: usize,
        lead: usize,
    },
}

impl<'a> RowView<'a> {
    /// The columns `c0..c1` of this view. `c0` and `c1` must be multiples of 32
    /// (or `c1` the row's end); quantized views carry the offset into their
    /// first block.
    #[inline(always)]
    pub fn slice(self, c0: usize, c1: usize) -> RowView<'a> {
        match self {
            RowView::Dense { dtype, bytes } => RowView::Dense {
                dtype,
                bytes: &bytes[c0 * dtype.size()..c1 * dtype.size()],
            },
            RowView::Fp8 {
                codes,
                scales,
                block_cols,
                lead,
            } => {
                let (first, lead) = first_block(lead + c0, block_cols);
                RowView::Fp8 {
                    codes: &codes[c0..c1],
                    scales: &scales[first..],
                    block_cols,
                    lead,
                }
            }
            RowView::Mxfp4 { blocks, scales } => RowView::Mxfp4 {
                blocks: &blocks[c0 / 2..c1 / 2],
                scales: &scales[c0 / 32..c1.div_ceil(32)],
            },
            RowView::Int4 {
                packed,
                scales,
                group,
                lead,
            } => {
                let (first, lead) = first_block(lead + c0, group);
                RowView::Int4 {
                    packed: &packed[c0 / 2..c1 / 2],
                    scales: &scales[first..],
                    group,
                    lead,
                }
            }
        }
    }
}

/// The block holding column `start` and the columns before it in that block
/// (no division for the common start inside the first block).
#[inline(always)]
fn first_block(start: usize, block: usize) -> (usize, usize) {
    if start < block {
        (0, start)
    } else {
        (start / block, start % block)
    }
}

/// Decodes one stored row into `out` (the scalar reference of every format).
pub fn decode_row(view: RowView<'_>, out: &mut [f32]) {
    match view {
        RowView::Dense { dtype, bytes } => dtype.decode_into(bytes, out),
        RowView::Fp8 {
            codes,
            scales,
            block_cols,
            lead,
        } => {
            let lut = fp8_e4m3_table();
            for (start, len, s) in segments(codes.len(), lead, block_cols) {
                let scale = scales[s];
                for (o, &b) in out[start..start + len].iter_mut().zip(&codes[start..start + len]) {
                    *o = lut[b as usize] * scale;
                }
            }
        }
        RowView::Mxfp4 { blocks, scales } => decode_mxfp4_row(blocks, scales, out),
        RowView::Int4 {
            packed,
            scales,
            group,
            lead,
        } => {
            for (start, len, s) in segments(out.len(), lead, group) {
                decode_int4_words(&packed[start / 2..(start + len) / 2], scales[s], &mut out[start..start + len]);
            }
        }
    }
}

/// Splits `n` columns that start `lead` columns into a block of `block`
/// columns into `(start, len, block index)` runs sharing one scale.
pub(crate) fn segments(n: usize, lead: usize, block: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    let mut start = 0;
    let mut idx = 0;
    let mut room = block - lead;
    std::iter::from_fn(move || {
        if start >= n {
            return None;
        }
        let len = room.min(n - start);
        let seg = (start, len, idx);
        start += len;
        idx += 1;
        room = block;
        Some(seg)
    })
}

/// Decodes whole i32 words of offset int4 values sharing one scale.
pub(crate) fn decode_int4_words(packed: &[u8], scale: f32, out: &mut [f32]) {
    for (eight, word) in out.chunks_exact_mut(8).zip(packed.chunks_exact(4)) {
        let w = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        for (j, v) in eight.iter_mut().enumerate() {
            *v = (((w >> (4 * j)) & 0x0f) as i32 - 8) as f32 * scale;
        }
    }
}

/// f32 value of an fp8 e4m3fn code.
pub fn fp8_e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = (b >> 3) & 0x0f;
    let mant = (b & 0x07) as f32;
    if exp == 0x0f && b & 0x07 == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * mant * (2.0f32).powi(-9)
    } else {
        sign * (1.0 + mant / 8.0) * (2.0f32).powi(exp as i32 - 7)
    }
}

/// The 256-entry fp8 e4m3fn table.
pub(crate) fn fp8_e4m3_table() -> &'static [f32; 256] {
    static TABLE: OnceLock<[f32; 256]> = OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|i| fp8_e4m3_to_f32(i as u8)))
}

/// Elements per mxfp4 block (one e8m0 scale each).
pub(crate) const MXFP4_BLOCK: usize = 32;

/// The 16 fp4 e2m1 values, by code.
pub const FP4_E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// The f32 value of an e8m0 scale: `2^(s - 127)`; `0xff` is NaN.
pub fn e8m0_to_f32(s: u8) -> f32 {
    if s == 0xff {
        f32::NAN
    } else if s == 0 {
        // 2^-127 is subnormal in f32 but exactly representable.
        f32::from_bits(1 << 22)
    } else {
        f32::from_bits((s as u32) << 23)
    }
}

/// Decodes one row of mxfp4: `blocks` holds `cols / 2` bytes (two codes per
/// byte, low nibble first), `scales` one e8m0 byte per 32 columns.
pub(crate) fn decode_mxfp4_row(blocks: &[u8], scales: &[u8], out: &mut [f32]) {
    for ((o, b), &s) in out.chunks_mut(32).zip(blocks.chunks(16)).zip(scales) {
        let scale = e8m0_to_f32(s);
        for (pair, &byte) in o.chunks_mut(2).zip(b) {
            pair[0] = FP4_E2M1[(byte & 0x0f) as usize] * scale;
            pair[1] = FP4_E2M1[(byte >> 4) as usize] * scale;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_known_values() {
        assert_eq!(fp8_e4m3_to_f32(0x00), 0.0);
        assert_eq!(fp8_e4m3_to_f32(0x38), 1.0); // exp 7, mant 0
        assert_eq!(fp8_e4m3_to_f32(0x7e), 448.0); // max finite
        assert_eq!(fp8_e4m3_to_f32(0xfe), -448.0);
        assert_eq!(fp8_e4m3_to_f32(0x01), 2.0f32.powi(-9)); // min subnormal
        assert!(fp8_e4m3_to_f32(0x7f).is_nan());
        assert!(fp8_e4m3_to_f32(0xff).is_nan());
    }

    #[test]
    fn fp8_matches_f16_reinterpretation() {
        // e4m3 bits shifted into an f16 (bias 15) give the value times 2^-8.
        for b in 0..=255u8 {
            if b & 0x7f == 0x7f {
                continue;
            }
            let h = ((b as u16 & 0x80) << 8) | ((b as u16 & 0x7f) << 7);
            let via_f16 = half::f16::from_bits(h).to_f32() * 256.0;
            assert_eq!(via_f16.to_bits(), fp8_e4m3_to_f32(b).to_bits(), "code {b:#x}");
        }
    }

    #[test]
    fn e8m0_powers_of_two() {
        assert_eq!(e8m0_to_f32(127), 1.0);
        assert_eq!(e8m0_to_f32(128), 2.0);
        assert_eq!(e8m0_to_f32(120), 2.0f32.powi(-7));
        assert_eq!(e8m0_to_f32(0), 2.0f32.powi(-127));
        assert!(e8m0_to_f32(255).is_nan());
    }

    #[test]
    fn mxfp4_nibble_order() {
        let mut out = [0.0f32; 32];
        let mut blocks = [0u8; 16];
        blocks[0] = 0x72; // low nibble 2 (1.0) first, high nibble 7 (6.0) second
        decode_mxfp4_row(&blocks, &[128], &mut out);
        assert_eq!(&out[..3], &[2.0, 12.0, 0.0]);
    }

    #[test]
    fn int4_offset_and_order() {
        let word: u32 = 0x0000_00f0 | 0x8; // nibble0 = 8 -> 0, nibble1 = 15 -> 7, others 0 -> -8
        let mut out = [0.0f32; 8];
        decode_int4_words(&word.to_le_bytes(), 0.5, &mut out);
        assert_eq!(out, [0.0, 3.5, -4.0, -4.0, -4.0, -4.0, -4.0, -4.0]);
    }
}

#[cfg(test)]
mod definition_tests;

#[cfg(test)]
mod segment_tests {
    use super::segments;

    #[test]
    fn segments_follow_block_boundaries() {
        assert_eq!(segments(10, 0, 4).collect::<Vec<_>>(), vec![(0, 4, 0), (4, 4, 1), (8, 2, 2)]);
        assert_eq!(
            segments(10, 3, 4).collect::<Vec<_>>(),
            vec![(0, 1, 0), (1, 4, 1), (5, 4, 2), (9, 1, 3)]
        );
        assert_eq!(segments(0, 0, 4).count(), 0);
    }
}
