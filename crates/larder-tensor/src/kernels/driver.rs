//! The tiling driver of every matrix product, format-agnostic: it cuts the
//! columns into chunks and the output features into tasks (threads) and
//! register blocks, owns the accumulators, and leaves each block's work to
//! the call's [`RowPlan`] (`rows`), then adds the columns past the last
//! whole step and reduces.
//!
//! Accumulators carry over between chunks, so the reduction order per
//! output equals one pass over the whole row whatever the loop order, the
//! thread count or the rows sharing the call.
//!
//! Many rows (a prefill pass: hundreds to thousands) run in row blocks
//! whose activations stay in cache ([`row_block`]), each over every
//! feature: the weights are streamed once per block (cheap next to the
//! block's arithmetic) instead of the activations once per feature block
//! from RAM, with column chunks that shrink as rows grow. Rows share weight
//! loads, never accumulators, so a block's results are the whole call's
//! bit for bit.

use rayon::prelude::*;

use super::rows::{dense_columns, Call, Chunk, RowPlan, Scratch};
use super::{
    Activations, KernelPath, ACTIVATION_CACHE_BYTES, FEATURES_PER_TASK, FEATURE_BLOCK, K_CHUNK, MAX_FEATURES_PER_TASK, MIN_ROW_BLOCK,
    PARALLEL_MIN_ELEMS, TASK_ACC_BYTES,
};
use crate::mat::Mat;
use crate::weight::WeightMatrix;

/// The product, shapes already checked (`x.cols() == w.cols()`).
pub(super) fn matmul_t_checked(path: KernelPath, x: &Mat, w: &WeightMatrix) -> Mat {
    debug_assert_eq!(x.cols(), w.cols());
    let path = if path.is_supported() { path } else { KernelPath::Scalar };
    let (m, n, k) = (x.rows(), w.rows(), w.cols());
    let block = row_block(k, w.dense_dtype().is_none() && path.is_x86_simd());
    if m > block {
        let mut out = Mat::zeros(m, n);
        for r0 in (0..m).step_by(block) {
            let r1 = (r0 + block).min(m);
            let rows = Mat::from_vec(r1 - r0, k, x.as_slice()[r0 * k..r1 * k].to_vec());
            let y = matmul_t_checked(path, &rows, w);
            out.as_mut_slice()[r0 * n..r1 * n].copy_from_slice(y.as_slice());
        }
        return out;
    }
    let mut out = Mat::zeros(m, n);
    if m == 0 || n == 0 {
        return out;
    }
    let plan = RowPlan::new(path, w);
    let k_main = k / plan.step * plan.step;
    let (xq, unscale) = plan.activations(path, x, k_main);
    let xs: Vec<&[f32]> = (0..m).map(|r| x.row(r)).collect();
    let xk: Vec<&[f32]> = if xq.is_empty() {
        xs.clone()
    } else {
        xq[xq.len() - m * k..].chunks_exact(k).collect()
    };
    let x_cached = m * k * 4 <= ACTIVATION_CACHE_BYTES;
    let chunk = plan.chunk(x_cached, k_main);
    let call = Call {
        path,
        rows: w.rows_source(),
        act: Activations {
            unscale: &unscale,
            permuted: plan.permuted,
        },
        row_cap: chunk.max(K_CHUNK),
    };
    let chunks: Vec<Chunk<'_>> = (0..k_main)
        .step_by(chunk)
        .map(|c0| {
            let c1 = (c0 + chunk).min(k_main);
            Chunk {
                c0,
                c1,
                kernel_xs: xk.iter().map(|x| &x[c0..c1]).collect(),
                plain_xs: xs.iter().map(|x| &x[c0..c1]).collect(),
            }
        })
        .collect();
    let tail_xs: Vec<&[f32]> = xs.iter().map(|x| &x[k_main..]).collect();
    // Enough tasks to balance the threads, few enough that per-task set-up
    // stays small next to the weights a task streams, and small enough that
    // a task's accumulators stay in L1/L2.
    let threads = rayon::current_num_threads();
    let acc_cap = (TASK_ACC_BYTES / (m * path.acc_len() * 4)).max(FEATURES_PER_TASK);
    let per_task = n
        .div_ceil(threads * 4)
        .clamp(FEATURES_PER_TASK, acc_cap.min(MAX_FEATURES_PER_TASK))
        .next_multiple_of(FEATURE_BLOCK);
    let task = Task {
        plan: &plan,
        call: &call,
        w,
        m,
        chunks: &chunks,
        tail_xs: &tail_xs,
        x_cached,
        k_main,
    };
    // Computed feature-major ([n, m]) so that each task owns a contiguous block.
    let mut out_t = vec![0.0f32; n * m];
    if n * k >= PARALLEL_MIN_ELEMS && threads > 1 {
        out_t
            .par_chunks_mut(per_task * m)
            .enumerate()
            .for_each(|(ti, block)| task.run(ti * per_task, block));
    } else {
        out_t
            .chunks_mut(per_task * m)
            .enumerate()
            .for_each(|(ti, block)| task.run(ti * per_task, block));
    }
    for f in 0..n {
        for r in 0..m {
            out.row_mut(r)[f] = out_t[f * m + r];
        }
    }
    out
}

/// Rows per row block for rows of `k` columns: as many as keep the
/// block's activations in [`ACTIVATION_CACHE_BYTES`]; for dense weights at
/// least [`MIN_ROW_BLOCK`] (wide rows then also take column chunks), for
/// quantized ones decoded in registers (`fused`: the x86 paths) a multiple
/// of the 4 rows their kernel takes at once, at least 4 (whole rows per
/// feature block measured 8-25 % faster for them than column chunks of more
/// rows, and 15 % slower for bf16; paths that decode into a buffer keep the
/// larger blocks, which decode each weight fewer times).
fn row_block(k: usize, fused: bool) -> usize {
    let cached = ACTIVATION_CACHE_BYTES / (k.max(1) * 4);
    if fused {
        (cached / 4 * 4).max(4)
    } else {
        cached.max(MIN_ROW_BLOCK)
    }
}

/// What every task of a call shares.
struct Task<'a> {
    plan: &'a RowPlan,
    call: &'a Call<'a>,
    w: &'a WeightMatrix,
    m: usize,
    chunks: &'a [Chunk<'a>],
    tail_xs: &'a [&'a [f32]],
    /// Whether the activations stay cached between features.
    x_cached: bool,
    /// Columns in whole steps (the rest is each row's tail).
    k_main: usize,
}

impl Task<'_> {
    /// Computes the features `first..` whose outputs (feature-major, `m`
    /// per feature) are `block`.
    fn run(&self, first: usize, block: &mut [f32]) {
        let (m, path, acc_len) = (self.m, self.call.path, self.call.path.acc_len());
        let features = block.len() / m;
        let mut acc = vec![0.0f32; features * m * acc_len];
        let mut scratch = Scratch::default();
        let blocks: Vec<(usize, usize)> = (0..features)
            .step_by(FEATURE_BLOCK)
            .map(|f0| (f0, (f0 + FEATURE_BLOCK).min(features)))
            .collect();
        let stride = self.call.rows.stride();
        let mut add = |(f0, f1): (usize, usize), ch: &Chunk<'_>| {
            // Where the same columns of the next register block's rows start
            // (relative to these rows), to prefetch while this block computes.
            let ahead = if first + f1 < self.w.rows() {
                ((f1 - f0) * stride) as isize
            } else {
                0
            };
            let a = &mut acc[f0 * m * acc_len..f1 * m * acc_len];
            self.plan.add(self.call, &mut scratch, first, (f0, f1), ch, ahead, a);
        };
        if self.x_cached {
            // The activations stay cached anyway: stream each block of weight
            // rows front to back (what hardware prefetchers follow best).
            for &b in &blocks {
                self.chunks.iter().for_each(|c| add(b, c));
            }
        } else {
            // Many rows: keep one activation chunk cached across all features.
            for c in self.chunks {
                blocks.iter().for_each(|&b| add(b, c));
            }
        }
        if self.k_main == self.w.cols() {
            // No tail: one reduction of every (feature, row) accumulator of the task.
            path.reduce(&acc, block);
            return;
        }
        let k = self.w.cols();
        for (j, outs) in block.chunks_exact_mut(m).enumerate() {
            let a = &acc[j * m * acc_len..(j + 1) * m * acc_len];
            if self.w.dense_dtype().is_none() {
                scratch.decoded.resize(scratch.decoded.len().max(k - self.k_main), 0.0);
            }
            let (dtype, bytes) = dense_columns(path, self.call.rows.row(first + j).slice(self.k_main, k), &mut scratch.decoded);
            path.finish(dtype, bytes, self.tail_xs, a, outs, &mut scratch.buf);
        }
    }
}
