//! AVX-512 (F + BW): the [`Simd`] operations for 16-lane vectors (the
//! shared register-blocked loop is in [`super::blocked`]). Quantized rows go
//! through the fused 8-lane `quant_avx2` kernel (every AVX-512 CPU has AVX2).

use std::arch::x86_64::*;

use super::blocked::{self, kind, Simd, BF16, F16, F32};
use crate::dtype::WeightDType;

/// Elements per main-loop step (bf16: two steps, see [`blocked::step`]).
pub(super) const STEP: usize = 16;
/// f32 accumulator slots per (row, feature).
pub(super) const ACC: usize = 16;

/// 16-lane AVX-512 vectors.
pub(crate) struct Avx512;

impl Simd for Avx512 {
    type V = __m512;
    const LANES: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        _mm512_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
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
    #[inline(always)]
    unsafe fn load_bf16_pairs(w: *const u8, i: usize) -> [__m512; 2] {
        let pairs = _mm512_loadu_si512(w.add(i * 2) as *const _);
        [
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(pairs)),
            _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(0xffff_0000u32 as i32))),
        ]
    }
    #[inline(always)]
    unsafe fn sum(v: __m512) -> f32 {
        _mm512_reduce_add_ps(v)
    }
}

/// See [`blocked::accumulate`] (`len` a multiple of [`blocked::step`], `ws.len() <= 4`).
///
/// # Safety
/// AVX-512F/BW, AVX2, FMA and F16C must be available; sizes as in [`blocked::accumulate`].
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(super) unsafe fn accumulate(dtype: WeightDType, ws: &[&[u8]], ahead: isize, xs: &[&[f32]], len: usize, acc: &mut [f32]) {
    match kind(dtype) {
        F32 => blocked::accumulate::<Avx512, F32>(ws, ahead, xs, len, acc),
        F16 => blocked::accumulate::<Avx512, F16>(ws, ahead, xs, len, acc),
        _ => blocked::accumulate::<Avx512, BF16>(ws, ahead, xs, len, acc),
    }
}

/// See [`blocked::finish`].
///
/// # Safety
/// As [`accumulate`], with `w` holding fewer than [`blocked::step`] elements.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(super) unsafe fn finish(dtype: WeightDType, w: &[u8], xs: &[&[f32]], acc: &[f32], out: &mut [f32]) {
    blocked::finish::<Avx512>(dtype, w, xs, acc, out)
}

/// See [`blocked::reduce`].
///
/// # Safety
/// As [`accumulate`]; `acc` holds `out.len() * ACC` values.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(super) unsafe fn reduce(acc: &[f32], out: &mut [f32]) {
    blocked::reduce::<Avx512>(acc, out)
}
