//! Weight-format matrix products: `y = x W^T` for one row (GEMV) or a few
//! rows (GEMM) of f32 activations against a [`WeightMatrix`] in its shipped
//! format.
//!
//! One dispatch point ([`KernelPath`]) picks the ISA file: `scalar` (the
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
//! Structure: `driver` (format-agnostic tiling: column chunks, tasks and
//! threads, register blocks of rows, accumulators, tails) runs every
//! product; a `rows::RowPlan` chosen once per call holds the per-format row
//! strategy (dense, folded fp8, fused quantized, decoded) and the
//! activations it reads. On x86-64 every quantized format has one set of
//! in-register decoders (`codes_avx2`), shared by the fused kernel
//! (`quant_avx2`) and the exact row decoder ([`KernelPath::decode`]).
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

pub(crate) mod scalar;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod blocked;
#[cfg(target_arch = "x86_64")]
mod codes_avx2;
mod driver;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod quant_avx2;
mod rows;

use std::sync::OnceLock;

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
/// Fewest rows of a row block when a call has more rows than fit in
/// [`ACTIVATION_CACHE_BYTES`] (wide rows then also take column chunks).
const MIN_ROW_BLOCK: usize = 16;
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
            if unsafe { codes_avx2::decode_row(view, out) } {
                return;
            }
        }
        crate::formats::decode_row(view, out);
    }
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
#[non_exhaustive]
pub enum KernelEnvError {
    #[error("LARDER_KERNEL={requested}: this CPU cannot run the {requested} kernel path (it has: {available}); unset LARDER_KERNEL or set one of those")]
    Unsupported { requested: String, available: String },
    #[error("LARDER_KERNEL={requested:?} is not a kernel path (valid values: scalar, avx2, avx512, neon; this CPU has: {available})")]
    Unknown { requested: String, available: String },
}

/// Errors of the kernels' checked entry points ([`Linear::try_forward`](crate::Linear::try_forward)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
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
pub(crate) fn try_matmul_t(x: &Mat, w: &WeightMatrix) -> Result<Mat, KernelError> {
    try_matmul_t_with(active_path(), x, w)
}

/// [`try_matmul_t`] on a given path (tests and benchmarks compare paths).
pub(crate) fn try_matmul_t_with(path: KernelPath, x: &Mat, w: &WeightMatrix) -> Result<Mat, KernelError> {
    check_width(x, w)?;
    Ok(driver::matmul_t_checked(path, x, w))
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

/// `x [m, k] * W^T` where `W` is `[n, k]`: returns `[m, n]`, on the active
/// path, for callers whose shapes were checked when the model loaded.
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

/// How the activations of a call come to the fused kernel.
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only the AVX2 kernel reads them
pub(crate) struct Activations<'a> {
    /// Per row, the factor undoing `quant_avx2::prescale` (empty for int4).
    pub unscale: &'a [f32],
    /// Whole 32- or 64-column groups permuted as `quant_avx2::prescale` does.
    pub permuted: bool,
}

/// The bytes of an f32 slice (little-endian, as the dense F32 layout expects).
pub(crate) fn f32_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding or invalid bit patterns; u8 has alignment 1;
    // larder only targets little-endian machines (x86-64, aarch64).
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

#[cfg(test)]
mod tests;
