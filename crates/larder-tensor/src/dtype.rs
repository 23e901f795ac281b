//! Weight dtypes as checkpoints ship them, and their exact conversion to f32.

use half::{bf16, f16};

/// The element type a weight matrix is stored and computed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightDType {
    F32,
    F16,
    BF16,
}

impl WeightDType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            WeightDType::F32 => 4,
            WeightDType::F16 | WeightDType::BF16 => 2,
        }
    }

    /// The name safetensors and config.json use for this dtype.
    pub fn name(self) -> &'static str {
        match self {
            WeightDType::F32 => "F32",
            WeightDType::F16 => "F16",
            WeightDType::BF16 => "BF16",
        }
    }

    /// Converts `bytes` (little-endian elements of this dtype) into `out`.
    /// Every supported dtype widens to f32 exactly.
    pub fn decode_into(self, bytes: &[u8], out: &mut [f32]) {
        debug_assert_eq!(bytes.len(), out.len() * self.size());
        match self {
            WeightDType::F32 => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            WeightDType::F16 => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
                }
            }
            WeightDType::BF16 => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
                }
            }
        }
    }
}

impl std::fmt::Display for WeightDType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Encodes f32 values into `dtype` bytes (round to nearest even). Used by tests
/// and tools that build weights; never by the inference path.
pub(crate) fn encode(dtype: WeightDType, values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.size());
    for &v in values {
        match dtype {
            WeightDType::F32 => out.extend_from_slice(&v.to_le_bytes()),
            WeightDType::F16 => out.extend_from_slice(&f16::from_f32(v).to_bits().to_le_bytes()),
            WeightDType::BF16 => out.extend_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_representable_values() {
        let vals = [0.0f32, -1.5, 2.0, 0.125, -65504.0];
        for dt in [WeightDType::F32, WeightDType::F16, WeightDType::BF16] {
            let bytes = encode(dt, &vals);
            let mut back = vec![0.0; vals.len()];
            dt.decode_into(&bytes, &mut back);
            if dt == WeightDType::BF16 {
                // -65504 is not representable in bf16; the rest are.
                assert_eq!(&back[..4], &vals[..4]);
            } else {
                assert_eq!(back, vals);
            }
        }
    }

    #[test]
    fn bf16_widening_is_bit_exact() {
        for bits in [0x3f80u16, 0xbf80, 0x7f80, 0x0001, 0x8000] {
            let mut out = [0.0f32];
            WeightDType::BF16.decode_into(&bits.to_le_bytes(), &mut out);
            assert_eq!(out[0].to_bits(), (bits as u32) << 16);
        }
    }
}
