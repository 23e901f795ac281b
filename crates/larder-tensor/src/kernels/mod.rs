//! Weight-dtype matrix products: `y = x W^T` for one row (GEMV) or a few rows
//! (GEMM) of f32 activations against a [`WeightMatrix`] in its shipped dtype.
//!
//! One dispatch point chooses the implementation. Today that is the portable
//! [`scalar`] kernel; ISA-specific files (avx2, avx512, amx, neon) plug in here.
//!
//! Guarantees, which tests assert:
//! - **deterministic**: each output element is one [`scalar::dot`] with a fixed
//!   reduction order, whatever the thread count;
//! - **batch-invariant**: a row's outputs are bit-identical whether computed
//!   alone or among other rows;
//! - each weight row is decoded once per call, for all activation rows.

pub mod scalar;

use rayon::prelude::*;

use crate::mat::Mat;
use crate::weight::WeightMatrix;

/// Output features handled by one parallel task.
const FEATURES_PER_TASK: usize = 32;
/// Below this many weight elements a call runs on the calling thread
/// (scheduling would cost more than it saves).
const PARALLEL_MIN_ELEMS: usize = 1 << 16;

/// `x [m, k] * W^T` where `W` is `[n, k]`: returns `[m, n]`.
///
/// # Panics
/// If `x.cols() != w.cols()`; model code checks shapes at load time.
pub fn matmul_t(x: &Mat, w: &WeightMatrix) -> Mat {
    assert_eq!(
        x.cols(),
        w.cols(),
        "matmul_t: activation width {} vs weight input {}",
        x.cols(),
        w.cols()
    );
    let (m, n, k) = (x.rows(), w.rows(), w.cols());
    // Computed feature-major ([n, m]) so that each task owns a contiguous block.
    let mut out_t = vec![0.0f32; n * m];
    let task = |(ti, block): (usize, &mut [f32])| {
        let mut wrow = vec![0.0f32; k];
        let first = ti * FEATURES_PER_TASK;
        for (j, outs) in block.chunks_exact_mut(m).enumerate() {
            w.decode_row(first + j, &mut wrow);
            for (r, o) in outs.iter_mut().enumerate() {
                *o = scalar::dot(x.row(r), &wrow);
            }
        }
    };
    if n * k >= PARALLEL_MIN_ELEMS && m > 0 {
        out_t.par_chunks_mut(FEATURES_PER_TASK * m).enumerate().for_each(task);
    } else if m > 0 {
        out_t.chunks_mut(FEATURES_PER_TASK * m).enumerate().for_each(task);
    }
    let mut out = Mat::zeros(m, n);
    for f in 0..n {
        for r in 0..m {
            out.row_mut(r)[f] = out_t[f * m + r];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::WeightDType;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    fn random(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..rows * cols).map(|_| lcg(&mut s)).collect()
    }

    #[test]
    fn matches_f64_reference_for_every_dtype() {
        let (m, n, k) = (3, 70, 301);
        let xv = random(m, k, 1);
        let wv = random(n, k, 2);
        let x = Mat::from_vec(m, k, xv.clone());
        for dt in [WeightDType::F32, WeightDType::F16, WeightDType::BF16] {
            let w = WeightMatrix::from_f32(dt, n, k, &wv);
            let wf = w.to_f32();
            let y = matmul_t(&x, &w);
            for r in 0..m {
                for f in 0..n {
                    let exact: f64 = (0..k).map(|i| xv[r * k + i] as f64 * wf[f * k + i] as f64).sum();
                    let got = y.row(r)[f] as f64;
                    assert!(
                        (got - exact).abs() <= 1e-5 * (1.0 + exact.abs()),
                        "{dt} r{r} f{f}: {got} vs {exact}"
                    );
                }
            }
        }
    }

    #[test]
    fn batch_invariant_and_deterministic() {
        let (m, n, k) = (17, 300, 513);
        let x = Mat::from_vec(m, k, random(m, k, 3));
        let w = WeightMatrix::from_f32(WeightDType::BF16, n, k, &random(n, k, 4));
        let all = matmul_t(&x, &w);
        assert_eq!(all, matmul_t(&x, &w));
        for r in 0..m {
            let one = matmul_t(&x.gather_rows(&[r]), &w);
            assert_eq!(one.row(0), all.row(r), "row {r} differs alone vs in batch");
        }
    }
}
