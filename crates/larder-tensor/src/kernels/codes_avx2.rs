//! The in-register decoders of the quantized formats on AVX2, one set per
//! format, shared by the fused dot products ([`super::quant_avx2`]) and the
//! exact row decoder ([`decode_row`], which the AVX-512 path uses too).
//!
//! Each format has one mapping from code bits to f32 bits, written once,
//! in the forms the kernels load codes in (8 codes in column order; whole
//! 32- or 64-column groups in the permuted order `quant_avx2::prescale`
//! stores activations in):
//!
//! - **fp8 e4m3fn**: value x 2^-8 ([`FP8_CODE_EXP`]), through f16: a code's
//!   bits placed in an f16 (sign, the exponent's low four bits, the
//!   mantissa's top three) are the value x 2^-8, fp8 subnormals becoming f16
//!   subnormals, and F16C widens them exactly to normal f32: [`fp8_scaled`]
//!   (8 codes), [`fp8_bytes`] (a 32-column group). NaN codes come out
//!   finite; [`fp8_nan_lanes`] finds them.
//! - **mxfp4 e2m1**: value x 2 ([`E2M1_CODE_EXP`]), an integer: a byte
//!   shuffle of the nibble through [`e2m1_times_2`], sign-extended and
//!   converted: [`e2m1_from_top`] on a nibble at a 32-bit lane's top, by
//!   [`e2m1_8`] (8 codes), [`e2m1_nibble`] (a 32-column group);
//!   [`e2m1_pair`] shuffles all 64 nibbles of a 64-column group at once.
//!   e8m0 scales: [`E8M0`] (0xFF is NaN).
//!
//! No form ever holds an f32 subnormal: without DAZ, an FMA or multiply
//! with a subnormal operand takes a microcode assist (measured on the
//! Intel Xeon, family 6 model 167, of bench/results/2026-12-02-kernels-4bit.md:
//! 36 ns against 1.4 ns per FMA), which made fused kernels that decoded fp8
//! and e2m1 codes to subnormal-range f32 (value x 2^-120 and x 2^-126)
//! 35-100x slower than their roofs there. Results are the same
//! bits either way: the codes are only scaled by a different power of two,
//! which [`super::quant_avx2::prescale`]'s unscaling undoes exactly.
//! - **int4** (offset 8): the integer value: [`nibbles8`] / [`nibbles32`]
//!   (column order, through [`int4_values`]), [`int4_nibble`] (a 32-column
//!   group), [`int4_flipped`] and [`int4_lane`] (a 64-column group).
//!
//! The row decoder multiplies the fused forms back by their power of two
//! (exact) and then by the scale, so it is bit-identical to
//! [`formats::decode_row`] (NaN codes give one NaN, as before).

use std::arch::x86_64::*;

use crate::formats;
use crate::weight::RowView;

/// fp8 codes decode to value x 2^-`FP8_CODE_EXP` ([`fp8_scaled`], [`fp8_bytes`]).
pub(crate) const FP8_CODE_EXP: i32 = 8;
/// e2m1 codes decode to value x 2^-`E2M1_CODE_EXP` ([`e2m1_from_top`]).
pub(crate) const E2M1_CODE_EXP: i32 = -1;

/// The bits the row decoder gives a NaN fp8 code (those it always gave:
/// an all-ones f16 widened).
const FP8_NAN_BITS: u32 = 0xffff_e000;

// ---- fp8 e4m3fn ----

/// The f16 of value x 2^-8 of the fp8 code at the top byte of every 16-bit
/// word: shifted right arithmetically by 1, the code's exponent sits at f16
/// bits 10..13, its mantissa at 7..9 and its sign at 15 (the mask clears
/// the sign's copy at 14 and the low byte).
#[inline(always)]
unsafe fn fp8_f16_words(top: __m256i) -> __m256i {
    _mm256_and_si256(_mm256_srai_epi16::<1>(top), _mm256_set1_epi16(0xbf80u16 as i16))
}

/// The low 8 fp8 e4m3 codes of `codes` as f32 of value x 2^-8, in order
/// (as [`fp8_f16_words`] does it, widened by F16C).
#[inline(always)]
pub(crate) unsafe fn fp8_scaled(codes: __m128i) -> __m256 {
    let top = _mm_slli_epi16::<8>(_mm_cvtepu8_epi16(codes));
    _mm256_cvtph_ps(_mm_and_si128(_mm_srai_epi16::<1>(top), _mm_set1_epi16(0xbf80u16 as i16)))
}

/// The 32 fp8 codes of a 32-column group (column `c` in byte `c`) as four
/// vectors of f32 of value x 2^-8, as [`fp8_scaled`] gives them: vector `j`
/// lane `d` holds column `16 (j / 2) + 2 d + j % 2` (the order
/// `quant_avx2::prescale` stores fp8 groups in). Even bytes move to the top
/// of their 16-bit word, odd bytes are there already; both become f16 words
/// ([`fp8_f16_words`]), and each 128-bit half of words widens as it is (no
/// reordering step: the activations carry the order instead).
#[inline(always)]
pub(crate) unsafe fn fp8_bytes(codes: __m256i) -> [__m256; 4] {
    let words = fp8_words(codes);
    [fp8_lane(&words, 0), fp8_lane(&words, 1), fp8_lane(&words, 2), fp8_lane(&words, 3)]
}

/// [`fp8_bytes`] in two steps, for kernels that widen each vector just
/// before using it: the f16 words of the even bytes and of the odd bytes,
/// then vector `j` (0..4) of them ([`fp8_lane`]).
#[inline(always)]
pub(crate) unsafe fn fp8_words(codes: __m256i) -> [__m256i; 2] {
    [fp8_f16_words(_mm256_slli_epi16::<8>(codes)), fp8_f16_words(codes)]
}

/// Vector `j` (0..4) of [`fp8_bytes`], from [`fp8_words`]: the low (`j <
/// 2`) or high 128 bits of the even (`j` even) or odd bytes' words, widened.
#[inline(always)]
pub(crate) unsafe fn fp8_lane(words: &[__m256i; 2], j: usize) -> __m256 {
    let w = words[j % 2];
    if j < 2 {
        _mm256_cvtph_ps(_mm256_castsi256_si128(w))
    } else {
        _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(w))
    }
}

/// All-ones lanes where the low 8 fp8 codes of `codes` are NaN (0x7f, 0xff).
#[inline(always)]
pub(crate) unsafe fn fp8_nan_lanes(codes: __m128i) -> __m256i {
    let mag = _mm256_and_si256(_mm256_cvtepu8_epi32(codes), _mm256_set1_epi32(0x7f));
    _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7f))
}

/// 8 fp8 codes at `p` times `scale`, as [`formats::decode_row`] decodes them.
#[inline(always)]
unsafe fn fp8_8(p: *const u8, scale: __m256) -> __m256 {
    let codes = _mm_loadl_epi64(p as *const __m128i);
    let value = _mm256_mul_ps(fp8_scaled(codes), _mm256_set1_ps(pow2(FP8_CODE_EXP)));
    let nan = _mm256_castsi256_ps(fp8_nan_lanes(codes));
    let value = _mm256_blendv_ps(value, _mm256_set1_ps(f32::from_bits(FP8_NAN_BITS)), nan);
    _mm256_mul_ps(value, scale)
}

// ---- mxfp4: e2m1 codes, e8m0 scales ----

/// Every e8m0 scale's value ([`crate::formats::e8m0_to_f32`]), by code.
pub(crate) static E8M0: [f32; 256] = {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = match i {
            0 => f32::from_bits(1 << 22),
            255 => f32::NAN,
            _ => f32::from_bits((i as u32) << 23),
        };
        i += 1;
    }
    t
};

/// Twice every e2m1 value, by code (an integer; code 8, negative zero,
/// gives 0), as a byte-shuffle table for both 128-bit halves.
#[inline(always)]
unsafe fn e2m1_times_2() -> __m256i {
    _mm256_setr_epi8(
        0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12, 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
    )
}

/// Twice the e2m1 values (see [`e2m1_times_2`]) as f32, `N` picking byte
/// `N` of every 32-bit lane of `bytes` (shuffled values), sign-extended.
#[inline(always)]
unsafe fn byte_to_f32<const N: i32>(bytes: __m256i) -> __m256 {
    let top = match N {
        0 => _mm256_slli_epi32::<24>(bytes),
        1 => _mm256_slli_epi32::<16>(bytes),
        2 => _mm256_slli_epi32::<8>(bytes),
        _ => bytes,
    };
    _mm256_cvtepi32_ps(_mm256_srai_epi32::<24>(top))
}

/// e2m1 codes at the top four bits of each 32-bit lane as f32 of value x 2:
/// the nibble shuffled through [`e2m1_times_2`], converted, and the sign
/// bit set again (code 8 is negative zero, as the definition decodes it).
#[inline(always)]
pub(crate) unsafe fn e2m1_from_top(top: __m256i) -> __m256 {
    let nibble = _mm256_srli_epi32::<28>(top);
    let value = byte_to_f32::<0>(_mm256_shuffle_epi8(e2m1_times_2(), nibble));
    let sign = _mm256_slli_epi32::<31>(_mm256_srli_epi32::<3>(nibble));
    _mm256_or_ps(value, _mm256_castsi256_ps(sign))
}

/// The 8 e2m1 codes of the little-endian 32-bit word at `p` (low nibble
/// first) as f32 of value x 2, in column order.
#[inline(always)]
pub(crate) unsafe fn e2m1_8(p: *const u8) -> __m256 {
    let word = _mm256_set1_epi32((p as *const i32).read_unaligned());
    e2m1_from_top(_mm256_sllv_epi32(word, _mm256_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0)))
}

/// 8 mxfp4 codes at `p` times `scale`, as [`formats::decode_row`] decodes them.
#[inline(always)]
unsafe fn mxfp4_8(p: *const u8, scale: __m256) -> __m256 {
    _mm256_mul_ps(_mm256_mul_ps(e2m1_8(p), _mm256_set1_ps(pow2(E2M1_CODE_EXP))), scale)
}

/// mxfp4 code `N` of every 16-bit word (one per 32-bit lane: columns
/// `4d + N`) as f32 of value x 2 ([`e2m1_from_top`]).
#[inline(always)]
pub(crate) unsafe fn e2m1_nibble<const N: i32>(words: __m256i) -> __m256 {
    e2m1_from_top(nibble_to_top::<N>(words))
}

/// The 64 mxfp4 codes of a 64-column group (32 bytes: 8 codes per 32-bit
/// lane, lane `d` holding columns `8d..8d + 8`), the first of two steps to
/// eight vectors of f32 of value x 2, vector `N` holding code `N` of every
/// lane (columns `8d + N`, the order `quant_avx2::prescale` stores such
/// groups in): low and high nibbles each take one byte shuffle through
/// [`e2m1_times_2`] (code `2j` and `2j + 1` are byte `j`'s). The second
/// step, [`e2m1_lane`], sign-extends and converts one byte of every lane,
/// just before the kernel uses it (two registers live, not eight).
/// Negative zero comes out as zero (the same in any sum).
#[inline(always)]
pub(crate) unsafe fn e2m1_pair(codes: __m256i) -> [__m256i; 2] {
    let low_nibbles = _mm256_set1_epi8(0x0f);
    let table = e2m1_times_2();
    [
        _mm256_shuffle_epi8(table, _mm256_and_si256(codes, low_nibbles)),
        _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16::<4>(codes), low_nibbles)),
    ]
}

/// Vector `j` (0..8) of a 64-column mxfp4 group, from [`e2m1_pair`].
#[inline(always)]
pub(crate) unsafe fn e2m1_lane(pair: &[__m256i; 2], j: usize) -> __m256 {
    let v = pair[j % 2];
    match j / 2 {
        0 => byte_to_f32::<0>(v),
        1 => byte_to_f32::<1>(v),
        2 => byte_to_f32::<2>(v),
        _ => byte_to_f32::<3>(v),
    }
}

// ---- int4 pack-quantized (offset 8) ----

/// int4 values by nibble (`nibble - 8`), the byte-shuffle table of
/// [`nibbles8`] and [`nibbles32`].
#[inline(always)]
pub(crate) unsafe fn int4_values() -> __m128i {
    _mm_setr_epi8(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7)
}

/// 8 int4 codes at `p` times `scale`, as [`formats::decode_row`] decodes them.
#[inline(always)]
unsafe fn int4_8(p: *const u8, scale: __m256) -> __m256 {
    _mm256_mul_ps(nibbles8(p, int4_values()), scale)
}

/// 32 nibbles (16 bytes, low nibble first) looked up in `lut` and widened to
/// f32, in column order.
#[inline(always)]
pub(crate) unsafe fn nibbles32(p: *const u8, lut: __m128i) -> [__m256; 4] {
    let b = _mm_loadu_si128(p as *const __m128i);
    let mask = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(b, mask);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), mask);
    let v0 = _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(lo, hi));
    let v1 = _mm_shuffle_epi8(lut, _mm_unpackhi_epi8(lo, hi));
    let widen = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
    [
        widen(v0),
        widen(_mm_unpackhi_epi64(v0, v0)),
        widen(v1),
        widen(_mm_unpackhi_epi64(v1, v1)),
    ]
}

/// 8 nibbles (4 bytes) as [`nibbles32`] does.
#[inline(always)]
pub(crate) unsafe fn nibbles8(p: *const u8, lut: __m128i) -> __m256 {
    let b = _mm_cvtsi32_si128((p as *const i32).read_unaligned());
    let mask = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(b, mask);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), mask);
    let v = _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(lo, hi));
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
}

/// int4 code `N` of every 16-bit word (columns `4d + N`) as f32 of its value
/// (the nibble minus 8): `words` come with every nibble's top bit flipped,
/// which makes the nibble the 4-bit two's complement of that value; shifted
/// to the lane's top bits and right arithmetically by 28, it is sign-extended.
#[inline(always)]
pub(crate) unsafe fn int4_nibble<const N: i32>(words: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_srai_epi32::<28>(nibble_to_top::<N>(words)))
}

/// The 64 int4 codes of a 64-column group (32 bytes, 8 codes per 32-bit
/// lane), the first of two steps to eight vectors of f32 of their values,
/// vector `N` holding code `N` of every lane, as [`e2m1_pair`] orders them:
/// every nibble's top bit flipped, which makes a nibble the 4-bit two's
/// complement of its value. In [`int4_lane`] a 16-bit shift pair
/// sign-extends codes `N` and `N + 4` at once into the low and high words,
/// and 32-bit shifts take one word's value out.
#[inline(always)]
pub(crate) unsafe fn int4_flipped(codes: __m256i) -> __m256i {
    _mm256_xor_si256(codes, _mm256_set1_epi32(0x8888_8888u32 as i32))
}

/// Vector `j` (0..8) of a 64-column int4 group, from [`int4_flipped`].
#[inline(always)]
pub(crate) unsafe fn int4_lane(flipped: __m256i, j: usize) -> __m256 {
    let t = match j % 4 {
        0 => _mm256_srai_epi16::<12>(_mm256_slli_epi16::<12>(flipped)),
        1 => _mm256_srai_epi16::<12>(_mm256_slli_epi16::<8>(flipped)),
        2 => _mm256_srai_epi16::<12>(_mm256_slli_epi16::<4>(flipped)),
        _ => _mm256_srai_epi16::<12>(flipped),
    };
    if j < 4 {
        _mm256_cvtepi32_ps(_mm256_srai_epi32::<16>(_mm256_slli_epi32::<16>(t)))
    } else {
        _mm256_cvtepi32_ps(_mm256_srai_epi32::<16>(t))
    }
}

/// Nibble `N` of the 16-bit word in every 32-bit lane, moved to the lane's
/// top four bits.
#[inline(always)]
pub(crate) unsafe fn nibble_to_top<const N: i32>(words: __m256i) -> __m256i {
    match N {
        0 => _mm256_slli_epi32::<28>(words),
        1 => _mm256_slli_epi32::<24>(words),
        2 => _mm256_slli_epi32::<20>(words),
        _ => _mm256_slli_epi32::<16>(words),
    }
}

// ---- rows ----

/// Decodes a quantized row into `out` with the decoders above, bit-identical
/// to [`formats::decode_row`]; returns `false` for dense rows (left to the
/// dense widening).
///
/// # Safety
/// The CPU must support AVX2 and F16C; `out` must have the row's length.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn decode_row(view: RowView<'_>, out: &mut [f32]) -> bool {
    match view {
        RowView::Fp8 {
            codes,
            scales,
            block_cols,
            lead,
        } => {
            for (start, len, s) in formats::segments(codes.len(), lead, block_cols) {
                decode_fp8_block(&codes[start..start + len], scales[s], &mut out[start..start + len]);
            }
            true
        }
        RowView::Mxfp4 { blocks, scales } => {
            for ((o, b), &e) in out.chunks_mut(32).zip(blocks.chunks(16)).zip(scales) {
                let scale = _mm256_set1_ps(E8M0[e as usize]);
                for (eight, word) in o.chunks_exact_mut(8).zip(b.chunks_exact(4)) {
                    _mm256_storeu_ps(eight.as_mut_ptr(), mxfp4_8(word.as_ptr(), scale));
                }
            }
            true
        }
        RowView::Int4 {
            packed,
            scales,
            group,
            lead,
        } => {
            for (start, len, s) in formats::segments(out.len(), lead, group) {
                let scale = _mm256_set1_ps(scales[s]);
                let words = &packed[start / 2..(start + len) / 2];
                for (eight, word) in out[start..start + len].chunks_exact_mut(8).zip(words.chunks_exact(4)) {
                    _mm256_storeu_ps(eight.as_mut_ptr(), int4_8(word.as_ptr(), scale));
                }
            }
            true
        }
        RowView::Dense { .. } => false,
    }
}

/// One fp8 block (8 codes at a time, the last `< 8` from the scalar table).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_fp8_block(codes: &[u8], scale: f32, out: &mut [f32]) {
    let s = _mm256_set1_ps(scale);
    let mut i = 0;
    while i + 8 <= codes.len() {
        _mm256_storeu_ps(out.as_mut_ptr().add(i), fp8_8(codes.as_ptr().add(i), s));
        i += 8;
    }
    let lut = formats::fp8_e4m3_table();
    for j in i..codes.len() {
        out[j] = lut[codes[j] as usize] * scale;
    }
}

/// 2^e for -126 <= e <= 127.
pub(crate) fn pow2(e: i32) -> f32 {
    f32::from_bits(((127 + e) as u32) << 23)
}

#[cfg(test)]
mod tests {
    #[test]
    fn e8m0_table_matches_the_decoder() {
        for code in 0..=255u8 {
            let (table, decoded) = (super::E8M0[code as usize], crate::formats::e8m0_to_f32(code));
            assert!(
                table.to_bits() == decoded.to_bits() || (table.is_nan() && decoded.is_nan()),
                "code {code}"
            );
        }
    }
}
