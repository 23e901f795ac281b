//! NEON dot products of f32 activation rows with one f32 weight row (other
//! formats are widened to f32 chunks by the dispatcher), accumulated chunk by
//! chunk.
//!
//! Reduction order per (row, feature), fixed: two 4-lane accumulators over
//! 8-element steps (kept in memory between chunks); in [`finish`], a remaining
//! 4-element step goes to the first, then `acc0 + acc1`, a lane sum, and the
//! tail (< 4) added in sequence.

use std::arch::aarch64::*;

/// Elements per main-loop step.
pub(super) const STEP: usize = 8;
/// f32 accumulator slots per (row, feature).
pub(super) const ACC: usize = 8;

/// Adds `xs[r][..len] . ws[f][..len]` into the accumulators of every
/// (feature, row), laid out `acc[(f * xs.len() + r) * ACC..]`.
///
/// # Safety
/// As [`accumulate_f32`] for each feature.
#[target_feature(enable = "neon")]
pub(super) unsafe fn accumulate_features(ws: &[&[f32]], xs: &[&[f32]], len: usize, acc: &mut [f32]) {
    for (f, w) in ws.iter().enumerate() {
        accumulate_f32(w, xs, len, &mut acc[f * xs.len() * ACC..(f + 1) * xs.len() * ACC]);
    }
}

/// Adds `xs[r][..len] . w[..len]` into each row's accumulators.
///
/// # Safety
/// NEON must be available; `w` and every `xs[r]` hold at least `len`
/// elements (a multiple of [`STEP`]); `acc` holds `xs.len() * ACC` values.
#[target_feature(enable = "neon")]
pub(super) unsafe fn accumulate_f32(w: &[f32], xs: &[&[f32]], len: usize, acc: &mut [f32]) {
    let wp = w.as_ptr();
    for (r, x) in xs.iter().enumerate() {
        let ap = acc.as_mut_ptr().add(r * ACC);
        let xp = x.as_ptr();
        let mut acc0 = vld1q_f32(ap);
        let mut acc1 = vld1q_f32(ap.add(4));
        let mut i = 0;
        while i < len {
            acc0 = vfmaq_f32(acc0, vld1q_f32(xp.add(i)), vld1q_f32(wp.add(i)));
            acc1 = vfmaq_f32(acc1, vld1q_f32(xp.add(i + 4)), vld1q_f32(wp.add(i + 4)));
            i += STEP;
        }
        vst1q_f32(ap, acc0);
        vst1q_f32(ap.add(4), acc1);
    }
}

/// Adds the last `< STEP` elements and reduces each row's accumulators to `out[r]`.
///
/// # Safety
/// As [`accumulate_f32`], with `w` holding `xs[r].len() < STEP` elements.
#[target_feature(enable = "neon")]
pub(super) unsafe fn finish_f32(w: &[f32], xs: &[&[f32]], acc: &[f32], out: &mut [f32]) {
    let rest = w.len();
    for (r, o) in out.iter_mut().enumerate() {
        let ap = acc.as_ptr().add(r * ACC);
        let mut acc0 = vld1q_f32(ap);
        let acc1 = vld1q_f32(ap.add(4));
        let x = xs[r];
        let mut i = 0;
        if rest >= 4 {
            acc0 = vfmaq_f32(acc0, vld1q_f32(x.as_ptr()), vld1q_f32(w.as_ptr()));
            i = 4;
        }
        let mut sum = vaddvq_f32(vaddq_f32(acc0, acc1));
        while i < rest {
            sum += x[i] * w[i];
            i += 1;
        }
        *o = sum;
    }
}

/// [`finish_f32`] without a tail: `out[r]` is the lane sum of row `r`'s
/// accumulators.
///
/// # Safety
/// NEON must be available; `acc` holds `out.len() * ACC` values.
#[target_feature(enable = "neon")]
pub(super) unsafe fn reduce(acc: &[f32], out: &mut [f32]) {
    for (r, o) in out.iter_mut().enumerate() {
        let ap = acc.as_ptr().add(r * ACC);
        *o = vaddvq_f32(vaddq_f32(vld1q_f32(ap), vld1q_f32(ap.add(4))));
    }
}
