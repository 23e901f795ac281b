//! Row-wise f32 operations shared by every architecture: RMSNorm, SiLU,
//! softmax. Each works on one row at a time with a fixed order, so a row's
//! result never depends on the other rows of its batch.

use crate::mat::Mat;

/// RMSNorm of one row, as transformers computes it in f32:
/// `x * rsqrt(mean(x^2) + eps) * weight`. The mean is accumulated in f64 and
/// rounded once, which is at least as accurate as torch's f32 reduction.
pub fn rms_norm_row(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let mean = (ss / x.len() as f64) as f32;
    let inv = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = w * (v * inv);
    }
}

/// RMSNorm of every row of `x`.
pub fn rms_norm(x: &Mat, weight: &[f32], eps: f32) -> Mat {
    let mut out = Mat::zeros(x.rows(), x.cols());
    for r in 0..x.rows() {
        rms_norm_row(x.row(r), weight, eps, out.row_mut(r));
    }
    out
}

/// In-place RMSNorm of consecutive `dim`-sized chunks (per-head norms).
pub fn rms_norm_chunks_in_place(x: &mut [f32], dim: usize, weight: &[f32], eps: f32) {
    let mut tmp = vec![0.0f32; dim];
    for chunk in x.chunks_exact_mut(dim) {
        rms_norm_row(chunk, weight, eps, &mut tmp);
        chunk.copy_from_slice(&tmp);
    }
}

/// SiLU: `x * sigmoid(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Logistic sigmoid.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// In-place numerically stable softmax of one row.
pub fn softmax_in_place(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Index of the largest value, ties to the lowest index (NaN never wins):
/// greedy decoding's choice.
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] || v[best].is_nan() {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_sums_to_one() {
        let mut v = vec![1.0, 2.0, 3.0, -1e9];
        softmax_in_place(&mut v);
        assert!((v.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(v[3], 0.0);
    }

    #[test]
    fn rms_norm_unit_rows() {
        let x = Mat::from_vec(1, 4, vec![2.0, 2.0, 2.0, 2.0]);
        let y = rms_norm(&x, &[1.0, 1.0, 1.0, 0.5], 0.0);
        assert_eq!(y.row(0), &[1.0, 1.0, 1.0, 0.5]);
    }
}
