//! AVX2 + FMA + F16C kernels: dot products of f32 activation rows with up to
//! four weight rows at once (f32, f16 or bf16, widened in registers),
//! accumulated chunk by chunk, and SIMD decoders for the quantized formats.
//!
//! Reduction order per (row, feature), fixed: one 8-lane accumulator over
//! 8-element steps (kept in memory between chunks, so chunking does not change
//! the sequence); in [`finish`], a zero-padded tail (< 8) is added to it, then a
//! fixed pairwise horizontal sum. A register block of R rows x F features
//! shares every weight and activation load; independent (row, feature) chains
//! give the FMA units work without splitting any accumulator, so a (row,
//! feature) result is the same whichever block it is computed in.

// Register blocks are const-size arrays indexed by (feature, row); index loops
// read closest to the math and unroll fully.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::dtype::WeightDType;
use crate::formats;
use crate::weight::RowView;

/// Elements per main-loop step.
pub const STEP: usize = 8;
/// f32 accumulator slots per (row, feature).
pub const ACC: usize = 8;

const F32: u8 = 0;
const F16: u8 = 1;
const BF16: u8 = 2;

/// Adds `xs[r][..len] . ws[f][..len]` into the accumulators of every
/// (feature, row), laid out `acc[(f * xs.len() + r) * ACC..]`; `len` is a
/// multiple of [`STEP`], `ws.len() <= 4`.
///
/// # Safety
/// AVX2, FMA and F16C must be available; each `ws[f]` holds `len` elements of
/// `dtype`, each `xs[r]` at least `len`, `acc` `ws.len() * xs.len() * ACC` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn accumulate(dtype: WeightDType, ws: &[&[u8]], xs: &[&[f32]], len: usize, acc: &mut [f32]) {
    debug_assert_eq!(len % STEP, 0);
    debug_assert!(!ws.is_empty() && ws.len() <= 4);
    match dtype {
        WeightDType::F32 => rows::<F32>(ws, xs, len, acc),
        WeightDType::F16 => rows::<F16>(ws, xs, len, acc),
        WeightDType::BF16 => rows::<BF16>(ws, xs, len, acc),
    }
}

/// Splits the rows into register blocks sized for `ws.len()` features
/// (R x F accumulators + F weights + 1 activation fit in 16 registers).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows<const KIND: u8>(ws: &[&[u8]], xs: &[&[f32]], len: usize, acc: &mut [f32]) {
    let m = xs.len();
    // Many rows: pairs of features x 4 rows (fewer weight conversions per FMA);
    // few rows: up to 4 features at once (independent chains for the FMA units).
    let fmax = if m >= 4 { 2 } else { 4 };
    let mut f0 = 0;
    while f0 < ws.len() {
        let nf = (ws.len() - f0).min(fmax);
        let wsub = &ws[f0..f0 + nf];
        let asub = &mut acc[f0 * m * ACC..(f0 + nf) * m * ACC];
        let rmax = match nf {
            1 | 2 => 4,
            3 => 3,
            _ => 2,
        };
        let mut r = 0;
        while r < m {
            let nr = (m - r).min(rmax);
            macro_rules! go {
                ($($rr:literal, $ff:literal);*) => {
                    match (nr, nf) {
                        $( ($rr, $ff) => block::<KIND, $rr, $ff>(wsub, xs, r, len, asub), )*
                        _ => unreachable!("row block {nr} x {nf} features"),
                    }
                };
            }
            go!(1,1; 2,1; 3,1; 4,1; 1,2; 2,2; 3,2; 4,2; 1,3; 2,3; 3,3; 1,4; 2,4);
            r += nr;
        }
        f0 += nf;
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

/// Rows `r0..r0 + R` against the `F` weight rows.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block<const KIND: u8, const R: usize, const F: usize>(ws: &[&[u8]], xs: &[&[f32]], r0: usize, len: usize, acc: &mut [f32]) {
    let m = xs.len();
    let ap = acc.as_mut_ptr();
    let slot = |f: usize, r: usize| (f * m + r0 + r) * ACC;
    let mut a = [[_mm256_setzero_ps(); R]; F];
    for f in 0..F {
        for r in 0..R {
            a[f][r] = _mm256_loadu_ps(ap.add(slot(f, r)));
        }
    }
    let mut wp = [std::ptr::null::<u8>(); F];
    for f in 0..F {
        wp[f] = ws[f].as_ptr();
    }
    let mut xp = [std::ptr::null::<f32>(); R];
    for r in 0..R {
        xp[r] = xs[r0 + r].as_ptr();
    }
    let mut i = 0;
    while i < len {
        let mut w = [_mm256_setzero_ps(); F];
        for f in 0..F {
            w[f] = load_w::<KIND>(wp[f], i);
        }
        for r in 0..R {
            let x = _mm256_loadu_ps(xp[r].add(i));
            for f in 0..F {
                a[f][r] = _mm256_fmadd_ps(x, w[f], a[f][r]);
            }
        }
        i += STEP;
    }
    for f in 0..F {
        for r in 0..R {
            _mm256_storeu_ps(ap.add(slot(f, r)), a[f][r]);
        }
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

/// Adds the last `< STEP` elements of one feature and reduces each row's
/// accumulator (`acc[r * ACC..]`) to `out[r]`.
///
/// # Safety
/// As [`accumulate`], with `w` holding `xs[r].len() < STEP` elements.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn finish(dtype: WeightDType, w: &[u8], xs: &[&[f32]], acc: &[f32], out: &mut [f32]) {
    let mut wbuf = [0u8; 32];
    wbuf[..w.len()].copy_from_slice(w);
    let rest = w.len() / dtype.size();
    let wt = match dtype {
        WeightDType::F32 => load_w::<F32>(wbuf.as_ptr(), 0),
        WeightDType::F16 => load_w::<F16>(wbuf.as_ptr(), 0),
        WeightDType::BF16 => load_w::<BF16>(wbuf.as_ptr(), 0),
    };
    for (r, o) in out.iter_mut().enumerate() {
        let mut a = _mm256_loadu_ps(acc.as_ptr().add(r * ACC));
        if rest > 0 {
            // Zero-padded: the padding adds exact zeros.
            let mut xbuf = [0.0f32; 8];
            xbuf[..rest].copy_from_slice(&xs[r][..rest]);
            a = _mm256_fmadd_ps(_mm256_loadu_ps(xbuf.as_ptr()), wt, a);
        }
        *o = hsum(a);
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
