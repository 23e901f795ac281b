//! AVX2 + FMA + F16C: the [`Simd`] operations for 8-lane vectors (the
//! shared register-blocked loop is in [`super::blocked`]), and exact SIMD
//! decoders of quantized rows into f32 (also used by the AVX-512 path; the
//! fused quantized dot products are in [`super::quant_avx2`]).

use std::arch::x86_64::*;

use super::blocked::{self, kind, Simd, BF16, F16, F32};
use crate::dtype::WeightDType;
use crate::formats;
use crate::weight::RowView;

/// Elements per main-loop step (bf16: two steps, see [`blocked::step`]).
pub const STEP: usize = 8;
/// f32 accumulator slots per (row, feature).
pub const ACC: usize = 8;

/// 8-lane AVX2 vectors.
pub(crate) struct Avx2;

impl Simd for Avx2 {
    type V = __m256;
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        _mm256_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn load_w<const KIND: u8>(w: *const u8, i: usize) -> __m256 {
        match KIND {
            F32 => _mm256_loadu_ps(w.add(i * 4) as *const f32),
            F16 => _mm256_cvtph_ps(_mm_loadu_si128(w.add(i * 2) as *const __m128i)),
            _ => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(
                w.add(i * 2) as *const __m128i
            )))),
        }
    }
    #[inline(always)]
    unsafe fn load_bf16_pairs(w: *const u8, i: usize) -> [__m256; 2] {
        let pairs = _mm256_loadu_si256(w.add(i * 2) as *const __m256i);
        [
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(pairs)),
            _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(0xffff_0000u32 as i32))),
        ]
    }
    /// Pairwise: 8 -> 4 -> 2 -> 1 lanes.
    #[inline(always)]
    unsafe fn sum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps::<1>(v);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
        _mm_cvtss_f32(s)
    }
}

/// See [`blocked::accumulate`] (`len` a multiple of [`blocked::step`], `ws.len() <= 4`).
///
/// # Safety
/// AVX2, FMA and F16C must be available; sizes as in [`blocked::accumulate`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn accumulate(dtype: WeightDType, ws: &[&[u8]], ahead: isize, xs: &[&[f32]], len: usize, acc: &mut [f32]) {
    match kind(dtype) {
        F32 => blocked::accumulate::<Avx2, F32>(ws, ahead, xs, len, acc),
        F16 => blocked::accumulate::<Avx2, F16>(ws, ahead, xs, len, acc),
        _ => blocked::accumulate::<Avx2, BF16>(ws, ahead, xs, len, acc),
    }
}

/// 8 fp8 e4m3 codes as f16 bit patterns of value / 256 (exact; NaN codes NaN).
///
/// Sign-extending each code to 16 bits and shifting left by 7 puts the
/// 7 magnitude bits at f16 bits 7..13 (exponent and mantissa, both formats
/// having the same layout below the exponent's top bit) and the sign at bit
/// 15; bit 14 (also the sign) is cleared. Magnitude 0x7f (NaN in e4m3fn)
/// becomes all ones, an f16 NaN.
#[inline(always)]
unsafe fn fp8_to_f16(p: *const u8) -> __m128i {
    let c = _mm_slli_epi16::<7>(_mm_cvtepi8_epi16(_mm_loadl_epi64(p as *const __m128i)));
    let h = _mm_and_si128(c, _mm_set1_epi16(0xbf80u16 as i16));
    let mag = _mm_and_si128(h, _mm_set1_epi16(0x3f80));
    _mm_or_si128(h, _mm_cmpeq_epi16(mag, _mm_set1_epi16(0x3f80)))
}

/// The 8 nibbles of a little-endian 32-bit word, low first, as i32 lanes.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> __m256i {
    let w = (p as *const i32).read_unaligned();
    let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w), shifts), _mm256_set1_epi32(0x0f))
}

/// 8 mxfp4 codes (one 32-bit word) times `scale`, exactly as [`formats`] decodes them.
#[inline(always)]
unsafe fn mxfp4_8(p: *const u8, scale: __m256) -> __m256 {
    let n = nibbles(p);
    let lut = _mm256_setr_ps(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
    let mag = _mm256_permutevar8x32_ps(lut, n);
    let sign = _mm256_slli_epi32::<28>(_mm256_and_si256(n, _mm256_set1_epi32(8)));
    _mm256_mul_ps(_mm256_xor_ps(mag, _mm256_castsi256_ps(sign)), scale)
}

/// 8 offset int4 codes (one 32-bit word) times `scale`, exactly as [`formats`] decodes them.
#[inline(always)]
unsafe fn int4_8(p: *const u8, scale: __m256) -> __m256 {
    let n = nibbles(p);
    _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(n, _mm256_set1_epi32(8))), scale)
}

/// See [`blocked::finish`].
///
/// # Safety
/// As [`accumulate`], with `w` holding fewer than [`blocked::step`] elements.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn finish(dtype: WeightDType, w: &[u8], xs: &[&[f32]], acc: &[f32], out: &mut [f32]) {
    blocked::finish::<Avx2>(dtype, w, xs, acc, out)
}

/// See [`blocked::reduce`].
///
/// # Safety
/// As [`accumulate`]; `acc` holds `out.len() * ACC` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn reduce(acc: &[f32], out: &mut [f32]) {
    blocked::reduce::<Avx2>(acc, out)
}

/// Decodes a quantized row into `out` with AVX2, bit-identical to
/// [`crate::formats::decode_row`]; returns `false` for formats it leaves to
/// the scalar decoder.
///
/// # Safety
/// The CPU must support AVX2 and F16C; `out` must have the row's length.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn decode(view: RowView<'_>, out: &mut [f32]) -> bool {
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
                let scale = _mm256_set1_ps(formats::e8m0_to_f32(e));
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

/// One fp8 block: e4m3 codes become f16 bit patterns (value / 256, exact,
/// NaN codes kept NaN), widened by F16C, times 256 (exact), times the scale.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_fp8_block(codes: &[u8], scale: f32, out: &mut [f32]) {
    let s = _mm256_set1_ps(scale);
    let k256 = _mm256_set1_ps(256.0);
    let mut i = 0;
    while i + 8 <= codes.len() {
        let v = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtph_ps(fp8_to_f16(codes.as_ptr().add(i))), k256), s);
        _mm256_storeu_ps(out.as_mut_ptr().add(i), v);
        i += 8;
    }
    let lut = formats::fp8_e4m3_table();
    for j in i..codes.len() {
        out[j] = lut[codes[j] as usize] * scale;
    }
}
