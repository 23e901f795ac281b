//! AVX-512 (F + BW) dot products of f32 activation rows with one weight row
//! (f32, f16 or bf16, widened in registers), accumulated chunk by chunk.
//! Quantized rows are decoded by the AVX2 decoders (every AVX-512 CPU has AVX2).
//!
//! Reduction order per (row, feature), fixed: two 16-lane accumulators over
//! 32-element steps (kept in memory between chunks); in [`finish`], a
//! remaining 16-element step goes to the first, a zero-padded tail (< 16) to
//! the second, then `acc0 + acc1` and `_mm512_reduce_add_ps`. Up to four rows
//! share each weight load; a row's arithmetic is the same whichever rows it
//! is grouped with.

use std::arch::x86_64::*;

use crate::dtype::WeightDType;

/// Elements per main-loop step.
pub const STEP: usize = 32;
/// f32 accumulator slots per (row, feature).
pub const ACC: usize = 32;

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

/// Adds `xs[r][..len] . w[..len]` into each row's accumulators; `len` is a multiple of [`STEP`].
///
/// # Safety
/// AVX-512F/BW, AVX2, FMA and F16C must be available; `w` holds `len`
/// elements of `dtype`, each `xs[r]` at least `len`, `acc` `xs.len() * ACC` values.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
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
unsafe fn group<const KIND: u8, const R: usize>(w: &[u8], xs: &[&[f32]], len: usize, acc: &mut [f32]) {
    let wp = w.as_ptr();
    let ap = acc.as_mut_ptr();
    let mut acc0 = [_mm512_setzero_ps(); R];
    let mut acc1 = [_mm512_setzero_ps(); R];
    for r in 0..R {
        acc0[r] = _mm512_loadu_ps(ap.add(r * ACC));
        acc1[r] = _mm512_loadu_ps(ap.add(r * ACC + 16));
    }
    let mut i = 0;
    while i < len {
        let w0 = load_w::<KIND>(wp, i);
        let w1 = load_w::<KIND>(wp, i + 16);
        for r in 0..R {
            let x = xs[r].as_ptr();
            acc0[r] = _mm512_fmadd_ps(_mm512_loadu_ps(x.add(i)), w0, acc0[r]);
            acc1[r] = _mm512_fmadd_ps(_mm512_loadu_ps(x.add(i + 16)), w1, acc1[r]);
        }
        i += STEP;
    }
    for r in 0..R {
        _mm512_storeu_ps(ap.add(r * ACC), acc0[r]);
        _mm512_storeu_ps(ap.add(r * ACC + 16), acc1[r]);
    }
}

/// Adds the last `< STEP` elements and reduces each row's accumulators to `out[r]`.
///
/// # Safety
/// As [`accumulate`], with `w` holding `xs[r].len() < STEP` elements.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub unsafe fn finish(dtype: WeightDType, w: &[u8], xs: &[&[f32]], acc: &[f32], out: &mut [f32]) {
    let size = dtype.size();
    let mut wbuf = [0u8; 128];
    wbuf[..w.len()].copy_from_slice(w);
    let rest = w.len() / size;
    let widen = |p: *const u8, i: usize| match kind(dtype) {
        F32 => load_w::<F32>(p, i),
        F16 => load_w::<F16>(p, i),
        _ => load_w::<BF16>(p, i),
    };
    for (r, o) in out.iter_mut().enumerate() {
        let mut acc0 = _mm512_loadu_ps(acc.as_ptr().add(r * ACC));
        let mut acc1 = _mm512_loadu_ps(acc.as_ptr().add(r * ACC + 16));
        let mut xbuf = [0.0f32; 32];
        xbuf[..rest].copy_from_slice(&xs[r][..rest]);
        let mut i = 0;
        if rest >= 16 {
            acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(xbuf.as_ptr()), widen(wbuf.as_ptr(), 0), acc0);
            i = 16;
        }
        if i < rest {
            acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(xbuf.as_ptr().add(i)), widen(wbuf.as_ptr(), i), acc1);
        }
        *o = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    }
}
