//! AVX2 + FMA + F16C: the [`Simd`] operations for 8-lane vectors (the
//! shared register-blocked loop is in [`super::blocked`]). Quantized codes
//! are decoded by [`super::codes_avx2`] (also for the AVX-512 path), both
//! into rows and inside the fused dot products of [`super::quant_avx2`].

use std::arch::x86_64::*;

use super::blocked::{self, kind, Simd, BF16, F16, F32};
use crate::dtype::WeightDType;

/// Elements per main-loop step (bf16: two steps, see [`blocked::step`]).
pub(super) const STEP: usize = 8;
/// f32 accumulator slots per (row, feature).
pub(super) const ACC: usize = 8;

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
pub(super) unsafe fn accumulate(dtype: WeightDType, ws: &[&[u8]], ahead: isize, xs: &[&[f32]], len: usize, acc: &mut [f32]) {
    match kind(dtype) {
        F32 => blocked::accumulate::<Avx2, F32>(ws, ahead, xs, len, acc),
        F16 => blocked::accumulate::<Avx2, F16>(ws, ahead, xs, len, acc),
        _ => blocked::accumulate::<Avx2, BF16>(ws, ahead, xs, len, acc),
    }
}

/// See [`blocked::finish`].
///
/// # Safety
/// As [`accumulate`], with `w` holding fewer than [`blocked::step`] elements.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn finish(dtype: WeightDType, w: &[u8], xs: &[&[f32]], acc: &[f32], out: &mut [f32]) {
    blocked::finish::<Avx2>(dtype, w, xs, acc, out)
}

/// See [`blocked::reduce`].
///
/// # Safety
/// As [`accumulate`]; `acc` holds `out.len() * ACC` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn reduce(acc: &[f32], out: &mut [f32]) {
    blocked::reduce::<Avx2>(acc, out)
}
