//! AVX2 + FMA + F16C dot products of f32 activation rows with one dense
//! weight row (f32, f16 or bf16, widened in registers).
//!
//! Reduction order per row (fixed): two 8-lane accumulators over 16-element
//! steps; a remaining 8-element step goes to the first; a zero-padded tail
//! (< 8) to the second; then `acc0 + acc1` and a fixed pairwise horizontal sum.
//! Up to four rows share each weight load; a row's arithmetic is the same
//! whichever rows it is grouped with.

use std::arch::x86_64::*;

use crate::dtype::WeightDType;
use crate::formats;
use crate::weight::RowView;

const F32: u8 = 0;
const F16: u8 = 1;
const BF16: u8 = 2;

/// `out[r] = dot(xs[r], w)`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `w` must hold `xs[r].len()`
/// elements of `dtype` for every row.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_rows(dtype: WeightDType, w: &[u8], xs: &[&[f32]], out: &mut [f32]) {
    match dtype {
        WeightDType::F32 => rows::<F32>(w, xs, out),
        WeightDType::F16 => rows::<F16>(w, xs, out),
        WeightDType::BF16 => rows::<BF16>(w, xs, out),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows<const KIND: u8>(w: &[u8], xs: &[&[f32]], out: &mut [f32]) {
    let mut r = 0;
    while r < xs.len() {
        let n = (xs.len() - r).min(4);
        match n {
            4 => group::<KIND, 4>(w, &xs[r..r + 4], &mut out[r..r + 4]),
            3 => group::<KIND, 3>(w, &xs[r..r + 3], &mut out[r..r + 3]),
            2 => group::<KIND, 2>(w, &xs[r..r + 2], &mut out[r..r + 2]),
            _ => group::<KIND, 1>(w, &xs[r..r + 1], &mut out[r..r + 1]),
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

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps::<1>(v);
    let s = _mm_add_ps(lo, hi); // 4 lanes
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s)); // 2 lanes
    let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
    _mm_cvtss_f32(s)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group<const KIND: u8, const R: usize>(w: &[u8], xs: &[&[f32]], out: &mut [f32]) {
    let k = xs[0].len();
    let wp = w.as_ptr();
    let mut acc0 = [_mm256_setzero_ps(); R];
    let mut acc1 = [_mm256_setzero_ps(); R];
    let mut i = 0;
    while i + 16 <= k {
        let w0 = load_w::<KIND>(wp, i);
        let w1 = load_w::<KIND>(wp, i + 8);
        for r in 0..R {
            let x = xs[r].as_ptr();
            acc0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(i)), w0, acc0[r]);
            acc1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(i + 8)), w1, acc1[r]);
        }
        i += 16;
    }
    if i + 8 <= k {
        let w0 = load_w::<KIND>(wp, i);
        for r in 0..R {
            acc0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xs[r].as_ptr().add(i)), w0, acc0[r]);
        }
        i += 8;
    }
    if i < k {
        let tail = k - i;
        let size = match KIND {
            F32 => 4,
            _ => 2,
        };
        let mut wbuf = [0u8; 32];
        wbuf[..tail * size].copy_from_slice(&w[i * size..k * size]);
        let wt = load_w::<KIND>(wbuf.as_ptr(), 0);
        for r in 0..R {
            let mut xbuf = [0.0f32; 8];
            xbuf[..tail].copy_from_slice(&xs[r][i..k]);
            acc1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xbuf.as_ptr()), wt, acc1[r]);
        }
    }
    for r in 0..R {
        out[r] = hsum(_mm256_add_ps(acc0[r], acc1[r]));
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
        RowView::Fp8 { codes, scales, block_cols } => {
            for ((o, c), &s) in out.chunks_mut(block_cols).zip(codes.chunks(block_cols)).zip(scales) {
                decode_fp8_block(c, s, o);
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
        RowView::Int4 { packed, scales, group } => {
            let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
            for ((o, words), &s) in out.chunks_mut(group).zip(packed.chunks(group / 2)).zip(scales) {
                let scale = _mm256_set1_ps(s);
                for (eight, word) in o.chunks_exact_mut(8).zip(words.chunks_exact(4)) {
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
