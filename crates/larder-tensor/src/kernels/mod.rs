//! Weight-format matrix products: `y = x W^T` for one row (GEMV) or a few
//! rows (GEMM) of f32 activations against a [`WeightMatrix`] in its shipped
//! format.
//!
//! One dispatch point ([`KernelPath`]) picks the ISA file: [`scalar`] (the
//! reference, always available), `avx2` (AVX2+FMA+F16C), `avx512`
//! (AVX-512F/BW) on x86-64, `neon` on aarch64. Detection runs once at first
//! use; `LARDER_KERNEL=scalar|avx2|avx512|neon` forces a path (tests use it to
//! compare paths). A path this CPU lacks, or an unknown name, is an error of
//! [`kernel_from_env`] (the `larder` binary refuses to start); library users
//! that never call it get the best available path with a warning, never a
//! silent scalar fallback.
//!
//! The AVX-512 path is **opt-in** (`LARDER_KERNEL=avx512`): the machines this
//! project is developed on have no AVX-512. The same tests cover it wherever
//! the CPU has it, and CI runs them on an emulated Skylake-X
//! (`scripts/emulated_avx512.sh`), but an emulator says nothing about speed,
//! so it is not chosen automatically until measured on such hardware.
//!
//! Dense f32/f16/bf16 rows are widened in registers inside the dot product
//! (bf16 on x86-64 a pair of columns per 32-bit lane, the activations
//! permuted once per call to match; see `blocked`).
//! Quantized rows (fp8, mxfp4, int4) are decoded in registers too on x86-64
//! (`quant_avx2`, each block's scale applied to its block sum; the AVX-512
//! path runs the same 8-lane kernel, every AVX-512 CPU having AVX2, into the
//! first 8 of its 16 accumulator slots); elsewhere they are decoded exactly
//! into an f32 row buffer (hot in L1/L2) and go through the f32 kernel.
//!
//! Guarantees, which tests assert:
//! - **deterministic**: every output element is one dot product with a fixed
//!   reduction order for its path, whatever the thread count;
//! - **batch-invariant**: a row's outputs are bit-identical whether computed
//!   alone or among up to 64 other rows (rows share weight loads, never
//!   accumulators);
//! - each weight row is read from memory once per call, for all activation rows;
//! - every SIMD path matches the scalar reference within
//!   `1e-5 * sum_i |x_i * w_i|` per element (f32 reassociation only).
//!
//! Not used, on purpose: AVX512_BF16 `vdpbf16ps` and AMX `tdpbf16ps` multiply
//! bf16 by bf16, which would round the f32 activations to bf16 and break the
//! rule that activations stay f32 (an exact three-way bf16 split of each
//! activation costs `vdpbf16ps` more than it saves; docs/kernels.md).

pub mod scalar;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod blocked;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod quant_avx2;

use std::sync::OnceLock;

use rayon::prelude::*;

use crate::dtype::WeightDType;
use crate::mat::Mat;
use crate::weight::{RowView, WeightFormat, WeightMatrix};

/// Fewest output features handled by one parallel task.
const FEATURES_PER_TASK: usize = 16; // a multiple of FEATURE_BLOCK
/// Most output features handled by one parallel task.
const MAX_FEATURES_PER_TASK: usize = 256;
/// Bytes of accumulators one task may keep (they stay in L1).
const TASK_ACC_BYTES: usize = 32 << 10;
/// Weight rows multiplied together by one kernel call (a register block).
const FEATURE_BLOCK: usize = 4;
/// Columns per chunk: a multiple of every path's step and of 32 (mxfp4 blocks).
const K_CHUNK: usize = 512;
/// Activations up to this size are assumed to stay in L2 between features.
const ACTIVATION_CACHE_BYTES: usize = 256 << 10;
/// Below this many weight elements a call runs on the calling thread
/// (scheduling would cost more than it saves).
const PARALLEL_MIN_ELEMS: usize = 1 << 16;

/// An implementation of the dot-product kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelPath {
    Scalar,
    Avx2,
    Avx512,
    Neon,
}

impl KernelPath {
    pub fn name(self) -> &'static str {
        match self {
            KernelPath::Scalar => "scalar",
            KernelPath::Avx2 => "avx2",
            KernelPath::Avx512 => "avx512",
            KernelPath::Neon => "neon",
        }
    }

    /// Whether this CPU can run the path.
    pub fn is_supported(self) -> bool {
        match self {
            KernelPath::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c"),
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx512 => {
                is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") && KernelPath::Avx2.is_supported()
            }
            #[cfg(target_arch = "aarch64")]
            KernelPath::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Every path this CPU supports, best last.
    pub fn available() -> Vec<KernelPath> {
        [KernelPath::Scalar, KernelPath::Neon, KernelPath::Avx2, KernelPath::Avx512]
            .into_iter()
            .filter(|p| p.is_supported())
            .collect()
    }

    /// The path named `s` (as [`name`](Self::name) gives it), available or not.
    pub fn from_name(s: &str) -> Option<KernelPath> {
        [KernelPath::Scalar, KernelPath::Avx2, KernelPath::Avx512, KernelPath::Neon]
            .into_iter()
            .find(|p| p.name() == s)
    }

    /// Elements per main-loop step (chunks are multiples of it).
    fn step(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx512 => avx512::STEP,
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx2 => avx2::STEP,
            #[cfg(target_arch = "aarch64")]
            KernelPath::Neon => neon::STEP,
            _ => scalar::STEP,
        }
    }

    /// Elements per main-loop step for weights stored as `format` (column
    /// chunks and the main part of a row are multiples of it; bf16 steps on
    /// the x86 paths are two vectors wide).
    fn step_for(self, format: WeightFormat) -> usize {
        match format {
            #[cfg(target_arch = "x86_64")]
            WeightFormat::Dense(dtype) if self.is_x86_simd() => blocked::step(dtype, self.step()),
            _ => self.step(),
        }
    }

    /// Whether dense rows of `format` take their activations in
    /// `blocked::push_pair_order` (bf16 on the x86 paths).
    fn pairs_bf16(self, format: WeightFormat) -> bool {
        cfg!(target_arch = "x86_64") && self.is_x86_simd() && format == WeightFormat::Dense(WeightDType::BF16)
    }

    /// f32 accumulator slots per (row, feature).
    fn acc_len(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx512 => avx512::ACC,
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx2 => avx2::ACC,
            #[cfg(target_arch = "aarch64")]
            KernelPath::Neon => neon::ACC,
            _ => scalar::ACC,
        }
    }

    /// Adds one chunk (the columns of `xs[r]`, a multiple of
    /// [`step`](Self::step)) of up to [`FEATURE_BLOCK`] dense weight rows into
    /// the accumulators of every (feature, row), laid out
    /// `acc[(f * rows + r) * acc_len..]`; `ahead` is the byte distance to the
    /// rows a register block later (prefetched), or 0.
    fn accumulate(self, dtype: WeightDType, ws: &[&[u8]], ahead: isize, xs: &[&[f32]], acc: &mut [f32], buf: &mut Vec<f32>) {
        let len = xs.first().map_or(0, |x| x.len());
        #[cfg(not(target_arch = "x86_64"))]
        let _ = ahead; // only the x86 paths prefetch
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the path is only used when `is_supported` confirmed the CPU features.
            KernelPath::Avx512 => unsafe { avx512::accumulate(dtype, ws, ahead, xs, len, acc) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            KernelPath::Avx2 => unsafe { avx2::accumulate(dtype, ws, ahead, xs, len, acc) },
            _ => {
                buf.resize(ws.len() * len, 0.0);
                for (w, b) in ws.iter().zip(buf.chunks_exact_mut(len)) {
                    dtype.decode_into(w, b);
                }
                let wide: Vec<&[f32]> = buf.chunks_exact(len).collect();
                match self {
                    #[cfg(target_arch = "aarch64")]
                    // SAFETY: as above.
                    KernelPath::Neon => unsafe { neon::accumulate_features(&wide, xs, len, acc) },
                    _ => scalar::accumulate_features(&wide, xs, len, acc),
                }
            }
        }
    }

    /// Adds the last `< step` elements and reduces the accumulators into `out`.
    fn finish(self, dtype: WeightDType, w: &[u8], xs: &[&[f32]], acc: &[f32], out: &mut [f32], buf: &mut Vec<f32>) {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as in `accumulate`.
            KernelPath::Avx512 => unsafe { avx512::finish(dtype, w, xs, acc, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as in `accumulate`.
            KernelPath::Avx2 => unsafe { avx2::finish(dtype, w, xs, acc, out) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: as in `accumulate`.
            KernelPath::Neon => unsafe { neon::finish_f32(widen(dtype, w, buf), xs, acc, out) },
            _ => scalar::finish(widen(dtype, w, buf), xs, acc, out),
        }
    }
}

impl KernelPath {
    /// Reduces accumulators into `out` (one per (feature, row), laid out as
    /// for [`finish`](Self::finish)), bit-identical to `finish` with no tail.
    fn reduce(self, acc: &[f32], out: &mut [f32]) {
        debug_assert!(acc.len() >= out.len() * self.acc_len());
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as in `accumulate`; `acc` holds an accumulator per output.
            KernelPath::Avx512 => unsafe { avx512::reduce(acc, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            KernelPath::Avx2 => unsafe { avx2::reduce(acc, out) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: as above.
            KernelPath::Neon => unsafe { neon::reduce(acc, out) },
            _ => scalar::reduce(acc, out),
        }
    }

    /// The x86-64 SIMD paths (both imply AVX2, FMA and F16C): they decode
    /// quantized rows with the AVX2 decoders and multiply them fused
    /// (`quant_avx2`).
    pub(crate) fn is_x86_simd(self) -> bool {
        matches!(self, KernelPath::Avx2 | KernelPath::Avx512)
    }

    /// Decodes a stored row exactly (SIMD where the path has a decoder).
    pub fn decode(self, view: RowView<'_>, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.is_x86_simd() && self.is_supported() {
            // SAFETY: both paths imply AVX2 + F16C, checked by `is_supported`.
            if unsafe { avx2::decode(view, out) } {
                return;
            }
        }
        crate::formats::decode_row(view, out);
    }
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

/// [`fused_quantized`] for block-scaled fp8 rows whose scales come folded
/// into `xs` (`quant_avx2::accumulate_fp8_folded`), given as their codes.
#[cfg(target_arch = "x86_64")]
fn fused_fp8_folded(
    path: KernelPath,
    codes: &[&[u8]],
    piece: usize,
    ahead: isize,
    xs: &[&[f32]],
    unscale: &[f32],
    acc: &mut [f32],
) -> bool {
    // SAFETY: as in `fused_quantized`.
    path.is_x86_simd() && unsafe { quant_avx2::accumulate_fp8_folded(codes, piece, ahead, xs, unscale, acc, path.acc_len()) }
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
fn dense_columns<'a>(path: KernelPath, view: RowView<'a>, buf: &'a mut [f32]) -> (WeightDType, &'a [u8]) {
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

/// Widens dense bytes into `buf` (f32 rows are copied so alignment never matters).
fn widen<'a>(dtype: WeightDType, w: &[u8], buf: &'a mut Vec<f32>) -> &'a [f32] {
    let k = w.len() / dtype.size();
    buf.resize(k, 0.0);
    dtype.decode_into(w, buf);
    buf
}

/// The path this process uses (detected once; `LARDER_KERNEL` overrides).
/// A `LARDER_KERNEL` that [`kernel_from_env`] refuses gives the best
/// available path, with a warning on stderr.
pub fn active_path() -> KernelPath {
    static PATH: OnceLock<KernelPath> = OnceLock::new();
    *PATH.get_or_init(|| {
        kernel_from_env().unwrap_or_else(|e| {
            let best = default_path();
            eprintln!("larder: warning: {e}; using the {} path", best.name());
            best
        })
    })
}

/// The best verified path of this CPU: what runs without `LARDER_KERNEL`
/// (AVX-512 is opt-in, see the module notes).
pub fn default_path() -> KernelPath {
    KernelPath::available()
        .into_iter()
        .rfind(|p| *p != KernelPath::Avx512)
        .unwrap_or(KernelPath::Scalar)
}

/// The path `LARDER_KERNEL` asks for ([`default_path`] when unset or empty),
/// or an error naming the variable, the value and the paths this CPU has.
pub fn kernel_from_env() -> Result<KernelPath, KernelEnvError> {
    match std::env::var("LARDER_KERNEL") {
        Ok(v) => kernel_from_value(&v),
        Err(std::env::VarError::NotPresent) => Ok(default_path()),
        Err(std::env::VarError::NotUnicode(v)) => kernel_from_value(&v.to_string_lossy()),
    }
}

/// [`kernel_from_env`] for a given `LARDER_KERNEL` value.
pub fn kernel_from_value(value: &str) -> Result<KernelPath, KernelEnvError> {
    if value.is_empty() {
        return Ok(default_path());
    }
    let available = KernelPath::available().iter().map(|p| p.name()).collect::<Vec<_>>().join(", ");
    match KernelPath::from_name(value) {
        Some(p) if p.is_supported() => Ok(p),
        Some(_) => Err(KernelEnvError::Unsupported {
            requested: value.to_string(),
            available,
        }),
        None => Err(KernelEnvError::Unknown {
            requested: value.to_string(),
            available,
        }),
    }
}

/// Why `LARDER_KERNEL` cannot be honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelEnvError {
    #[error("LARDER_KERNEL={requested}: this CPU cannot run the {requested} kernel path (it has: {available}); unset LARDER_KERNEL or set one of those")]
    Unsupported { requested: String, available: String },
    #[error("LARDER_KERNEL={requested:?} is not a kernel path (valid values: scalar, avx2, avx512, neon; this CPU has: {available})")]
    Unknown { requested: String, available: String },
}

/// Errors of the kernels' checked entry points ([`try_matmul_t`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    #[error(
        "activations of width {activation_cols} against a {weight_rows}x{weight_cols} {format} weight (it takes {weight_cols} inputs)"
    )]
    Shape {
        activation_cols: usize,
        weight_rows: usize,
        weight_cols: usize,
        format: WeightFormat,
    },
}

/// `x [m, k] * W^T` where `W` is `[n, k]`: returns `[m, n]`, on the active
/// path; an error, computing nothing, where `x`'s width is not `W`'s input width.
pub fn try_matmul_t(x: &Mat, w: &WeightMatrix) -> Result<Mat, KernelError> {
    try_matmul_t_with(active_path(), x, w)
}

/// [`try_matmul_t`] on a given path (tests and benchmarks compare paths).
pub fn try_matmul_t_with(path: KernelPath, x: &Mat, w: &WeightMatrix) -> Result<Mat, KernelError> {
    check_width(x, w)?;
    Ok(matmul_t_checked(path, x, w))
}

/// Whether `x` is as wide as `w` takes inputs.
pub(crate) fn check_width(x: &Mat, w: &WeightMatrix) -> Result<(), KernelError> {
    if x.cols() == w.cols() {
        return Ok(());
    }
    Err(KernelError::Shape {
        activation_cols: x.cols(),
        weight_rows: w.rows(),
        weight_cols: w.cols(),
        format: w.format(),
    })
}

/// [`try_matmul_t`] for callers whose shapes were checked when the model
/// loaded.
///
/// # Panics
/// If `x.cols() != w.cols()`.
pub fn matmul_t(x: &Mat, w: &WeightMatrix) -> Mat {
    matmul_t_with(active_path(), x, w)
}

/// [`matmul_t`] on a given path.
///
/// # Panics
/// If `x.cols() != w.cols()`.
pub fn matmul_t_with(path: KernelPath, x: &Mat, w: &WeightMatrix) -> Mat {
    try_matmul_t_with(path, x, w).unwrap_or_else(|e| panic!("matmul_t: {e}"))
}

/// The product, shapes already checked (`x.cols() == w.cols()`).
fn matmul_t_checked(path: KernelPath, x: &Mat, w: &WeightMatrix) -> Mat {
    debug_assert_eq!(x.cols(), w.cols());
    let path = if path.is_supported() { path } else { KernelPath::Scalar };
    let (m, n, k) = (x.rows(), w.rows(), w.cols());
    let mut out = Mat::zeros(m, n);
    if m == 0 || n == 0 {
        return out;
    }
    let xs: Vec<&[f32]> = (0..m).map(|r| x.row(r)).collect();
    let w_rows = w.rows_source();
    // The fused quantized kernel reads its activations prescaled, row by
    // row, and for blocks of whole 32-column groups in its decoding order,
    // by groups of 32 or 64 columns (`quant_avx2::prescale`); everything
    // else reads them as they are.
    let (step, acc_len) = (path.step_for(w.format()), path.acc_len());
    let k_main = k / step * step;
    let fused_block = fused_block(path, w);
    let permuted = fused_block.is_some_and(|b| b % 32 == 0);
    // Columns per permuted group: mxfp4 and int4 decode 64 per step, fp8 32.
    let perm_group = match w.format() {
        WeightFormat::Fp8Block { .. } => 32,
        _ => 64,
    };
    // Dense bf16 rows on the x86 paths widen weight pairs into even and odd
    // lanes; their activations come in the same order.
    let pairs_bf16 = path.pairs_bf16(w.format());
    #[cfg(target_arch = "x86_64")]
    let (xq, unscale) = match w.format() {
        _ if pairs_bf16 => {
            let mut xq = Vec::with_capacity(m * k);
            (0..m).for_each(|r| blocked::push_pair_order(x.row(r), path.step(), &mut xq));
            (xq, Vec::new())
        }
        _ if fused_block.is_none() => (Vec::new(), Vec::new()),
        format => {
            let code_exp = match format {
                WeightFormat::Fp8Block { .. } => Some(120),
                WeightFormat::Mxfp4 => Some(126),
                _ => None,
            };
            quant_avx2::prescale(x, if permuted { k_main } else { 0 }, perm_group, code_exp)
        }
    };
    #[cfg(not(target_arch = "x86_64"))]
    let (xq, unscale): (Vec<f32>, Vec<f32>) = (Vec::new(), Vec::new());
    let xk: Vec<&[f32]> = if xq.is_empty() { xs.clone() } else { xq.chunks_exact(k).collect() };
    // fp8 with 2-D blocks whose scales fold safely into the activations: the
    // activations of each block-row are multiplied by its column blocks'
    // scales once (`quant_avx2::scale_by_blocks`), and rows are summed in
    // pieces of this many columns with factor 1 instead of one piece per
    // scale block (`quant_avx2::accumulate_fp8_folded`).
    #[cfg(target_arch = "x86_64")]
    let block_scaled = match w.format() {
        WeightFormat::Fp8Block { block_rows, block_cols }
            if permuted && block_rows % FEATURE_BLOCK == 0 && fp8_scales_fold(w, block_rows) =>
        {
            Some(K_CHUNK.div_ceil(block_cols) * block_cols)
        }
        _ => None,
    };
    let act = Activations {
        unscale: &unscale,
        permuted,
    };
    // Rows whose activations stay cached need no chunking at all (fewer
    // calls) unless they are decoded into a buffer, one L1-sized chunk at a
    // time.
    let x_cached = m * k * 4 <= ACTIVATION_CACHE_BYTES;
    let chunk = if x_cached && (w.dense_dtype().is_some() || fused_block.is_some()) {
        k_main.max(1)
    } else if let Some(block) = fused_block {
        // Whole scale blocks: the fused kernel applies a scale once per
        // block piece, so pieces must not depend on the chunking; permuted
        // chunks also start on a permuted group.
        let unit = if permuted && block % perm_group != 0 {
            block * perm_group / 32
        } else {
            block
        };
        K_CHUNK.div_ceil(unit) * unit
    } else {
        K_CHUNK
    };
    // Decoded rows of one register block (also the fallback should a fused
    // chunk be refused, so sized for the chunk).
    let row_cap = chunk.max(K_CHUNK);
    // Column chunks with the kernel's and the plain activations (the same
    // unless quantized rows are fused); accumulators carry over between
    // chunks, so the reduction order equals one pass over the whole row
    // whatever the loop order below.
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
    let acc_cap = (TASK_ACC_BYTES / (m * acc_len * 4)).max(FEATURES_PER_TASK);
    let per_task = n
        .div_ceil(threads * 4)
        .clamp(FEATURES_PER_TASK, acc_cap.min(MAX_FEATURES_PER_TASK))
        .next_multiple_of(FEATURE_BLOCK);
    // Computed feature-major ([n, m]) so that each task owns a contiguous block.
    let mut out_t = vec![0.0f32; n * m];
    let task = |(ti, block): (usize, &mut [f32])| {
        let first = ti * per_task;
        let features = block.len() / m;
        let mut acc = vec![0.0f32; features * m * acc_len];
        let mut buf = Vec::new();
        // Allocated on first use only: dense and fused rows never need it,
        // and zeroing it per task would cost as much as small rows' weights.
        let mut decoded: Vec<f32> = Vec::new();
        // Block-scaled fp8 activations of one block-row and chunk, and which.
        #[cfg(target_arch = "x86_64")]
        let mut scaled_x: Vec<f32> = Vec::new();
        #[cfg(target_arch = "x86_64")]
        let mut scaled_for: Option<(usize, usize)> = None; // (block-row, first column)
        let blocks: Vec<(usize, usize)> = (0..features)
            .step_by(FEATURE_BLOCK)
            .map(|f0| (f0, (f0 + FEATURE_BLOCK).min(features)))
            .collect();
        // Adds one column chunk of one block of features.
        let mut add = |(f0, f1): (usize, usize), ch: &Chunk<'_>| {
            let (c0, c1) = (&ch.c0, &ch.c1);
            let a = &mut acc[f0 * m * acc_len..f1 * m * acc_len];
            // Where the same columns of the next register block's rows start
            // (relative to these rows), to prefetch while this block computes.
            let ahead = if first + f1 < w.rows() {
                ((f1 - f0) * w_rows.stride()) as isize
            } else {
                0
            };
            // Dense rows go straight to the kernel (this runs once per 4 rows:
            // short rows would feel any set-up here).
            if let Some(dtype) = w.dense_dtype() {
                let mut ws: [&[u8]; FEATURE_BLOCK] = [&[]; FEATURE_BLOCK];
                let size = dtype.size();
                for (slot, f) in ws.iter_mut().zip(f0..f1) {
                    *slot = &w_rows.row_bytes(first + f)[c0 * size..c1 * size];
                }
                let dense_xs = if pairs_bf16 { &ch.kernel_xs } else { &ch.plain_xs };
                path.accumulate(dtype, &ws[..f1 - f0], ahead, dense_xs, a, &mut buf);
                return;
            }
            // Block-scaled fp8 (its scales folded into the activations): the
            // codes straight to the kernel, as dense rows.
            #[cfg(target_arch = "x86_64")]
            if let (Some(piece), WeightFormat::Fp8Block { block_rows, .. }) = (block_scaled, w.format()) {
                let block_row = (first + f0) / block_rows;
                if scaled_for != Some((block_row, *c0)) {
                    if let RowView::Fp8 { scales, block_cols, .. } = w_rows.row(first + f0).slice(*c0, *c1) {
                        quant_avx2::scale_by_blocks(&ch.kernel_xs, scales, block_cols, &mut scaled_x);
                    }
                    scaled_for = Some((block_row, *c0));
                }
                let mut codes: [&[u8]; FEATURE_BLOCK] = [&[]; FEATURE_BLOCK];
                for (slot, f) in codes.iter_mut().zip(f0..f1) {
                    *slot = &w_rows.row_bytes(first + f)[*c0..*c1];
                }
                // Row slices on the stack for the usual few rows.
                let (mut few, many): ([&[f32]; 8], Vec<&[f32]>);
                let sx: &[&[f32]] = if m <= 8 {
                    few = [&[]; 8];
                    for (slot, row) in few.iter_mut().zip(scaled_x.chunks_exact(c1 - c0)) {
                        *slot = row;
                    }
                    &few[..m]
                } else {
                    many = scaled_x.chunks_exact(c1 - c0).collect();
                    &many
                };
                if fused_fp8_folded(path, &codes[..f1 - f0], piece, ahead, sx, act.unscale, a) {
                    return;
                }
            }
            let mut views = [RowView::Dense {
                dtype: WeightDType::F32,
                bytes: &[],
            }; FEATURE_BLOCK];
            for (v, f) in views.iter_mut().zip(f0..f1) {
                *v = w_rows.row(first + f).slice(*c0, *c1);
            }
            if fused_quantized(path, &views[..f1 - f0], ahead, &ch.kernel_xs, act, a) {
                return;
            }
            let mut ws: [&[u8]; FEATURE_BLOCK] = [&[]; FEATURE_BLOCK];
            let mut dtype = WeightDType::F32;
            if w.dense_dtype().is_none() {
                decoded.resize(FEATURE_BLOCK * row_cap, 0.0);
            }
            let mut bufs = decoded.chunks_mut(row_cap);
            for (slot, v) in ws.iter_mut().zip(&views[..f1 - f0]) {
                (dtype, *slot) = dense_columns(path, *v, bufs.next().unwrap_or(&mut []));
            }
            path.accumulate(dtype, &ws[..f1 - f0], ahead, &ch.plain_xs, a, &mut buf);
        };
        if x_cached {
            // The activations stay cached anyway: stream each block of weight
            // rows front to back (what hardware prefetchers follow best).
            for &b in &blocks {
                chunks.iter().for_each(|c| add(b, c));
            }
        } else {
            // Many rows: keep one activation chunk cached across all features.
            for c in &chunks {
                blocks.iter().for_each(|&b| add(b, c));
            }
        }
        if k_main == k {
            // No tail: one reduction of every (feature, row) accumulator of the task.
            path.reduce(&acc, block);
            return;
        }
        for (j, outs) in block.chunks_exact_mut(m).enumerate() {
            let a = &acc[j * m * acc_len..(j + 1) * m * acc_len];
            if w.dense_dtype().is_none() {
                decoded.resize(decoded.len().max(k - k_main), 0.0);
            }
            let (dtype, bytes) = dense_columns(path, w_rows.row(first + j).slice(k_main, k), &mut decoded);
            path.finish(dtype, bytes, &tail_xs, a, outs, &mut buf);
        }
    };
    if n * k >= PARALLEL_MIN_ELEMS && threads > 1 {
        out_t.par_chunks_mut(per_task * m).enumerate().for_each(task);
    } else {
        out_t.chunks_mut(per_task * m).enumerate().for_each(task);
    }
    for f in 0..n {
        for r in 0..m {
            out.row_mut(r)[f] = out_t[f * m + r];
        }
    }
    out
}

/// How the activations of a call come to the fused kernel.
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only the AVX2 kernel reads them
pub(crate) struct Activations<'a> {
    /// Per row, the factor undoing `quant_avx2::prescale` (empty for int4).
    pub unscale: &'a [f32],
    /// Whole 32- or 64-column groups permuted as `quant_avx2::prescale` does.
    pub permuted: bool,
}

/// One column range of a call and its activation rows.
struct Chunk<'a> {
    c0: usize,
    c1: usize,
    /// What the fused quantized kernel reads (prescaled, maybe permuted).
    kernel_xs: Vec<&'a [f32]>,
    /// The activations as given.
    plain_xs: Vec<&'a [f32]>,
}

/// The bytes of an f32 slice (little-endian, as the dense F32 layout expects).
fn f32_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding or invalid bit patterns; u8 has alignment 1;
    // larder only targets little-endian machines (x86-64, aarch64).
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

#[cfg(test)]
mod tests;
