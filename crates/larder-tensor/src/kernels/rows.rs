//! Row strategies: how one register block of weight rows (up to
//! [`FEATURE_BLOCK`]) adds one column chunk into its accumulators, per
//! weight format and path. The tiling driver ([`super::driver`]) owns
//! chunks, tasks, threads and accumulators and knows nothing of formats;
//! a [`RowPlan`] chosen once per call owns everything format-specific: the
//! activations the kernel reads (prescaled or permuted), the chunk unit, and
//! the per-block work.
//!
//! Strategies, each falling back to the next where a chunk's layout does
//! not allow it (the fallbacks are never taken for weights the loaders
//! build, but keep every layout correct):
//! - [`RowStrategy::Dense`]: f32/f16/bf16 bytes straight to the dense kernel;
//! - `Fp8Folded` (x86): fp8 whose block scales fold into the activations,
//!   codes straight to `quant_avx2::accumulate_fp8_folded`;
//! - [`RowStrategy::Fused`] (x86): quantized rows decoded in registers,
//!   each block's scale applied to its block sum (`quant_avx2::accumulate`);
//! - [`RowStrategy::Decoded`]: quantized rows decoded exactly into an
//!   L1-sized f32 buffer, then the dense f32 kernel.

#[cfg(target_arch = "x86_64")]
use super::{blocked, codes_avx2, quant_avx2};
use super::{f32_bytes, Activations, KernelPath, FEATURE_BLOCK, K_CHUNK};
use crate::dtype::WeightDType;
use crate::mat::Mat;
use crate::weight::{RowView, WeightFormat, WeightMatrix, WeightRows};

/// One column range of a call and its activation rows (the driver cuts
/// them; a [`RowPlan`] adds each into its accumulators).
pub(super) struct Chunk<'a> {
    pub c0: usize,
    pub c1: usize,
    /// What the row strategy's kernel reads (prescaled, maybe permuted).
    pub kernel_xs: Vec<&'a [f32]>,
    /// The activations as given.
    pub plain_xs: Vec<&'a [f32]>,
}

/// How a call's register blocks of rows are computed.
#[derive(Clone, Copy)]
pub(super) enum RowStrategy {
    /// Dense rows; bf16 on the x86 paths reads pair-ordered activations.
    Dense { dtype: WeightDType, pairs_bf16: bool },
    /// Block-scaled fp8 whose scales fold into the activations, summed in
    /// pieces of `piece` columns with no scale step.
    #[cfg(target_arch = "x86_64")]
    Fp8Folded { piece: usize, block_rows: usize },
    /// Quantized rows decoded in registers, one scale step per block.
    Fused,
    /// Quantized rows decoded into a buffer first.
    Decoded,
}

/// The strategy of one call and what the driver needs to know of it.
pub(super) struct RowPlan {
    pub strategy: RowStrategy,
    /// The scale block (columns) of fused quantized rows: chunks are whole
    /// blocks, so pieces never depend on the rows of a call.
    fused_block: Option<usize>,
    /// Whether the kernel reads whole 32/64-column groups permuted.
    pub permuted: bool,
    /// Columns per permuted group: mxfp4 and int4 decode 64 per step, fp8 32.
    perm_group: usize,
    /// Columns per main-loop step (the main part of a row is a multiple).
    pub step: usize,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // read by the x86 prescaling only
    format: WeightFormat,
}

impl RowPlan {
    /// The plan for `w` on `path` (a supported path).
    pub(super) fn new(path: KernelPath, w: &WeightMatrix) -> RowPlan {
        let fused_block = fused_block(path, w);
        let permuted = fused_block.is_some_and(|b| b % 32 == 0);
        let perm_group = match w.format() {
            WeightFormat::Fp8Block { .. } => 32,
            _ => 64,
        };
        let strategy = match w.format() {
            WeightFormat::Dense(dtype) => RowStrategy::Dense {
                dtype,
                pairs_bf16: path.pairs_bf16(w.format()),
            },
            #[cfg(target_arch = "x86_64")]
            WeightFormat::Fp8Block { block_rows, block_cols }
                if permuted && block_rows % FEATURE_BLOCK == 0 && fp8_scales_fold(w, block_rows) =>
            {
                RowStrategy::Fp8Folded {
                    piece: K_CHUNK.div_ceil(block_cols) * block_cols,
                    block_rows,
                }
            }
            _ if fused_block.is_some() => RowStrategy::Fused,
            _ => RowStrategy::Decoded,
        };
        RowPlan {
            strategy,
            fused_block,
            permuted,
            perm_group,
            step: path.step_for(w.format()),
            format: w.format(),
        }
    }

    /// The activations the kernel reads when they differ from `x` (else
    /// empty; their rows are the last `x.rows() * x.cols()` values, which
    /// start on a cache line), and per row the factor undoing their
    /// prescaling (else empty).
    /// The fused kernel reads them prescaled, row by row, and for blocks of
    /// whole 32-column groups in its decoding order (`quant_avx2::prescale`);
    /// dense bf16 on the x86 paths in pair order (`blocked::push_pair_order`).
    pub(super) fn activations(&self, path: KernelPath, x: &Mat, k_main: usize) -> (Vec<f32>, Vec<f32>) {
        #[cfg(target_arch = "x86_64")]
        return match self.strategy {
            RowStrategy::Dense { pairs_bf16: true, .. } => {
                let mut xq = Vec::new();
                quant_avx2::line_aligned(&mut xq, x.rows() * x.cols());
                (0..x.rows()).for_each(|r| blocked::push_pair_order(x.row(r), path.step(), &mut xq));
                (xq, Vec::new())
            }
            RowStrategy::Dense { .. } | RowStrategy::Decoded => (Vec::new(), Vec::new()),
            RowStrategy::Fp8Folded { .. } | RowStrategy::Fused => {
                let permute_cols = if self.permuted { k_main } else { 0 };
                quant_avx2::prescale(x, permute_cols, self.perm_group, code_exp(self.format))
            }
        };
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (path, x, k_main);
            (Vec::new(), Vec::new())
        }
    }

    /// Columns per chunk. Rows whose activations stay cached need no
    /// chunking at all (fewer calls) unless they are decoded into a buffer,
    /// one L1-sized chunk at a time; fused rows take whole scale blocks
    /// (permuted chunks also start on a permuted group).
    pub(super) fn chunk(&self, x_cached: bool, k_main: usize) -> usize {
        let dense = matches!(self.strategy, RowStrategy::Dense { .. });
        if x_cached && (dense || self.fused_block.is_some()) {
            k_main.max(1)
        } else if let Some(block) = self.fused_block {
            let unit = if self.permuted && block % self.perm_group != 0 {
                block * self.perm_group / 32
            } else {
                block
            };
            K_CHUNK.div_ceil(unit) * unit
        } else {
            K_CHUNK
        }
    }

    /// Adds one column chunk of the register block of features
    /// `first + f0..first + f1` into their accumulators `acc`; `ahead` is
    /// the byte distance to the same columns of the next block's rows
    /// (prefetched), or 0.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add(
        &self,
        call: &Call<'_>,
        scratch: &mut Scratch,
        first: usize,
        (f0, f1): (usize, usize),
        ch: &Chunk<'_>,
        ahead: isize,
        acc: &mut [f32],
    ) {
        let (path, rows, nf) = (call.path, call.rows, f1 - f0);
        let (c0, c1) = (ch.c0, ch.c1);
        match self.strategy {
            // Dense rows go straight to the kernel (this runs once per 4
            // rows: short rows would feel any set-up here).
            RowStrategy::Dense { dtype, pairs_bf16 } => {
                let mut ws: [&[u8]; FEATURE_BLOCK] = [&[]; FEATURE_BLOCK];
                let size = dtype.size();
                for (slot, f) in ws.iter_mut().zip(f0..f1) {
                    *slot = &rows.row_bytes(first + f)[c0 * size..c1 * size];
                }
                let xs = if pairs_bf16 { &ch.kernel_xs } else { &ch.plain_xs };
                path.accumulate(dtype, &ws[..nf], ahead, xs, acc, &mut scratch.buf);
            }
            #[cfg(target_arch = "x86_64")]
            RowStrategy::Fp8Folded { piece, block_rows } => {
                if !fp8_folded(call, scratch, first, (f0, f1), ch, piece, block_rows, ahead, acc) {
                    self.add_quantized(call, scratch, first, (f0, f1), ch, ahead, acc);
                }
            }
            RowStrategy::Fused | RowStrategy::Decoded => self.add_quantized(call, scratch, first, (f0, f1), ch, ahead, acc),
        }
    }

    /// Quantized rows: fused where the path and layout allow, else decoded.
    #[allow(clippy::too_many_arguments)]
    fn add_quantized(
        &self,
        call: &Call<'_>,
        scratch: &mut Scratch,
        first: usize,
        (f0, f1): (usize, usize),
        ch: &Chunk<'_>,
        ahead: isize,
        acc: &mut [f32],
    ) {
        let (path, nf) = (call.path, f1 - f0);
        let mut views = [RowView::Dense {
            dtype: WeightDType::F32,
            bytes: &[],
        }; FEATURE_BLOCK];
        for (v, f) in views.iter_mut().zip(f0..f1) {
            *v = call.rows.row(first + f).slice(ch.c0, ch.c1);
        }
        if fused_quantized(path, &views[..nf], ahead, &ch.kernel_xs, call.act, acc) {
            return;
        }
        let mut ws: [&[u8]; FEATURE_BLOCK] = [&[]; FEATURE_BLOCK];
        let mut dtype = WeightDType::F32;
        scratch.decoded.resize(FEATURE_BLOCK * call.row_cap, 0.0);
        let mut bufs = scratch.decoded.chunks_mut(call.row_cap);
        for (slot, v) in ws.iter_mut().zip(&views[..nf]) {
            (dtype, *slot) = dense_columns(path, *v, bufs.next().unwrap_or(&mut []));
        }
        path.accumulate(dtype, &ws[..nf], ahead, &ch.plain_xs, acc, &mut scratch.buf);
    }
}

/// What every register block of a call shares.
pub(super) struct Call<'a> {
    pub path: KernelPath,
    pub rows: WeightRows<'a>,
    pub act: Activations<'a>,
    /// Columns of each decoded row in [`Scratch::decoded`] (sized for a
    /// chunk, so also for a refused fused chunk).
    pub row_cap: usize,
}

/// One task's scratch buffers, allocated on first use only: dense and fused
/// rows never need them, and zeroing them per task would cost as much as
/// small rows' weights.
#[derive(Default)]
pub(super) struct Scratch {
    /// Widened dense rows of the paths that widen first.
    pub buf: Vec<f32>,
    /// Decoded quantized rows of one register block (or one tail).
    pub decoded: Vec<f32>,
    /// Block-scaled fp8 activations of one block-row and chunk, and which
    /// (block-row, first column).
    #[cfg(target_arch = "x86_64")]
    scaled_x: Vec<f32>,
    #[cfg(target_arch = "x86_64")]
    scaled_pad: usize,
    #[cfg(target_arch = "x86_64")]
    scaled_for: Option<(usize, usize)>,
}

/// [`RowStrategy::Fp8Folded`]: the block-row's activations scaled once per
/// (block-row, chunk), then the codes straight to the kernel, as dense rows.
/// `false` where the kernel refused the sizes (nothing computed).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn fp8_folded(
    call: &Call<'_>,
    scratch: &mut Scratch,
    first: usize,
    (f0, f1): (usize, usize),
    ch: &Chunk<'_>,
    piece: usize,
    block_rows: usize,
    ahead: isize,
    acc: &mut [f32],
) -> bool {
    let (c0, c1, m) = (ch.c0, ch.c1, ch.kernel_xs.len());
    let block_row = (first + f0) / block_rows;
    if scratch.scaled_for != Some((block_row, c0)) {
        if let RowView::Fp8 { scales, block_cols, .. } = call.rows.row(first + f0).slice(c0, c1) {
            scratch.scaled_pad = quant_avx2::scale_by_blocks(&ch.kernel_xs, scales, block_cols, &mut scratch.scaled_x);
        }
        scratch.scaled_for = Some((block_row, c0));
    }
    let mut codes: [&[u8]; FEATURE_BLOCK] = [&[]; FEATURE_BLOCK];
    for (slot, f) in codes.iter_mut().zip(f0..f1) {
        *slot = &call.rows.row_bytes(first + f)[c0..c1];
    }
    // Row slices on the stack for the usual few rows.
    let (mut few, many): ([&[f32]; 8], Vec<&[f32]>);
    let sx: &[&[f32]] = if m <= 8 {
        few = [&[]; 8];
        for (slot, row) in few.iter_mut().zip(scratch.scaled_x[scratch.scaled_pad..].chunks_exact(c1 - c0)) {
            *slot = row;
        }
        &few[..m]
    } else {
        many = scratch.scaled_x[scratch.scaled_pad..].chunks_exact(c1 - c0).collect();
        &many
    };
    let path = call.path;
    // SAFETY: both x86 paths imply AVX2, FMA and F16C (the driver checked
    // `is_supported`); the codes and `sx` rows hold the chunk's columns;
    // the kernel checks `acc` against the stride.
    path.is_x86_simd()
        && unsafe { quant_avx2::accumulate_fp8_folded(&codes[..f1 - f0], piece, ahead, sx, call.act.unscale, acc, path.acc_len()) }
}

/// Adds one chunk of quantized rows with the decoding fused into the dot
/// product (x86-64 paths: codes become f32 in registers, each block's scale
/// applied to its block sum; see `quant_avx2`). Returns `false`, having done
/// nothing, where the path or layout does not allow it (the caller then
/// decodes into a buffer): other paths, blocks not a multiple of 8 columns.
fn fused_quantized(path: KernelPath, views: &[RowView<'_>], ahead: isize, xs: &[&[f32]], act: Activations<'_>, acc: &mut [f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if path.is_x86_simd() {
        // SAFETY: both paths imply AVX2, FMA and F16C (the caller checked
        // `is_supported`); every view holds the chunk's columns, as does
        // every `xs[r]`; `accumulate` checks `acc` against the stride.
        return unsafe { quant_avx2::accumulate(views, ahead, xs, act, acc, path.acc_len()) };
    }
    let _ = (path, views, ahead, xs, act, acc);
    false
}

/// The scale block (columns) of a quantized `w` that `path` computes fused
/// (every chunk then goes through [`fused_quantized`], so chunks need not fit
/// the decode buffer); `None` for dense weights and other paths.
fn fused_block(path: KernelPath, w: &WeightMatrix) -> Option<usize> {
    let block = match w.format() {
        WeightFormat::Fp8Block { block_cols, .. } => block_cols,
        WeightFormat::Mxfp4 => crate::formats::MXFP4_BLOCK,
        WeightFormat::Int4Group { group } => group,
        WeightFormat::Dense(_) => return None,
    };
    (cfg!(target_arch = "x86_64") && path.is_x86_simd() && block % 8 == 0).then_some(block)
}

/// The power of two the fused kernel's fp8 codes come scaled by
/// (`quant_avx2::prescale`); mxfp4 and int4 are dequantized exactly in
/// registers, their activations only permuted.
#[cfg(target_arch = "x86_64")]
fn code_exp(format: WeightFormat) -> Option<i32> {
    match format {
        WeightFormat::Fp8Block { .. } => Some(codes_avx2::FP8_CODE_EXP),
        _ => None,
    }
}

/// Whether every scale of an fp8 weight can be folded into activations
/// (`quant_avx2::scales_fold_into_activations`), checked per block-row.
#[cfg(target_arch = "x86_64")]
fn fp8_scales_fold(w: &WeightMatrix, block_rows: usize) -> bool {
    let rows = w.rows_source();
    (0..w.rows()).step_by(block_rows).all(|r| match rows.row(r) {
        RowView::Fp8 { scales, .. } => quant_avx2::scales_fold_into_activations(scales),
        _ => false,
    })
}

/// Some columns of a weight row as dense elements: the stored bytes of a
/// dense format, or the exact f32 decoding of a quantized one (into `buf`,
/// which holds at least as many values as the view has columns).
pub(super) fn dense_columns<'a>(path: KernelPath, view: RowView<'a>, buf: &'a mut [f32]) -> (WeightDType, &'a [u8]) {
    match view {
        RowView::Dense { dtype, bytes } => (dtype, bytes),
        RowView::Fp8 { codes, .. } => decoded(path, view, &mut buf[..codes.len()]),
        RowView::Mxfp4 { blocks, .. } => decoded(path, view, &mut buf[..blocks.len() * 2]),
        RowView::Int4 { packed, .. } => decoded(path, view, &mut buf[..packed.len() * 2]),
    }
}

fn decoded<'a>(path: KernelPath, view: RowView<'_>, out: &'a mut [f32]) -> (WeightDType, &'a [u8]) {
    path.decode(view, out);
    (WeightDType::F32, f32_bytes(out))
}
