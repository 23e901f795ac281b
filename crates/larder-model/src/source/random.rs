//! [`RandomSource`]: a [`WeightSource`] answering deterministic random
//! weights, so a [`DecoderModel`](crate::DecoderModel) can be built from a
//! spec alone (no files): tests and benchmarks of the forward pass.
//!
//! Every value is drawn from a generator seeded by the source's seed and the
//! tensor's name, so the same (seed, name) always gives the same tensor
//! whatever order it is asked in. Matrices are dense BF16, uniform in
//! `[-scale, scale]`; small f32 tensors uniform in `[1 - scale, 1 + scale]`
//! (norm weights near one); fused raw tensors BF16 values or `U8` bytes in
//! `118..=127` (MXFP4 codes, and e8m0 scales from 2^-9 to 1). No optional tensor ships unless
//! the presence rule says so. This is for small models: every byte is owned.

use larder_tensor::{SharedBytes, WeightDType, WeightMatrix};

use super::{RawTensor, Weight, WeightRequest, WeightSource};
use crate::error::ModelError;

/// A [`WeightSource`] of deterministic random weights.
pub struct RandomSource {
    seed: u64,
    scale: f32,
    present: Box<super::recorder::Presence>,
}

impl RandomSource {
    /// Random weights from `seed`, matrices uniform in `[-scale, scale]`;
    /// no optional tensor ships (see [`with_presence`](Self::with_presence)).
    pub fn new(seed: u64, scale: f32) -> Self {
        RandomSource {
            seed,
            scale,
            present: Box::new(|_| false),
        }
    }

    /// The same source, answering presence questions with `present`.
    pub fn with_presence(self, present: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        RandomSource {
            present: Box::new(present),
            ..self
        }
    }

    /// The generator of tensor `name`.
    fn rng(&self, name: &str) -> SplitMix64 {
        // FNV-1a of the name, mixed with the seed.
        let hash = name
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
        SplitMix64(self.seed ^ hash)
    }

    /// `n` BF16 values uniform in `[centre - scale, centre + scale]`.
    fn bf16_bytes(&self, name: &str, n: usize, centre: f32) -> Vec<u8> {
        let mut rng = self.rng(name);
        let mut out = Vec::with_capacity(2 * n);
        for _ in 0..n {
            let v = centre + self.scale * rng.symmetric();
            out.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
        }
        out
    }
}

impl WeightSource for RandomSource {
    fn load(&self, request: &WeightRequest<'_>) -> Result<Weight, ModelError> {
        match *request {
            WeightRequest::Linear { name, rows, cols } | WeightRequest::Param { name, rows, cols } => {
                let bytes = SharedBytes::from_vec(self.bf16_bytes(name, rows * cols, 0.0));
                Ok(Weight::Matrix(WeightMatrix::new(name, WeightDType::BF16, rows, cols, bytes)?))
            }
            WeightRequest::F32 { name, shapes } => {
                let first = shapes
                    .first()
                    .ok_or_else(|| ModelError::Source(format!("tensor `{name}` asked for in no shape")))?;
                let mut rng = self.rng(name);
                let n: usize = first.iter().product();
                let values = (0..n).map(|_| 1.0 + self.scale * rng.symmetric()).collect();
                Ok(Weight::F32 { values, shape: 0 })
            }
            WeightRequest::Present { name } => Ok(Weight::Present((self.present)(name))),
            WeightRequest::Shape { .. } => Ok(Weight::Shape(None)),
            WeightRequest::Raw { name, dtypes, shape } => {
                let n: usize = shape.iter().product();
                let dtype = match dtypes {
                    [d, ..] if *d == "U8" || *d == "BF16" => *d,
                    _ => return Err(ModelError::Source(format!("tensor `{name}`: no random {dtypes:?} tensors"))),
                };
                let bytes = match dtype {
                    "U8" => {
                        let mut rng = self.rng(name);
                        // 118..=127: any codes; as e8m0 scales, 2^-9 ..= 1.
                        (0..n).map(|_| 118 + (rng.next() >> 32) as u8 % 10).collect()
                    }
                    _ => self.bf16_bytes(name, n, 0.0),
                };
                Ok(Weight::Raw(RawTensor {
                    dtype: dtype.to_string(),
                    shape: shape.to_vec(),
                    bytes: SharedBytes::from_vec(bytes),
                }))
            }
        }
    }
}

/// Steele, Lea and Flood's SplitMix64: small, fast, deterministic.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[-1, 1)`.
    fn symmetric(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}
