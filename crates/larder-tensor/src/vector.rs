//! Dot products and `y += p x` over f32 slices: attention's scores and its
//! weighted sums over cached positions, where prompts of thousands of tokens
//! spend most of their attention time.
//!
//! On the x86 SIMD kernel paths ([`crate::kernels::active_path`], AVX2 and FMA
//! present) a dot runs 32 lanes at a time in four independent FMA chains
//! (the FMA latency would otherwise bound a single chain), the chains added
//! in a fixed tree, then the lanes, then the tail in order; `axpy` is one FMA
//! per element. Elsewhere `kernels::scalar::dot` and a multiply-add per
//! element. Each path has one fixed order that depends on the slices'
//! length alone, so a row's attention never depends on the rows or threads
//! beside it.

use crate::kernels::scalar;

/// `sum(a[i] * b[i])` over the shorter length.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: `simd` checked AVX2 and FMA.
        return unsafe { avx2::dot(&a[..n], &b[..n]) };
    }
    scalar::dot(&a[..n], &b[..n])
}

/// `y[i] += p * x[i]` for every `i < y.len()` (`x` at least as long).
#[inline]
pub fn axpy(p: f32, x: &[f32], y: &mut [f32]) {
    let x = &x[..y.len()];
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: `simd` checked AVX2 and FMA.
        return unsafe { avx2::axpy(p, x, y) };
    }
    for (y, &x) in y.iter_mut().zip(x) {
        *y += p * x;
    }
}

/// Whether the process's kernel path is an x86 SIMD one (AVX2 and FMA
/// present: both x86 paths require them).
#[cfg(target_arch = "x86_64")]
#[inline]
fn simd() -> bool {
    crate::kernels::active_path().is_x86_simd()
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// See [`super::dot`]; `a` and `b` of one length.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (k, c) in acc.iter_mut().enumerate() {
                *c = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + 8 * k)), _mm256_loadu_ps(pb.add(i + 8 * k)), *c);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc[0]);
            i += 8;
        }
        let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        let mut sum = _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps::<1>(h, h)));
        while i < n {
            sum = a[i].mul_add(b[i], sum);
            i += 1;
        }
        sum
    }

    /// See [`super::axpy`]; `x` and `y` of one length.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn axpy(p: f32, x: &[f32], y: &mut [f32]) {
        let n = y.len();
        let (px, py) = (x.as_ptr(), y.as_mut_ptr());
        let pv = _mm256_set1_ps(p);
        let mut i = 0;
        while i + 8 <= n {
            _mm256_storeu_ps(
                py.add(i),
                _mm256_fmadd_ps(pv, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i))),
            );
            i += 8;
        }
        while i < n {
            y[i] = p.mul_add(x[i], y[i]);
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_and_axpy_match_f64_at_every_length() {
        for n in [0, 1, 7, 8, 9, 31, 32, 33, 64, 100, 576] {
            let a: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
            let b: Vec<f32> = (0..n).map(|i| ((i * 53 % 97) as f32 - 48.0) / 13.0).collect();
            let exact: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
            let scale: f64 = a.iter().zip(&b).map(|(&x, &y)| (x as f64 * y as f64).abs()).sum::<f64>() + 1.0;
            assert!((dot(&a, &b) as f64 - exact).abs() <= 1e-6 * scale, "n={n}");
            let mut y = b.clone();
            axpy(0.75, &a, &mut y);
            for i in 0..n {
                assert!(
                    (y[i] - (b[i] + 0.75 * a[i])).abs() <= 1e-6 * (1.0 + b[i].abs() + a[i].abs()),
                    "n={n} i={i}"
                );
            }
        }
    }

    #[test]
    fn a_dot_depends_on_its_operands_alone() {
        let a: Vec<f32> = (0..200).map(|i| (i as f32).sin()).collect();
        let b: Vec<f32> = (0..200).map(|i| (i as f32 * 0.7).cos()).collect();
        let first = dot(&a, &b).to_bits();
        for _ in 0..3 {
            assert_eq!(dot(&a, &b).to_bits(), first);
        }
    }
}
