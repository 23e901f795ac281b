//! Measurements behind `larder bench kernels` and the criterion benches: the
//! machine's RAM read bandwidth, and the weight bytes per second each kernel
//! streams at a given shape, row count and cache state (docs/design.md §5: figures
//! are reported against the physical limit measured in the same run).

pub mod roofs;

use std::hint::black_box;
use std::time::{Duration, Instant};

use crate::dtype::WeightDType;
use crate::kernels::{matmul_t_with, KernelPath};
use crate::mat::Mat;
use crate::weight::{SharedBytes, WeightFormat, WeightMatrix};

/// Bytes of distinct weights a "cold" case cycles through: well past any
/// last-level cache, so every call streams its weight from RAM.
pub const COLD_SET_BYTES: usize = 256 << 20;

/// Median over at least `min_iters` calls of `f`, running for about `budget`.
pub(crate) fn median_time(min_iters: usize, budget: Duration, mut f: impl FnMut(usize)) -> Duration {
    f(0); // warm-up
    let mut times = Vec::new();
    let start = Instant::now();
    let mut i = 1;
    while times.len() < min_iters || (start.elapsed() < budget && times.len() < 1000) {
        let t = Instant::now();
        f(i);
        times.push(t.elapsed());
        i += 1;
    }
    times.sort();
    times[times.len() / 2]
}

/// Streaming read bandwidth of one thread over `bytes` of memory, GB/s: the
/// best of 5 rounds of several read patterns, so that no kernel can read
/// faster than "the limit" (a kernel figure above 100% means this
/// measurement missed a faster way to read, not that the kernel beat RAM):
/// one stream and 4 interleaved streams of plain loads (the kernels read 4
/// weight rows at once, which this machine's prefetchers serve faster than
/// one stream), and on x86-64 with AVX2 one stream of 32-byte loads and
/// blocks of 4 rows of 7168 bytes read with the next block software
/// prefetched, as the kernels read weights.
pub fn ram_read_gbps(bytes: usize) -> f64 {
    let words = vec![1u64; bytes / 8];
    let q = words.len() / 4 / 8 * 8;
    let (p0, p1, p2, p3) = (&words[..q], &words[q..2 * q], &words[2 * q..3 * q], &words[3 * q..4 * q]);
    let mut best = f64::MAX;
    let mut time = |f: &mut dyn FnMut() -> u64| {
        let t = Instant::now();
        black_box(f());
        best = best.min(t.elapsed().as_secs_f64());
    };
    for _ in 0..5 {
        time(&mut || {
            let mut acc = [0u64; 8];
            for c in words[..4 * q].chunks_exact(8) {
                for l in 0..8 {
                    acc[l] = acc[l].wrapping_add(c[l]);
                }
            }
            acc.iter().fold(0, |a, v| a.wrapping_add(*v))
        });
        time(&mut || {
            let mut acc = [0u64; 8];
            for (((a, b), c), d) in p0
                .chunks_exact(8)
                .zip(p1.chunks_exact(8))
                .zip(p2.chunks_exact(8))
                .zip(p3.chunks_exact(8))
            {
                for l in 0..8 {
                    acc[l] = acc[l].wrapping_add(a[l].wrapping_add(b[l]).wrapping_add(c[l].wrapping_add(d[l])));
                }
            }
            acc.iter().fold(0, |a, v| a.wrapping_add(*v))
        });
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was just detected; both read only `words[..4 * q]`.
            time(&mut || unsafe { wide_read::stream(&words[..4 * q]) });
            time(&mut || unsafe { wide_read::row_blocks(&words[..4 * q], 7168) });
        }
    }
    (4 * q * 8) as f64 / best / 1e9
}

/// AVX2 read patterns for [`ram_read_gbps`].
#[cfg(target_arch = "x86_64")]
mod wide_read {
    use std::arch::x86_64::*;

    /// Sums `words` with 32-byte loads, four at a time.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn stream(words: &[u64]) -> u64 {
        let p = words.as_ptr() as *const u8;
        let n = words.len() * 8 / 128 * 128;
        let mut acc = [_mm256_setzero_si256(); 4];
        for i in (0..n).step_by(128) {
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm256_add_epi64(*a, _mm256_loadu_si256(p.add(i + 32 * j) as *const __m256i));
            }
        }
        fold(acc)
    }

    /// Sums `words` as blocks of 4 rows of `row` bytes (a multiple of 64),
    /// the rows side by side 64 bytes at a time, prefetching the same bytes
    /// of the next block's rows.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn row_blocks(words: &[u64], row: usize) -> u64 {
        let p = words.as_ptr() as *const u8;
        let n = words.len() * 8 / (4 * row) * (4 * row);
        let mut acc = [_mm256_setzero_si256(); 4];
        for b in (0..n).step_by(4 * row) {
            let next = if b + 4 * row < n { 4 * row } else { 0 };
            for c in (0..row).step_by(64) {
                for (f, a) in acc.iter_mut().enumerate() {
                    let q = p.add(b + f * row + c);
                    _mm_prefetch::<_MM_HINT_T0>(q.add(next) as *const i8);
                    let two = _mm256_add_epi64(
                        _mm256_loadu_si256(q as *const __m256i),
                        _mm256_loadu_si256(q.add(32) as *const __m256i),
                    );
                    *a = _mm256_add_epi64(*a, two);
                }
            }
        }
        fold(acc)
    }

    #[target_feature(enable = "avx2")]
    unsafe fn fold(acc: [__m256i; 4]) -> u64 {
        let mut t = [0u64; 4];
        let sum = _mm256_add_epi64(_mm256_add_epi64(acc[0], acc[1]), _mm256_add_epi64(acc[2], acc[3]));
        _mm256_storeu_si256(t.as_mut_ptr() as *mut __m256i, sum);
        t.iter().fold(0, |a, v| a.wrapping_add(*v))
    }
}

/// The formats `larder bench kernels` measures.
pub fn bench_formats() -> Vec<(&'static str, WeightFormat)> {
    vec![
        ("f32", WeightFormat::Dense(WeightDType::F32)),
        ("f16", WeightFormat::Dense(WeightDType::F16)),
        ("bf16", WeightFormat::Dense(WeightDType::BF16)),
        (
            "fp8",
            WeightFormat::Fp8Block {
                block_rows: 128,
                block_cols: 128,
            },
        ),
        ("mxfp4", WeightFormat::Mxfp4),
        ("int4", WeightFormat::Int4Group { group: 32 }),
    ]
}

fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}

/// A random weight of `format` (values are well-formed: no NaN codes, modest scales).
pub fn random_weight(format: WeightFormat, n: usize, k: usize, seed: u64) -> WeightMatrix {
    match format {
        WeightFormat::Dense(d) => {
            let raw = bytes(n * k * d.size(), seed);
            // Keep exponents small so values are finite: rebuild from f32 values.
            let vals: Vec<f32> = raw.iter().step_by(d.size()).map(|&b| (b as f32 - 128.0) / 256.0).collect();
            WeightMatrix::from_f32(d, n, k, &vals)
        }
        WeightFormat::Fp8Block { block_rows, block_cols } => {
            let codes: Vec<u8> = bytes(n * k, seed)
                .into_iter()
                .map(|b| if b & 0x7f == 0x7f { 0 } else { b })
                .collect();
            let scales = vec![0.01; n.div_ceil(block_rows) * k.div_ceil(block_cols)];
            WeightMatrix::fp8_block("bench", n, k, SharedBytes::from_vec(codes), scales, block_rows, block_cols).expect("valid shape")
        }
        WeightFormat::Mxfp4 => {
            let scales = vec![120u8; n * k / 32];
            WeightMatrix::mxfp4(
                "bench",
                n,
                k,
                SharedBytes::from_vec(bytes(n * k / 2, seed)),
                SharedBytes::from_vec(scales),
            )
            .expect("valid shape")
        }
        WeightFormat::Int4Group { group } => {
            let scales = vec![0.01; n * k / group];
            WeightMatrix::int4_group("bench", n, k, SharedBytes::from_vec(bytes(n * k / 2, seed)), scales, group).expect("valid shape")
        }
    }
}

/// One measured case.
#[derive(Debug, Clone)]
pub struct KernelCase {
    pub format: WeightFormat,
    pub rows: usize,
    pub k: usize,
    pub n: usize,
    pub cold: bool,
    /// Median seconds per call.
    pub seconds: f64,
    /// Weight bytes streamed per second.
    pub gbps: f64,
}

/// Enough distinct copies of one weight shape to overflow the caches.
pub struct WeightSet {
    pub format: WeightFormat,
    pub k: usize,
    pub n: usize,
    weights: Vec<WeightMatrix>,
}

impl WeightSet {
    /// At least two copies, and at least `cold_bytes` in all (use
    /// [`COLD_SET_BYTES`] for a real measurement).
    pub fn new(format: WeightFormat, n: usize, k: usize, cold_bytes: usize) -> Self {
        let first = random_weight(format, n, k, 1);
        let copies = cold_bytes.div_ceil(first.byte_len()).max(2);
        let mut weights = vec![first];
        for c in 1..copies {
            weights.push(random_weight(format, n, k, c as u64 + 1));
        }
        WeightSet { format, k, n, weights }
    }

    /// Bytes of one weight.
    pub fn weight_bytes(&self) -> usize {
        self.weights[0].byte_len()
    }

    /// Times `rows x k` activations against the weights on `path`: cold cycles
    /// through every copy (each call streams from RAM), hot reuses the first.
    pub fn measure(&self, path: KernelPath, rows: usize, cold: bool, budget: Duration) -> KernelCase {
        let k = self.k;
        let x = Mat::from_vec(rows, k, (0..rows * k).map(|i| ((i % 97) as f32 - 48.0) / 97.0).collect());
        let used = if cold { self.weights.len() } else { 1 };
        let t = median_time(3, budget, |i| {
            black_box(matmul_t_with(path, &x, &self.weights[i % used]));
        });
        let seconds = t.as_secs_f64();
        KernelCase {
            format: self.format,
            rows,
            k,
            n: self.n,
            cold,
            seconds,
            gbps: self.weight_bytes() as f64 / seconds / 1e9,
        }
    }
}

/// The weights of a dense [`WeightSet`] as candle tensors (the same bytes),
/// for timing candle's own CPU matmul on exactly what the kernels read.
pub struct CandleSet {
    dtype: WeightDType,
    k: usize,
    n: usize,
    weights: Vec<candle_core::Tensor>,
}

impl CandleSet {
    /// `None` for formats candle cannot multiply (fp8 blocks, mxfp4, int4).
    pub fn new(set: &WeightSet) -> Result<Option<Self>, candle_core::Error> {
        use candle_core::{DType, Device, Tensor};
        let Some(dtype) = set.weights[0].dense_dtype() else {
            return Ok(None);
        };
        let dt = match dtype {
            WeightDType::F32 => DType::F32,
            WeightDType::F16 => DType::F16,
            WeightDType::BF16 => DType::BF16,
        };
        let mut weights = Vec::with_capacity(set.weights.len());
        for w in &set.weights {
            let rows = w.rows_source();
            let bytes: Vec<u8> = (0..set.n)
                .flat_map(|r| match rows.row(r) {
                    crate::weight::RowView::Dense { bytes, .. } => bytes,
                    _ => &[],
                })
                .copied()
                .collect();
            weights.push(Tensor::from_raw_buffer(&bytes, dt, &[set.n, set.k], &Device::Cpu)?);
        }
        Ok(Some(CandleSet {
            dtype,
            k: set.k,
            n: set.n,
            weights,
        }))
    }

    /// Weight GB/s of candle's `x [rows, k] @ W^T` (x in the weight's dtype,
    /// as candle requires): cold cycles through every copy, hot reuses the
    /// first, as [`WeightSet::measure`] does. candle splits its matmul over
    /// the current rayon pool: run it inside the kernels' pool to compare at
    /// the same thread count.
    pub fn measure(&self, rows: usize, cold: bool, budget: Duration) -> Result<f64, candle_core::Error> {
        use candle_core::{Device, Tensor};
        let x = Tensor::randn(0f32, 1.0, (rows, self.k), &Device::Cpu)?.to_dtype(self.weights[0].dtype())?;
        let wts = self.weights.iter().map(|w| w.t()).collect::<Result<Vec<_>, _>>()?;
        let used = if cold { wts.len() } else { 1 };
        let mut err = None;
        let t = median_time(3, budget, |i| match x.matmul(&wts[i % used]) {
            Ok(y) => {
                black_box(y);
            }
            Err(e) => err = Some(e),
        });
        if let Some(e) = err {
            return Err(e);
        }
        Ok((self.n * self.k * self.dtype.size()) as f64 / t.as_secs_f64() / 1e9)
    }
}
