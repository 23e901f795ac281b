//! The register-blocked dot-product loop shared by the x86 SIMD paths
//! (`avx2`, `avx512`), written once over a small [`Simd`] trait.
//!
//! Reduction order per (row, feature), fixed: one `LANES`-wide accumulator
//! over `LANES`-element steps (kept in memory between column chunks, so
//! chunking does not change the sequence); in [`finish`], a zero-padded tail
//! (< one step) is added to it, then the ISA's fixed horizontal sum. bf16
//! steps are two vectors wide: one load of `2 x LANES` weights, whose 32-bit
//! lanes each hold a pair, becomes the even elements (shifted up 16 bits) and
//! the odd ones (low half masked off), two instructions for `2 x LANES`
//! weights; the activations come in the same order ([`push_pair_order`]), so lane
//! `d` adds column `2d` then column `2d + 1` of each step. A register
//! block of R rows x F features shares every weight and activation load;
//! independent (row, feature) chains keep the FMA units busy without splitting
//! any accumulator, so a (row, feature) result is the same whichever block it
//! is computed in.
//!
//! Everything here is `#[inline(always)]` and called only from the ISA files'
//! `#[target_feature]` entry points, so it compiles to that ISA's instructions.

// Register blocks are const-size arrays indexed by (feature, row); index loops
// read closest to the math and unroll fully.
#![allow(clippy::needless_range_loop)]

use crate::dtype::WeightDType;

pub(crate) const F32: u8 = 0;
pub(crate) const F16: u8 = 1;
pub(crate) const BF16: u8 = 2;

/// Bytes per weight element of kind `KIND`.
#[inline(always)]
const fn elem_bytes<const KIND: u8>() -> usize {
    if KIND == F32 {
        4
    } else {
        2
    }
}

/// f32 vectors one main-loop step of kind `KIND` yields (bf16 widens pairs).
#[inline(always)]
const fn vectors<const KIND: u8>() -> usize {
    if KIND == BF16 {
        2
    } else {
        1
    }
}

/// Elements per main-loop step for weights of `dtype` on `lanes`-wide vectors.
pub(crate) fn step(dtype: WeightDType, lanes: usize) -> usize {
    if kind(dtype) == BF16 {
        lanes * vectors::<BF16>()
    } else {
        lanes
    }
}

/// Appends `x` to `out` with each whole bf16 step of columns (`2 x lanes`)
/// in the order [`Simd::load_bf16_pairs`] widens weights: position
/// `lanes * h + d` holds column `2d + h`; columns past the last whole step
/// keep their place.
pub(crate) fn push_pair_order(x: &[f32], lanes: usize, out: &mut Vec<f32>) {
    let steps = x.chunks_exact(2 * lanes);
    let rest = steps.remainder();
    for natural in steps {
        out.extend(natural.iter().step_by(2));
        out.extend(natural.iter().skip(1).step_by(2));
    }
    out.extend_from_slice(rest);
}

/// Asks for the cache line at `p` (any address: prefetches never fault).
#[inline(always)]
pub(crate) unsafe fn prefetch(p: *const u8) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
}

/// The weight-kind tag the kernels are monomorphised on.
pub(crate) fn kind(dtype: WeightDType) -> u8 {
    match dtype {
        WeightDType::F32 => F32,
        WeightDType::F16 => F16,
        WeightDType::BF16 => BF16,
    }
}

/// One SIMD width's f32 vector operations.
pub(crate) trait Simd {
    type V: Copy;
    /// f32 lanes per vector (also the step and the accumulator size).
    const LANES: usize;
    unsafe fn zero() -> Self::V;
    unsafe fn load(p: *const f32) -> Self::V;
    unsafe fn store(p: *mut f32, v: Self::V);
    /// `a * b + c`, fused.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `LANES` weights of kind `KIND` starting at element `i`, widened to f32.
    unsafe fn load_w<const KIND: u8>(w: *const u8, i: usize) -> Self::V;
    /// `2 x LANES` bf16 weights starting at element `i`, widened to f32 as
    /// `[even, odd]`: lane `d` of `even` holds element `i + 2d`, of `odd`
    /// element `i + 2d + 1`.
    unsafe fn load_bf16_pairs(w: *const u8, i: usize) -> [Self::V; 2];
    /// Fixed-order horizontal sum.
    unsafe fn sum(v: Self::V) -> f32;
}

/// Adds `xs[r][..len] . ws[f][..len]` into the accumulators of
/// every (feature, row), laid out `acc[(f * xs.len() + r) * LANES..]`.
///
/// bf16 activations come in [`push_pair_order`]'s order.
///
/// # Safety
/// The CPU must support `S`; each `ws[f]` holds `len` (a multiple of
/// [`step`]) elements of kind `KIND`, each `xs[r]` at least `len`, `acc`
/// `ws.len() * xs.len() * LANES` values.
#[inline(always)]
pub(crate) unsafe fn accumulate<S: Simd, const KIND: u8>(ws: &[&[u8]], ahead: isize, xs: &[&[f32]], len: usize, acc: &mut [f32]) {
    debug_assert_eq!(len % (S::LANES * vectors::<KIND>()), 0);
    let m = xs.len();
    // Many rows: pairs of features x 4 rows (fewer weight conversions per FMA);
    // few rows: up to 4 features at once (independent chains for the FMA units).
    // Either way R x F accumulators + F weights + 1 activation fit in 16 registers.
    let fmax = if m >= 4 { 2 } else { 4 };
    let mut f0 = 0;
    while f0 < ws.len() {
        let nf = (ws.len() - f0).min(fmax);
        let wsub = &ws[f0..f0 + nf];
        let asub = &mut acc[f0 * m * S::LANES..(f0 + nf) * m * S::LANES];
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
                        $( ($rr, $ff) => block::<S, KIND, $rr, $ff>(wsub, if r == 0 { ahead } else { 0 }, xs, r, len, asub), )*
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

/// Rows `r0..r0 + R` against the `F` weight rows.
#[inline(always)]
unsafe fn block<S: Simd, const KIND: u8, const R: usize, const F: usize>(
    ws: &[&[u8]],
    ahead: isize,
    xs: &[&[f32]],
    r0: usize,
    len: usize,
    acc: &mut [f32],
) {
    let m = xs.len();
    let ap = acc.as_mut_ptr();
    let slot = |f: usize, r: usize| (f * m + r0 + r) * S::LANES;
    let mut a = [[S::zero(); R]; F];
    for f in 0..F {
        for r in 0..R {
            a[f][r] = S::load(ap.add(slot(f, r)));
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
        let mut w = [[S::zero(); 2]; F];
        for f in 0..F {
            w[f] = if KIND == BF16 {
                S::load_bf16_pairs(wp[f], i)
            } else {
                [S::load_w::<KIND>(wp[f], i), S::zero()]
            };
            if ahead != 0 {
                prefetch(wp[f].wrapping_offset(ahead).wrapping_add(i * elem_bytes::<KIND>()));
            }
        }
        for r in 0..R {
            for h in 0..vectors::<KIND>() {
                let x = S::load(xp[r].add(i + h * S::LANES));
                for f in 0..F {
                    a[f][r] = S::fma(x, w[f][h], a[f][r]);
                }
            }
        }
        i += S::LANES * vectors::<KIND>();
    }
    for f in 0..F {
        for r in 0..R {
            S::store(ap.add(slot(f, r)), a[f][r]);
        }
    }
}

/// Adds the last elements (less than one [`step`]) of one feature (`w`),
/// `LANES` at a time in column order, and reduces each row's accumulator
/// (`acc[r * LANES..]`) to `out[r]`.
///
/// # Safety
/// As [`accumulate`], with `w` holding `xs[r].len() < step` elements
/// (`LANES <= 16`).
#[inline(always)]
pub(crate) unsafe fn finish<S: Simd>(dtype: WeightDType, w: &[u8], xs: &[&[f32]], acc: &[f32], out: &mut [f32]) {
    // Zero-padded: the padding adds exact zeros.
    let mut wbuf = [0u8; 128];
    wbuf[..w.len()].copy_from_slice(w);
    let rest = w.len() / dtype.size();
    let wide = |at: usize| match kind(dtype) {
        F32 => S::load_w::<F32>(wbuf.as_ptr(), at),
        F16 => S::load_w::<F16>(wbuf.as_ptr(), at),
        _ => S::load_w::<BF16>(wbuf.as_ptr(), at),
    };
    for (r, o) in out.iter_mut().enumerate() {
        let mut a = S::load(acc.as_ptr().add(r * S::LANES));
        let mut xbuf = [0.0f32; 32];
        xbuf[..rest].copy_from_slice(&xs[r][..rest]);
        for at in (0..rest).step_by(S::LANES) {
            a = S::fma(S::load(xbuf.as_ptr().add(at)), wide(at), a);
        }
        *o = S::sum(a);
    }
}

/// [`finish`] without a tail: `out[r]` is the lane sum of row `r`'s
/// accumulator.
///
/// # Safety
/// The CPU must support `S`'s instructions; `acc` holds `out.len() * S::LANES` values.
#[inline(always)]
pub(crate) unsafe fn reduce<S: Simd>(acc: &[f32], out: &mut [f32]) {
    debug_assert!(acc.len() >= out.len() * S::LANES);
    for (r, o) in out.iter_mut().enumerate() {
        *o = S::sum(S::load(acc.as_ptr().add(r * S::LANES)));
    }
}
