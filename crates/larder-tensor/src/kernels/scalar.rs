//! The portable reference kernel: an f32 dot product with a fixed reduction
//! order (8 interleaved partial sums combined pairwise, then the tail in
//! sequence). The compiler vectorises the lanes; the order never changes.
//! Plain multiply-add, not `mul_add`: without a compile-time FMA target
//! feature `mul_add` becomes a slow libm call.

/// Dot product of two equally long f32 slices.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    const LANES: usize = 8;
    let mut acc = [0.0f32; LANES];
    let chunks = a.len() / LANES;
    for c in 0..chunks {
        let (ac, bc) = (&a[c * LANES..c * LANES + LANES], &b[c * LANES..c * LANES + LANES]);
        for l in 0..LANES {
            acc[l] += ac[l] * bc[l];
        }
    }
    let mut sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for i in chunks * LANES..a.len() {
        sum += a[i] * b[i];
    }
    sum
}

/// Elements per main-loop step.
pub(crate) const STEP: usize = 8;
/// f32 accumulator slots per (row, feature).
pub(crate) const ACC: usize = 8;

/// Adds `xs[r][..len] . ws[f][..len]` into the accumulators of every
/// (feature, row), laid out `acc[(f * xs.len() + r) * ACC..]`.
pub(crate) fn accumulate_features(ws: &[&[f32]], xs: &[&[f32]], len: usize, acc: &mut [f32]) {
    for (f, w) in ws.iter().enumerate() {
        accumulate(w, xs, len, &mut acc[f * xs.len() * ACC..(f + 1) * xs.len() * ACC]);
    }
}

/// Adds `xs[r][..len] . w[..len]` into each row's 8 lane accumulators
/// (`len` a multiple of [`STEP`]); [`dot`] is `accumulate` then [`finish`].
pub(crate) fn accumulate(w: &[f32], xs: &[&[f32]], len: usize, acc: &mut [f32]) {
    for (x, a) in xs.iter().zip(acc.chunks_exact_mut(ACC)) {
        for c in 0..len / STEP {
            let (xc, wc) = (&x[c * STEP..c * STEP + STEP], &w[c * STEP..c * STEP + STEP]);
            for l in 0..STEP {
                a[l] += xc[l] * wc[l];
            }
        }
    }
}

/// Combines each row's lanes pairwise and adds the tail (`w.len() < STEP`) in sequence.
pub(crate) fn finish(w: &[f32], xs: &[&[f32]], acc: &[f32], out: &mut [f32]) {
    for ((o, x), a) in out.iter_mut().zip(xs).zip(acc.chunks_exact(ACC)) {
        let mut sum = lane_sum(a);
        for (xv, wv) in x.iter().zip(w) {
            sum += xv * wv;
        }
        *o = sum;
    }
}

/// [`finish`] without a tail: `out[r]` is the sum of row `r`'s accumulators.
pub(crate) fn reduce(acc: &[f32], out: &mut [f32]) {
    for (o, a) in out.iter_mut().zip(acc.chunks_exact(ACC)) {
        *o = lane_sum(a);
    }
}

/// One accumulator's lanes summed pairwise (the order [`finish`] fixes).
#[inline]
fn lane_sum(a: &[f32]) -> f32 {
    ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_accumulation_equals_dot() {
        let a: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..100).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut acc = [0.0f32; ACC];
        accumulate(&a[..48], &[&b[..48]], 48, &mut acc);
        accumulate(&a[48..96], &[&b[48..96]], 48, &mut acc);
        let mut out = [0.0f32];
        finish(&a[96..], &[&b[96..]], &acc, &mut out);
        assert_eq!(out[0].to_bits(), dot(&b, &a).to_bits());
    }
}
