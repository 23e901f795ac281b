//! NEON dot products of f32 activation rows with one f32 weight row (other
//! dtypes are widened into an f32 row first by the dispatcher).
//!
//! Reduction order per row (fixed): two 4-lane accumulators over 8-element
//! steps, a remaining 4-element step to the first, then `acc0 + acc1`, a
//! lane sum, and the tail (< 4) added in sequence.

use std::arch::aarch64::*;

/// `out[r] = dot(xs[r], w)`.
///
/// # Safety
/// The CPU must support NEON; every `xs[r]` must have `w.len()` elements.
#[target_feature(enable = "neon")]
pub unsafe fn dot_rows_f32(w: &[f32], xs: &[&[f32]], out: &mut [f32]) {
    let k = w.len();
    for (o, x) in out.iter_mut().zip(xs) {
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        let mut acc0 = vdupq_n_f32(0.0);
        let mut acc1 = vdupq_n_f32(0.0);
        let mut i = 0;
        while i + 8 <= k {
            acc0 = vfmaq_f32(acc0, vld1q_f32(xp.add(i)), vld1q_f32(wp.add(i)));
            acc1 = vfmaq_f32(acc1, vld1q_f32(xp.add(i + 4)), vld1q_f32(wp.add(i + 4)));
            i += 8;
        }
        if i + 4 <= k {
            acc0 = vfmaq_f32(acc0, vld1q_f32(xp.add(i)), vld1q_f32(wp.add(i)));
            i += 4;
        }
        let mut sum = vaddvq_f32(vaddq_f32(acc0, acc1));
        while i < k {
            sum += x[i] * w[i];
            i += 1;
        }
        *o = sum;
    }
}
