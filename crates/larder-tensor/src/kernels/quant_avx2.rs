//! AVX2 dot products over quantized weight rows, the codes decoded in
//! registers: fp8 e4m3 with 2-D block scales, mxfp4 (e8m0 scale per 32),
//! int4 (f32 scale per group).
//!
//! Reduction order per (activation row, feature), fixed, in two kinds:
//! - **Whole 64-column mxfp4/int4 groups** ([`groups64`], the permuted
//!   layout every loader builds): each weight vector is dequantized exactly
//!   in registers (code value times its block's scale, as
//!   decode-then-multiply gives it: exact for mxfp4, whose scales are powers
//!   of two, and for int4 scales of up to 20 significant bits, such as the
//!   bf16 and f16 scales checkpoints ship), and the row's accumulator takes
//!   it by one FMA; lanes run over the call's columns in the permuted order.
//!   The scale multiply is paid once per weight vector and shared by every
//!   row of the call, and accumulators run unbroken, as in the dense kernels
//!   (measured: +15-30 % at 8-64 rows against per-block sums).
//! - **Everything else** (fp8, a last 32-column group, unpermuted layouts):
//!   the call's columns are cut at the scale boundaries into segments
//!   ([`formats::segments`]); within a segment the products of the
//!   activations and the *unscaled* code values (small exact numbers)
//!   accumulate, 8 lanes at a time, into a fresh block sum; at the segment's
//!   end `acc += sum * scale`, one FMA per lane, which differs from
//!   decode-then-multiply by f32 reassociation of the scale only.
//!
//! Both depend only on the columns, never on which rows share the call, so
//! results are batch-invariant and deterministic, inside the tolerance the
//! kernel tests state against the scalar reference.
//!
//! fp8 with 2-D blocks (every checkpoint that ships them) goes one step
//! further when its scales allow ([`scales_fold_into_activations`]): the
//! activations of each block-row are multiplied by its column blocks' scales
//! once per task ([`scale_by_blocks`]), the four rows of a register block
//! sharing them, and block sums then take factor 1 over fixed 512-column
//! pieces (whole chunks, so still independent of the rows in a call).
//!
//! fp8: codes become f32 of value x 2^-8 through f16 ([`fp8_bytes`]: the
//! even and the odd bytes of each 128-bit half, so the activations of each
//! whole 32-column group come permuted to match;
//! [`fp8_scaled`] where blocks are not whole groups); each activation row
//! comes prescaled by a power of two ([`prescale`]) so that products stay
//! clear of f32's subnormal range, and
//! each block sum is multiplied back before its scale (powers of two:
//! exact). NaN codes (0x7f, 0xff) come out finite that way, so a register
//! block keeps the largest magnitude code it saw (one byte max per 32 codes)
//! and a feature whose row holds a NaN code gets NaN results, as
//! decode-then-multiply gives.
//!
//! mxfp4 and int4 (blocks of whole 32-column groups): whole 64-column
//! groups decode from 32 bytes, 8 codes per 32-bit lane ([`e2m1_pair`] then
//! [`e2m1_lane`]: f32 of value x 2, by byte shuffle, the 2 folded into the
//! scale; [`int4_flipped`] then [`int4_lane`]: signed integers, by 16-bit
//! shift pairs, converted), each vector just before its FMAs; the group's
//! two 32-column halves sit in lanes 0..4 and 4..8 and take their scales as
//! one vector ([`groups64`]). A last 32-column group widens 16
//! bytes to one 16-bit word per 32-bit lane; nibble `n` of every word is
//! shifted to the lane's top and back arithmetically ([`e2m1_nibble`],
//! [`int4_nibble`]). The activations come permuted to match (not scaled).
//! int4 groups that are not whole 32-column groups take the code-order path:
//! 32 nibbles in order (mask, shift, interleave), a byte-shuffle table of the
//! values, sign extension and conversion.
//!
//! The decoders themselves (code bits to f32 bits, per format) live in
//! [`super::codes_avx2`], shared with the row decoder.

// Register blocks are const-size arrays indexed by (feature, row).
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::blocked::prefetch;
use super::codes_avx2::{
    e2m1_lane, e2m1_nibble, e2m1_pair, fp8_bytes, fp8_lane, fp8_scaled, fp8_words, int4_flipped, int4_lane, int4_nibble, int4_values,
    nibbles32, nibbles8, pow2, E8M0,
};
use super::{Activations, FEATURE_BLOCK};
use crate::formats;
use crate::weight::RowView;

const FP8: u8 = 0;
const MXFP4: u8 = 1;
const INT4: u8 = 2;

/// The rows of one call: per feature its codes and its scales from the
/// first segment on (fp8/int4: f32; mxfp4: e8m0 bytes).
struct Rows<'a> {
    codes: [&'a [u8]; FEATURE_BLOCK],
    scales: [&'a [f32]; FEATURE_BLOCK],
    e8m0: [&'a [u8]; FEATURE_BLOCK],
    nf: usize,
    /// Bytes from a code to the same code of the row a register block later
    /// (prefetched; 0 for none).
    ahead: isize,
    /// Whether the activations come permuted for [`fp8_bytes`],
    /// [`e2m1_nibble`] and [`int4_nibble`] (every 32-column step then starts
    /// on a multiple of 32).
    permuted: bool,
    /// The block sums take factor 1 (the activations carry the scales).
    unit_factor: bool,
    /// Columns in the call (a multiple of 8).
    len: usize,
    /// f32 slots per (feature, row) accumulator: 8 on the AVX2 path, 16 on
    /// the AVX-512 path (whose reduction sums all 16; this kernel fills the
    /// first 8 and leaves the rest zero).
    acc_stride: usize,
    lead: usize,
    block: usize,
}

impl Rows<'_> {
    /// The factor the block sum of feature `f`'s segment `idx` is multiplied
    /// by (after the row's own unscaling, see [`prescale`]): mxfp4 the e8m0
    /// value, fp8 and int4 the scale.
    #[inline(always)]
    fn factor<const KIND: u8>(&self, f: usize, idx: usize) -> f32 {
        if self.unit_factor {
            return 1.0;
        }
        match KIND {
            // Codes decode to twice their value (the activations come unscaled).
            MXFP4 => E8M0[self.e8m0[f][idx] as usize] * 0.5,
            _ => self.scales[f][idx],
        }
    }
}

/// Adds one chunk of up to [`FEATURE_BLOCK`] quantized rows (`views`, all of
/// one format and column range) into the accumulators of every (feature,
/// row), laid out `acc[(f * xs.len() + r) * acc_stride..]`. Returns `false`, having
/// done nothing, where the layout does not allow it: a block or group that
/// is not a multiple of 8 columns, or a chunk whose columns are not.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; each `xs[r]` holds the chunk's
/// columns; `acc_stride >= 8`; `acc` holds `views.len() * xs.len() *
/// acc_stride` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn accumulate(
    views: &[RowView<'_>],
    ahead: isize,
    xs: &[&[f32]],
    act: Activations<'_>,
    acc: &mut [f32],
    acc_stride: usize,
) -> bool {
    let (unscale, permuted) = (act.unscale, act.permuted);
    let Some(first) = views.first() else { return true };
    let (kind, len, lead, block) = match *first {
        RowView::Fp8 {
            codes, block_cols, lead, ..
        } => (FP8, codes.len(), lead, block_cols),
        RowView::Mxfp4 { blocks, .. } => (MXFP4, blocks.len() * 2, 0, formats::MXFP4_BLOCK),
        RowView::Int4 { packed, group, lead, .. } => (INT4, packed.len() * 2, lead, group),
        RowView::Dense { .. } => return false,
    };
    if block % 8 != 0
        || lead % 8 != 0
        || len % 8 != 0
        || views.len() > FEATURE_BLOCK
        || (kind == FP8 && unscale.len() != xs.len())
        || (permuted && (block % 32 != 0 || lead % 32 != 0))
        || (kind == MXFP4 && !permuted)
        || acc_stride < 8
        || acc.len() < views.len() * xs.len() * acc_stride
    {
        return false;
    }
    let mut rows = Rows {
        codes: [&[]; FEATURE_BLOCK],
        scales: [&[]; FEATURE_BLOCK],
        e8m0: [&[]; FEATURE_BLOCK],
        nf: views.len(),
        ahead,
        permuted,
        unit_factor: false,
        len,
        acc_stride,
        lead,
        block,
    };
    let segments = (lead + len).div_ceil(block);
    for (f, v) in views.iter().enumerate() {
        // Every view must match the first (one format, one column range, a
        // scale per segment); anything else goes the decoding way.
        match *v {
            RowView::Fp8 {
                codes,
                scales,
                block_cols,
                lead: l,
            } if kind == FP8 && codes.len() == len && block_cols == block && l == lead && scales.len() >= segments => {
                rows.codes[f] = codes;
                rows.scales[f] = scales;
            }
            RowView::Mxfp4 { blocks, scales } if kind == MXFP4 && blocks.len() * 2 == len && scales.len() >= segments => {
                rows.codes[f] = blocks;
                rows.e8m0[f] = scales;
            }
            RowView::Int4 {
                packed,
                scales,
                group,
                lead: l,
            } if kind == INT4 && packed.len() * 2 == len && group == block && l == lead && scales.len() >= segments => {
                rows.codes[f] = packed;
                rows.scales[f] = scales;
            }
            _ => return false,
        }
    }
    match kind {
        FP8 => dispatch::<FP8>(&rows, xs, unscale, acc),
        MXFP4 => dispatch::<MXFP4>(&rows, xs, unscale, acc),
        _ => dispatch::<INT4>(&rows, xs, unscale, acc),
    }
    true
}

/// [`accumulate`] for block-scaled fp8 rows whose scales come folded into
/// the activations ([`scale_by_blocks`]),
/// taken as their codes alone (no views to match: this runs once per
/// register block, and short rows feel any set-up): the columns from a
/// multiple of `piece` (a multiple of 32) on, summed in pieces of `piece`
/// columns with factor 1, the activations permuted. Returns `false`, having
/// done nothing, where the sizes do not allow it.
///
/// # Safety
/// As [`accumulate`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn accumulate_fp8_folded(
    codes: &[&[u8]],
    piece: usize,
    ahead: isize,
    xs: &[&[f32]],
    unscale: &[f32],
    acc: &mut [f32],
    acc_stride: usize,
) -> bool {
    let Some(first) = codes.first() else { return true };
    let len = first.len();
    if len % 8 != 0
        || piece == 0
        || !piece.is_multiple_of(32)
        || codes.len() > FEATURE_BLOCK
        || codes.iter().any(|c| c.len() != len)
        || unscale.len() != xs.len()
        || xs.iter().any(|x| x.len() < len)
        || acc_stride < 8
        || acc.len() < codes.len() * xs.len() * acc_stride
    {
        return false;
    }
    let mut rows = Rows {
        codes: [&[]; FEATURE_BLOCK],
        scales: [&[]; FEATURE_BLOCK],
        e8m0: [&[]; FEATURE_BLOCK],
        nf: codes.len(),
        ahead,
        permuted: true,
        unit_factor: true,
        len,
        acc_stride,
        lead: 0,
        block: piece,
    };
    rows.codes[..codes.len()].copy_from_slice(codes);
    dispatch::<FP8>(&rows, xs, unscale, acc);
    true
}

/// One activation row: up to 4 features at once (independent chains for the
/// FMA units); more rows: pairs of features x up to 4 rows (each decoded
/// weight vector feeds 4 FMAs, each activation load 2: many rows are bound
/// by loads, one per FMA with single features). Either way accumulators,
/// block sums, decoded weights and an activation fit, or nearly, in the 16
/// vector registers.
#[inline(always)]
unsafe fn dispatch<const KIND: u8>(q: &Rows<'_>, xs: &[&[f32]], unscale: &[f32], acc: &mut [f32]) {
    let m = xs.len();
    if m == 1 {
        match q.nf {
            1 => block::<KIND, 1, 1>(q, 0, xs, unscale, 0, acc),
            2 => block::<KIND, 1, 2>(q, 0, xs, unscale, 0, acc),
            3 => block::<KIND, 1, 3>(q, 0, xs, unscale, 0, acc),
            _ => block::<KIND, 1, 4>(q, 0, xs, unscale, 0, acc),
        }
        return;
    }
    let mut f = 0;
    while f < q.nf {
        let pair = f + 1 < q.nf;
        let mut r = 0;
        while r < m {
            match ((m - r).min(4), pair) {
                (1, false) => block::<KIND, 1, 1>(q, f, xs, unscale, r, acc),
                (2, false) => block::<KIND, 2, 1>(q, f, xs, unscale, r, acc),
                (3, false) => block::<KIND, 3, 1>(q, f, xs, unscale, r, acc),
                (_, false) => block::<KIND, 4, 1>(q, f, xs, unscale, r, acc),
                (1, true) => block::<KIND, 1, 2>(q, f, xs, unscale, r, acc),
                (2, true) => block::<KIND, 2, 2>(q, f, xs, unscale, r, acc),
                (3, true) => block::<KIND, 3, 2>(q, f, xs, unscale, r, acc),
                (_, true) => block::<KIND, 4, 2>(q, f, xs, unscale, r, acc),
            }
            r += 4;
        }
        f += if pair { 2 } else { 1 };
    }
}

/// Rows `r0..r0 + R` against features `f0..f0 + F`: one block sum per
/// (feature, row) and segment (R x F independent FMA chains, enough for the
/// FMA units: two partial sums per chain measured no faster and would not
/// fit the registers of 4 rows x 2 features); the accumulators stay in
/// memory, touched once per segment.
#[inline(always)]
unsafe fn block<const KIND: u8, const R: usize, const F: usize>(
    q: &Rows<'_>,
    f0: usize,
    xs: &[&[f32]],
    unscale: &[f32],
    r0: usize,
    acc: &mut [f32],
) {
    // The rows a register block later are prefetched by the first row group only.
    let ahead = if r0 == 0 { q.ahead } else { 0 };
    let m = xs.len();
    let ap = acc.as_mut_ptr();
    let slot = |f: usize, r: usize| ap.add(((f0 + f) * m + r0 + r) * q.acc_stride);
    let mut cp = [std::ptr::null::<u8>(); F];
    for f in 0..F {
        cp[f] = q.codes[f0 + f].as_ptr();
    }
    let mut xp = [std::ptr::null::<f32>(); R];
    for r in 0..R {
        xp[r] = xs[r0 + r].as_ptr();
    }
    // int4 values by nibble, for the code-order path (mxfp4 never takes it).
    let lut = int4_values();
    // fp8: the largest (code << 1) of all F rows; 0xfe means a NaN code.
    let mut nan = _mm256_setzero_si256();
    // mxfp4 and int4 in permuted order: whole 64-column groups first (two
    // features at a time), then a last 32-column group if any.
    let mut done = 0;
    if KIND != FP8 && q.permuted {
        done = q.len / 64 * 64;
        let mut f = 0;
        while f < F {
            if f + 1 < F {
                groups64::<KIND, R, 2>(q, f0 + f, xs, r0, ahead, done, acc);
                f += 2;
            } else {
                groups64::<KIND, R, 1>(q, f0 + f, xs, r0, ahead, done, acc);
                f += 1;
            }
        }
    }
    // The rest, segment by segment.
    let (lead, first_idx) = ((q.lead + done) % q.block, (q.lead + done) / q.block);
    let rest = formats::segments(q.len - done, lead, q.block).map(|(start, seg, idx)| (start + done, seg, idx + first_idx));
    for (start, seg, idx) in rest {
        let end = start + seg;
        let mut s = [[_mm256_setzero_ps(); R]; F];
        let mut i = start;
        // Permuted fp8 with several rows: each vector widened just before
        // its FMAs, so that one activation load feeds every feature (the
        // same sums in the same order as below, fewer loads and registers).
        while KIND == FP8 && q.permuted && R > 1 && i + 32 <= end {
            let mut packed = [[_mm256_setzero_si256(); 2]; F];
            for f in 0..F {
                prefetch(cp[f].wrapping_offset(ahead).wrapping_add(i));
                let b = _mm256_loadu_si256(cp[f].add(i) as *const __m256i);
                nan = _mm256_max_epu8(nan, _mm256_add_epi8(b, b));
                packed[f] = fp8_words(b);
            }
            for j in 0..4 {
                let mut w = [_mm256_setzero_ps(); F];
                for f in 0..F {
                    w[f] = fp8_lane(&packed[f], j);
                }
                for r in 0..R {
                    let x = _mm256_loadu_ps(xp[r].add(i + 8 * j));
                    for f in 0..F {
                        s[f][r] = _mm256_fmadd_ps(x, w[f], s[f][r]);
                    }
                }
            }
            i += 32;
        }
        while i + 32 <= end {
            for f in 0..F {
                let bytes = if KIND == FP8 { i } else { i / 2 };
                prefetch(cp[f].wrapping_offset(ahead).wrapping_add(bytes));
                let w = step32::<KIND>(q.permuted, cp[f], i, lut, &mut nan);
                for r in 0..R {
                    for j in 0..4 {
                        s[f][r] = _mm256_fmadd_ps(_mm256_loadu_ps(xp[r].add(i + 8 * j)), w[j], s[f][r]);
                    }
                }
            }
            i += 32;
        }
        // 8-column steps (segments are multiples of 8 long; never on the
        // permuted nibble path, whose segments are whole groups).
        while i < end {
            for f in 0..F {
                let w = step8::<KIND>(cp[f], i, lut, &mut nan);
                for r in 0..R {
                    s[f][r] = _mm256_fmadd_ps(_mm256_loadu_ps(xp[r].add(i)), w, s[f][r]);
                }
            }
            i += 8;
        }
        for f in 0..F {
            let scale = _mm256_set1_ps(q.factor::<KIND>(f0 + f, idx));
            for r in 0..R {
                let mut sum = s[f][r];
                if KIND == FP8 {
                    sum = _mm256_mul_ps(sum, _mm256_set1_ps(unscale[r0 + r]));
                }
                _mm256_storeu_ps(slot(f, r), _mm256_fmadd_ps(sum, scale, _mm256_loadu_ps(slot(f, r))));
            }
        }
    }
    if KIND == FP8 && _mm256_movemask_epi8(_mm256_cmpeq_epi8(nan, _mm256_set1_epi8(-2))) != 0 {
        // Rare: find the rows that hold a NaN code.
        for f in 0..F {
            if q.codes[f0 + f].iter().any(|&c| c & 0x7f == 0x7f) {
                for r in 0..R {
                    _mm256_storeu_ps(slot(f, r), _mm256_set1_ps(f32::NAN));
                }
            }
        }
    }
}

/// The columns `0..end` (whole 64-column groups) of mxfp4 or int4
/// features `f0..f0 + G` against rows `r0..r0 + R`, in permuted order. A
/// group's 64 codes are shuffled once ([`e2m1_pair`], [`int4_flipped`]);
/// each of its eight vectors is then converted ([`e2m1_lane`],
/// [`int4_lane`]) and multiplied by its scales (lanes 0..4 hold the group's
/// first 32 columns and lanes 4..8 the other 32, each inside one scale
/// block: blocks are multiples of 32 columns, starting on one), which gives
/// the exactly dequantized weights; every row's accumulator takes them by
/// one FMA per vector. The accumulators stay in registers for the whole
/// call, and each (feature, row) adds its columns in the same order
/// whatever `G`, `R` or the call's other rows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn groups64<const KIND: u8, const R: usize, const G: usize>(
    q: &Rows<'_>,
    f0: usize,
    xs: &[&[f32]],
    r0: usize,
    ahead: isize,
    end: usize,
    acc: &mut [f32],
) {
    let m = xs.len();
    let ap = acc.as_mut_ptr();
    let slot = |g: usize, r: usize| ap.add(((f0 + g) * m + r0 + r) * q.acc_stride);
    let mut cp = [std::ptr::null::<u8>(); G];
    let mut total = [[_mm256_setzero_ps(); R]; G];
    for g in 0..G {
        cp[g] = q.codes[f0 + g].as_ptr();
        for r in 0..R {
            total[g][r] = _mm256_loadu_ps(slot(g, r));
        }
    }
    let mut xp = [std::ptr::null::<f32>(); R];
    for r in 0..R {
        xp[r] = xs[r0 + r].as_ptr();
    }
    let mut i = 0;
    while i < end {
        let mut codes = [[_mm256_setzero_si256(); 2]; G];
        let mut scales = [_mm256_setzero_ps(); G];
        for g in 0..G {
            // (With nothing ahead this prefetches the codes about to load:
            // cheaper than a branch.)
            prefetch(cp[g].wrapping_offset(ahead).wrapping_add(i / 2));
            let raw = _mm256_loadu_si256(cp[g].add(i / 2) as *const __m256i);
            codes[g] = if KIND == MXFP4 { e2m1_pair(raw) } else { [int4_flipped(raw), raw] };
            scales[g] = group_scales::<KIND>(q, f0 + g, i);
        }
        for j in 0..8 {
            let mut w = [_mm256_setzero_ps(); G];
            for g in 0..G {
                let v = if KIND == MXFP4 {
                    e2m1_lane(&codes[g], j)
                } else {
                    int4_lane(codes[g][0], j)
                };
                w[g] = _mm256_mul_ps(v, scales[g]);
            }
            for r in 0..R {
                let x = _mm256_loadu_ps(xp[r].add(i + 8 * j));
                for g in 0..G {
                    total[g][r] = _mm256_fmadd_ps(x, w[g], total[g][r]);
                }
            }
        }
        i += 64;
    }
    for g in 0..G {
        for r in 0..R {
            _mm256_storeu_ps(slot(g, r), total[g][r]);
        }
    }
}

/// The scales of feature `f`'s 64-column group at column `i`: lanes 0..4
/// the first 32 columns' block, lanes 4..8 the other's, each times what
/// the codes' decoding leaves over (mxfp4 codes decode to twice their
/// value: half the e8m0 power of two, exact). `accumulate` checked a scale
/// per block of the call's columns; mxfp4 blocks are 32 columns from
/// column 0 (no division).
#[inline(always)]
unsafe fn group_scales<const KIND: u8>(q: &Rows<'_>, f: usize, i: usize) -> __m256 {
    let (a, b) = if KIND == MXFP4 {
        let (e, lo) = (q.e8m0[f], i / formats::MXFP4_BLOCK);
        (
            E8M0[*e.get_unchecked(lo) as usize] * 0.5,
            E8M0[*e.get_unchecked(lo + 1) as usize] * 0.5,
        )
    } else {
        let sc = q.scales[f];
        (
            *sc.get_unchecked((q.lead + i) / q.block),
            *sc.get_unchecked((q.lead + i + 32) / q.block),
        )
    };
    _mm256_set_m128(_mm_set1_ps(b), _mm_set1_ps(a))
}

/// The 32 columns from column `i` of one row (codes at `p`) as four vectors
/// of 8: in column order, or in the permuted order of whole 32-column groups.
/// fp8 also folds the codes into the NaN tracker.
#[inline(always)]
unsafe fn step32<const KIND: u8>(permuted: bool, p: *const u8, i: usize, lut: __m128i, nan: &mut __m256i) -> [__m256; 4] {
    if KIND == FP8 {
        let b = _mm256_loadu_si256(p.add(i) as *const __m256i);
        *nan = _mm256_max_epu8(*nan, _mm256_add_epi8(b, b));
        if permuted {
            return fp8_bytes(b);
        }
        let (lo, hi) = (_mm256_castsi256_si128(b), _mm256_extracti128_si256::<1>(b));
        return [
            fp8_scaled(lo),
            fp8_scaled(_mm_unpackhi_epi64(lo, lo)),
            fp8_scaled(hi),
            fp8_scaled(_mm_unpackhi_epi64(hi, hi)),
        ];
    }
    if !permuted {
        return nibbles32(p.add(i / 2), lut);
    }
    let words = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(i / 2) as *const __m128i));
    if KIND == MXFP4 {
        return [
            e2m1_nibble::<0>(words),
            e2m1_nibble::<1>(words),
            e2m1_nibble::<2>(words),
            e2m1_nibble::<3>(words),
        ];
    }
    let words = _mm256_xor_si256(words, _mm256_set1_epi32(0x8888));
    [
        int4_nibble::<0>(words),
        int4_nibble::<1>(words),
        int4_nibble::<2>(words),
        int4_nibble::<3>(words),
    ]
}

/// The 8 columns from column `i` of one row, in column order.
#[inline(always)]
unsafe fn step8<const KIND: u8>(p: *const u8, i: usize, lut: __m128i, nan: &mut __m256i) -> __m256 {
    if KIND == FP8 {
        let b = _mm_loadl_epi64(p.add(i) as *const __m128i);
        *nan = _mm256_max_epu8(*nan, _mm256_zextsi128_si256(_mm_add_epi8(b, b)));
        return fp8_scaled(b);
    }
    nibbles8(p.add(i / 2), lut)
}

/// Activations for the fused kernel, and per row the factor that undoes
/// their scaling. Codes decode to value x 2^-`code_exp` (fp8 8, mxfp4 -1),
/// so each row is multiplied by a power of two 2^s (exact) that brings its
/// largest magnitude near 2^40, keeping the products x * w x 2^(s - code_exp)
/// clear of f32's subnormal range without any sum overflowing; block sums
/// are multiplied by 2^(code_exp - s) before their scale. `s` is clamped to
/// 0..=125 (rows already past 2^40, or not finite, stay as they are; rows
/// below 2^-86 are lifted as far as f32 allows) and depends on the row
/// alone, keeping results batch-invariant. `code_exp: None` (int4, whose
/// codes decode to their integer values) leaves the values as they are and
/// returns no factors.
///
/// With `permute_cols > 0`, the columns below it are stored in the order
/// the kernel decodes codes in, by groups of `group` columns: 64 for mxfp4
/// and int4 (after the last whole group of 64 a whole group of 32 if one is
/// left), where position `8j + d` of a group holds column `(len / 8) d + j`
/// (code `j` of 32-bit lane `d`, see [`e2m1_pair`] and [`e2m1_nibble`]); 32
/// for fp8, in [`fp8_bytes`]' order ([`permute_fp8_group`]).
pub(crate) fn prescale(x: &crate::Mat, permute_cols: usize, group: usize, code_exp: Option<i32>) -> (Vec<f32>, Vec<f32>) {
    let (m, k) = (x.rows(), x.cols());
    let mut xq = Vec::new();
    line_aligned(&mut xq, m * k);
    let mut unscale = Vec::with_capacity(m);
    for r in 0..m {
        let row = x.row(r);
        let max = row.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let s = if code_exp.is_some() && max.is_finite() && max > 0.0 {
            // Unbiased exponent of the largest magnitude (subnormals count as -127).
            let e = ((max.to_bits() >> 23) & 0xff) as i32 - 127;
            // (At most 125: the unscaling 2^(code exp - shift) stays a normal f32
            // for every format's code exponent, -1 included.)
            (40 - e).clamp(0, 125)
        } else {
            0
        };
        let shift = pow2(s);
        let at = xq.len();
        xq.extend(row.iter().map(|v| v * shift));
        let cols = permute_cols.min(k);
        let wide = if group == 64 { cols / 64 * 64 } else { 0 };
        xq[at..at + wide].chunks_exact_mut(64).for_each(permute_group);
        let narrow = xq[at + wide..at + cols / 32 * 32].chunks_exact_mut(32);
        if group == 32 {
            narrow.for_each(permute_fp8_group);
        } else {
            narrow.for_each(permute_group);
        }
        if let Some(e) = code_exp {
            unscale.push(pow2(e - s));
        }
    }
    (xq, unscale)
}

/// Stores a group of 32 or 64 columns in decoding order: position `8j + d`
/// holds column `(len / 8) d + j`.
fn permute_group(group: &mut [f32]) {
    let mut natural = [0.0f32; 64];
    natural[..group.len()].copy_from_slice(group);
    let per_lane = group.len() / 8;
    for j in 0..per_lane {
        for d in 0..8 {
            group[8 * j + d] = natural[per_lane * d + j];
        }
    }
}

/// Stores a 32-column fp8 group in [`fp8_bytes`]' order: position `8j + d`
/// holds column `16 (j / 2) + 2 d + j % 2`.
fn permute_fp8_group(group: &mut [f32]) {
    let mut natural = [0.0f32; 32];
    natural.copy_from_slice(group);
    for j in 0..4 {
        for d in 0..8 {
            group[8 * j + d] = natural[16 * (j / 2) + 2 * d + j % 2];
        }
    }
}

/// Multiplies `out[r] = xq[r] * scales[column block]` for one block-row's
/// scales (`scales[j]` for columns `j * block..`), the columns being those of
/// a chunk starting at a multiple of `block` (a multiple of 32, so permuted
/// groups never straddle blocks).
/// The scaled rows start at `out[returned..]`, on a cache line.
pub(crate) fn scale_by_blocks(xs: &[&[f32]], scales: &[f32], block: usize, out: &mut Vec<f32>) -> usize {
    let pad = line_aligned(out, xs.iter().map(|x| x.len()).sum());
    for x in xs {
        for (j, cols) in x.chunks(block).enumerate() {
            let s = scales[j];
            out.extend(cols.iter().map(|v| v * s));
        }
    }
    pad
}

/// Empties `v` and makes room for `len` values that start on a cache line
/// (the kernels' 32-byte loads of them then never split a line, which
/// costs a tenth of many-row speed): `v` then holds the returned number
/// (under 16) of unused zeros, and what is pushed next is aligned.
pub(crate) fn line_aligned(v: &mut Vec<f32>, len: usize) -> usize {
    v.clear();
    v.reserve(len + 16);
    let pad = v.as_ptr().align_offset(64).min(15);
    v.resize(pad, 0.0);
    pad
}

/// Whether an fp8 weight's scales allow [`scale_by_blocks`]: all finite and
/// zero or within 2^-60..2^60, so that activations prescaled to below 2^41
/// neither overflow nor lose precision to f32's subnormal range.
pub(crate) fn scales_fold_into_activations(scales: &[f32]) -> bool {
    let (lo, hi) = (pow2(-60), pow2(60));
    scales.iter().all(|s| *s == 0.0 || (lo..=hi).contains(&s.abs()))
}
