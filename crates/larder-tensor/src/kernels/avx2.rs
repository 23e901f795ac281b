//! AVX2 + FMA + F16C kernels: dot products of f32 activation rows with one
//! weight row (f32, f16 or bf16, widened in registers), accumulated chunk by
//! chunk, and SIMD decoders for the quantized formats.
//!
//! Reduction order per (row, feature), fixed: two 8-lane accumulators over
//! 16-element steps (kept in memory between chunks, so chunking does not
//! change the sequence); in [`finish`], a remaining 8-element step goes to the
//! first, a zero-padded tail (< 8) to the second, then `acc0 + acc1` and a
//! fixed pairwise horizontal sum. Up to four rows share each weight load; a
//! row's arithmetic is the same whichever rows it is grouped with.

use std::arch::x86_64::*;

use crate::dtype::WeightDType;
use crate::formats;
use crate::weight::RowView;

/// Elements per main-loop step.
pub const STEP: usize = 16;
/// f32 accumulator slots per (row, feature).
pub const ACC: usize = 16;

const F32: u8 = 0;
const F16: u8 = 1;
const BF16: u8 = 2;

fn kind(dtype: WeightDType) -> u8 {
    match dtype {
        WeightDType::F32 => F32,
        WeightDType::F16 => F16,
        WeightDType::BF16 => BF16,
    }
}

/// Adds `xs[r][..len] . w[..len]` into each row's accumulators (`acc[r * ACC..]`);
/// `len` is a multiple of [`STEP`].
///
/// # Safety
/// AVX2, FMA and F16C must be available; `w` holds `len` elements of `dtype`,
/// each `xs[r]` at least `len`, `acc` `xs.len() * ACC` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn accumulate(dtype: WeightDType, w: &[u8], xs: &[&[f32]], len: usize, acc: &mut [f32]) {
    debug_assert_eq!(len % STEP, 0);
    let mut r = 0;
    while r < xs.len() {
        let n = (xs.len() - r).min(4);
        let a = &mut acc[r * ACC..(r + n) * ACC];
        let x = &xs[r..r + n];
        match (kind(dtype), n) {
            (F32, 4) => group::<F32, 4>(w, x, len, a),
            (F32, 3) => group::<F32, 3>(w, x, len, a),
            (F32, 2) => group::<F32, 2>(w, x, len, a),
            (F32, _) => group::<F32, 1>(w, x, len, a),
            (F16, 4) => group::<F16, 4>(w, x, len, a),
            (F16, 3) => group::<F16, 3>(w, x, len, a),
            (F16, 2) => group::<F16, 2>(w, x, len, a),
            (F16, _) => group::<F16, 1>(w, x, len, a),
            (_, 4) => group::<BF16, 4>(w, x, len, a),
            (_, 3) => group::<BF16, 3>(w, x, len, a),
            (_, 2) => group::<BF16, 2>(w, x, len, a),
            (_, _) => group::<BF16, 1>(w, x, len, a),
        }
        r += n;
    }
}

/// Loads 8 weights starting at element `i` as f32.
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

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group<const KIND: u8, const R: usize>(w: &[u8], xs: &[&[f32]], len: usize, acc: &mut [f32]) {
    let wp = w.as_ptr();
    let ap = acc.as_mut_ptr();
    let mut acc0 = [_mm256_setzero_ps(); R];
    let mut acc1 = [_mm256_setzero_ps(); R];
    for r in 0..R {
        acc0[r] = _mm256_loadu_ps(ap.add(r * ACC));
        acc1[r] = _mm256_loadu_ps(ap.add(r * ACC + 8));
    }
    let mut i = 0;
    while i < len {
        let w0 = load_w::<KIND>(wp, i);
        let w1 = load_w::<KIND>(wp, i + 8);
        for r in 0..R {
            let x = xs[r].as_ptr();
            acc0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(i)), w0, acc0[r]);
            acc1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(i + 8)), w1, acc1[r]);
        }
        i += STEP;
    }
    for r in 0..R {
        _mm256_storeu_ps(ap.add(r * ACC), acc0[r]);
        _mm256_storeu_ps(ap.add(r * ACC + 8), acc1[r]);
    }
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps::<1>(v);
    let s = _mm_add_ps(lo, hi); // 4 lanes
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s)); // 2 lanes
    let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
    _mm_cvtss_f32(s)
}

/// Adds the last `< STEP` elements and reduces each row's accumulators to `out[r]`.
///
/// # Safety
/// As [`accumulate`], with `w` holding `xs[r].len() < STEP` elements.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn finish(dtype: WeightDType, w: &[u8], xs: &[&[f32]], acc: &[f32], out: &mut [f32]) {
    let size = dtype.size();
    let mut wbuf = [0u8; 64];
    wbuf[..w.len()].copy_from_slice(w);
    let rest = w.len() / size;
    let widen = |p: *const u8, i: usize| match kind(dtype) {
        F32 => load_w::<F32>(p, i),
        F16 => load_w::<F16>(p, i),
        _ => load_w::<BF16>(p, i),
    };
    for (r, o) in out.iter_mut().enumerate() {
        let mut acc0 = _mm256_loadu_ps(acc.as_ptr().add(r * ACC));
        let mut acc1 = _mm256_loadu_ps(acc.as_ptr().add(r * ACC + 8));
        let mut xbuf = [0.0f32; 16];
        xbuf[..rest].copy_from_slice(&xs[r][..rest]);
        let mut i = 0;
        if rest >= 8 {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(xbuf.as_ptr()), widen(wbuf.as_ptr(), 0), acc0);
            i = 8;
        }
        if i < rest {
            // Zero-padded: the padding adds exact zeros.
            acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(xbuf.as_ptr().add(i)), widen(wbuf.as_ptr(), i), acc1);
        }
        *o = hsum(_mm256_add_ps(acc0, acc1));
    }
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
            let lut = _mm256_setr_ps(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
            let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
            for ((o, b), &e) in out.chunks_mut(32).zip(blocks.chunks(16)).zip(scales) {
                let scale = _mm256_set1_ps(formats::e8m0_to_f32(e));
                for (eight, word) in o.chunks_exact_mut(8).zip(b.chunks_exact(4)) {
                    let w = i32::from_le_bytes([word[0], word[1], word[2], word[3]]);
                    let n = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w), shifts), _mm256_set1_epi32(0x0f));
                    let mag = _mm256_permutevar8x32_ps(lut, n);
                    let sign = _mm256_slli_epi32::<28>(_mm256_and_si256(n, _mm256_set1_epi32(8)));
                    let v = _mm256_xor_ps(mag, _mm256_castsi256_ps(sign));
                    _mm256_storeu_ps(eight.as_mut_ptr(), _mm256_mul_ps(v, scale));
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
            let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
            for (start, len, s) in formats::segments(out.len(), lead, group) {
                let scale = _mm256_set1_ps(scales[s]);
                let words = &packed[start / 2..(start + len) / 2];
                for (eight, word) in out[start..start + len].chunks_exact_mut(8).zip(words.chunks_exact(4)) {
                    let w = i32::from_le_bytes([word[0], word[1], word[2], word[3]]);
                    let n = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w), shifts), _mm256_set1_epi32(0x0f));
                    let q = _mm256_cvtepi32_ps(_mm256_sub_epi32(n, _mm256_set1_epi32(8)));
                    _mm256_storeu_ps(eight.as_mut_ptr(), _mm256_mul_ps(q, scale));
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
        let c = _mm_cvtepu8_epi16(_mm_loadl_epi64(codes.as_ptr().add(i) as *const __m128i));
        let sign = _mm_slli_epi16::<8>(_mm_and_si128(c, _mm_set1_epi16(0x80)));
        let mag7 = _mm_and_si128(c, _mm_set1_epi16(0x7f));
        let nan = _mm_and_si128(_mm_cmpeq_epi16(mag7, _mm_set1_epi16(0x7f)), _mm_set1_epi16(0x7e00));
        let h = _mm_or_si128(_mm_or_si128(sign, _mm_slli_epi16::<7>(mag7)), nan);
        let v = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtph_ps(h), k256), s);
        _mm256_storeu_ps(out.as_mut_ptr().add(i), v);
        i += 8;
    }
    let lut = formats::fp8_e4m3_table();
    for j in i..codes.len() {
        out[j] = lut[codes[j] as usize] * scale;
    }
}
