//! AVX-512 (F + BW) dot products of f32 activation rows with one dense weight
//! row (f32, f16 or bf16, widened in registers).
//!
//! Reduction order per row (fixed): two 16-lane accumulators over 32-element
//! steps; a remaining 16-element step goes to the first; a zero-padded tail
//! (< 16) to the second; then `acc0 + acc1` and `_mm512_reduce_add_ps`.
//! Up to four rows share each weight load; a row's arithmetic is the same
//! whichever rows it is grouped with.

use std::arch::x86_64::*;

use crate::dtype::WeightDType;

const F32: u8 = 0;
const F16: u8 = 1;
const BF16: u8 = 2;

/// `out[r] = dot(xs[r], w)`.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW; `w` must hold `xs[r].len()`
/// elements of `dtype` for every row.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub unsafe fn dot_rows(dtype: WeightDType, w: &[u8], xs: &[&[f32]], out: &mut [f32]) {
    match dtype {
        WeightDType::F32 => rows::<F32>(w, xs, out),
        WeightDType::F16 => rows::<F16>(w, xs, out),
        WeightDType::BF16 => rows::<BF16>(w, xs, out),
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
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

/// Loads 16 weights starting at element `i` as f32.
#[inline(always)]
unsafe fn load_w<const KIND: u8>(w: *const u8, i: usize) -> __m512 {
    match KIND {
        F32 => _mm512_loadu_ps(w.add(i * 4) as *const f32),
        F16 => _mm512_cvtph_ps(_mm256_loadu_si256(w.add(i * 2) as *const __m256i)),
        _ => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
            w.add(i * 2) as *const __m256i
        )))),
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn group<const KIND: u8, const R: usize>(w: &[u8], xs: &[&[f32]], out: &mut [f32]) {
    let k = xs[0].len();
    let wp = w.as_ptr();
    let mut acc0 = [_mm512_setzero_ps(); R];
    let mut acc1 = [_mm512_setzero_ps(); R];
    let mut i = 0;
    while i + 32 <= k {
        let w0 = load_w::<KIND>(wp, i);
        let w1 = load_w::<KIND>(wp, i + 16);
        for r in 0..R {
            let x = xs[r].as_ptr();
            acc0[r] = _mm512_fmadd_ps(_mm512_loadu_ps(x.add(i)), w0, acc0[r]);
            acc1[r] = _mm512_fmadd_ps(_mm512_loadu_ps(x.add(i + 16)), w1, acc1[r]);
        }
        i += 32;
    }
    if i + 16 <= k {
        let w0 = load_w::<KIND>(wp, i);
        for r in 0..R {
            acc0[r] = _mm512_fmadd_ps(_mm512_loadu_ps(xs[r].as_ptr().add(i)), w0, acc0[r]);
        }
        i += 16;
    }
    if i < k {
        let tail = k - i;
        let size = match KIND {
            F32 => 4,
            _ => 2,
        };
        let mut wbuf = [0u8; 64];
        wbuf[..tail * size].copy_from_slice(&w[i * size..k * size]);
        let wt = load_w::<KIND>(wbuf.as_ptr(), 0);
        for r in 0..R {
            let mut xbuf = [0.0f32; 16];
            xbuf[..tail].copy_from_slice(&xs[r][i..k]);
            acc1[r] = _mm512_fmadd_ps(_mm512_loadu_ps(xbuf.as_ptr()), wt, acc1[r]);
        }
    }
    for r in 0..R {
        out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r]));
    }
}
