//! The portable reference kernel: an f32 dot product with a fixed reduction
//! order (8 interleaved partial sums combined pairwise, then the tail in
//! sequence). The compiler vectorises the lanes; the order never changes.
//! Plain multiply-add, not `mul_add`: without a compile-time FMA target
//! feature `mul_add` becomes a slow libm call.

/// Dot product of two equally long f32 slices.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
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
