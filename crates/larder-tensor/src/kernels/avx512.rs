//! AVX-512 (F + BW) kernels: dot products of f32 activation rows with up to
//! four weight rows at once (f32, f16 or bf16, widened in registers),
//! accumulated chunk by chunk. Quantized rows are decoded by the AVX2
//! decoders (every AVX-512 CPU has AVX2).
//!
//! Reduction order per (row, feature), fixed: one 16-lane accumulator over
//! 16-element steps (kept in memory between chunks, so chunking does not change
//! the sequence); in [`finish`], a zero-padded tail (< 16) is added to it, then
//! `_mm512_reduce_add_ps`. A register block of R rows x F features
//! shares every weight and activation load; independent (row, feature) chains
//! give the FMA units work without splitting any accumulator, so a (row,
//! feature) result is the same whichever block it is computed in.

// Register blocks are const-size arrays indexed by (feature, row); index loops
// read closest to the math and unroll fully.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::dtype::WeightDType;

/// Elements per main-loop step.
pub const STEP: usize = 16;
/// f32 accumulator slots per (row, feature).
pub const ACC: usize = 16;

const F32: u8 = 0;
const F16: u8 = 1;
const BF16: u8 = 2;

/// Adds `xs[r][..len] . ws[f][..len]` into the accumulators of every
/// (feature, row), laid out `acc[(f * xs.len() + r) * ACC..]`; `len` is a
/// multiple of [`STEP`], `ws.len() <= 4`.
///
/// # Safety
/// AVX-512F/BW, AVX2, FMA and F16C must be available; each `ws[f]` holds `len` elements of
/// `dtype`, each `xs[r]` at least `len`, `acc` `ws.len() * xs.len() * ACC` values.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
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
/// (the AVX2 blocking; AVX-512 has room to spare).
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
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

/// Rows `r0..r0 + R` against the `F` weight rows.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn block<const KIND: u8, const R: usize, const F: usize>(ws: &[&[u8]], xs: &[&[f32]], r0: usize, len: usize, acc: &mut [f32]) {
    let m = xs.len();
    let ap = acc.as_mut_ptr();
    let slot = |f: usize, r: usize| (f * m + r0 + r) * ACC;
    let mut a = [[_mm512_setzero_ps(); R]; F];
    for f in 0..F {
        for r in 0..R {
            a[f][r] = _mm512_loadu_ps(ap.add(slot(f, r)));
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
        let mut w = [_mm512_setzero_ps(); F];
        for f in 0..F {
            w[f] = load_w::<KIND>(wp[f], i);
        }
        for r in 0..R {
            let x = _mm512_loadu_ps(xp[r].add(i));
            for f in 0..F {
                a[f][r] = _mm512_fmadd_ps(x, w[f], a[f][r]);
            }
        }
        i += STEP;
    }
    for f in 0..F {
        for r in 0..R {
            _mm512_storeu_ps(ap.add(slot(f, r)), a[f][r]);
        }
    }
}

/// Adds the last `< STEP` elements of one feature and reduces each row's
/// accumulator (`acc[r * ACC..]`) to `out[r]`.
///
/// # Safety
/// As [`accumulate`], with `w` holding `xs[r].len() < STEP` elements.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub unsafe fn finish(dtype: WeightDType, w: &[u8], xs: &[&[f32]], acc: &[f32], out: &mut [f32]) {
    let mut wbuf = [0u8; 64];
    wbuf[..w.len()].copy_from_slice(w);
    let rest = w.len() / dtype.size();
    let wt = match dtype {
        WeightDType::F32 => load_w::<F32>(wbuf.as_ptr(), 0),
        WeightDType::F16 => load_w::<F16>(wbuf.as_ptr(), 0),
        WeightDType::BF16 => load_w::<BF16>(wbuf.as_ptr(), 0),
    };
    for (r, o) in out.iter_mut().enumerate() {
        let mut a = _mm512_loadu_ps(acc.as_ptr().add(r * ACC));
        if rest > 0 {
            // Zero-padded: the padding adds exact zeros.
            let mut xbuf = [0.0f32; 16];
            xbuf[..rest].copy_from_slice(&xs[r][..rest]);
            a = _mm512_fmadd_ps(_mm512_loadu_ps(xbuf.as_ptr()), wt, a);
        }
        *o = _mm512_reduce_add_ps(a);
    }
}
