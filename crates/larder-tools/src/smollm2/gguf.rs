//! A GGUF (version 2 and 3) reader: metadata key/values and tensor
//! descriptors, with every length and offset bounds-checked against the
//! bytes, and ggml's reference dequantisation of the tensor types the
//! SmolLM2 GGUF uses (Q4_1, Q8_0, F16, F32) to f32.

use std::collections::HashMap;

/// A metadata value, as GGUF types it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U(u64),
    I(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Arr(Vec<Value>),
}

impl Value {
    /// The value as an integer, if it is one.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::U(u) => i64::try_from(*u).ok(),
            Value::I(i) => Some(*i),
            _ => None,
        }
    }

    /// The value as a string, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// ggml tensor types this reader dequantises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorType {
    F32,
    F16,
    Q4_1,
    Q8_0,
}

impl TensorType {
    fn from_code(code: u32) -> Option<TensorType> {
        match code {
            0 => Some(TensorType::F32),
            1 => Some(TensorType::F16),
            3 => Some(TensorType::Q4_1),
            8 => Some(TensorType::Q8_0),
            _ => None,
        }
    }

    /// The name ggml gives it (`Q4_1`, ...).
    pub fn name(self) -> &'static str {
        match self {
            TensorType::F32 => "F32",
            TensorType::F16 => "F16",
            TensorType::Q4_1 => "Q4_1",
            TensorType::Q8_0 => "Q8_0",
        }
    }

    /// Bytes holding `n` elements (None: `n` is not a whole number of blocks).
    fn bytes_for(self, n: u64) -> Option<u64> {
        match self {
            TensorType::F32 => n.checked_mul(4),
            TensorType::F16 => n.checked_mul(2),
            TensorType::Q4_1 if n.is_multiple_of(32) => Some(n / 32 * 20),
            TensorType::Q8_0 if n.is_multiple_of(32) => Some(n / 32 * 34),
            _ => None,
        }
    }
}

/// One tensor: its name, ggml dims (`ne[0]` is the contiguous one), type and bytes.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    pub ne: Vec<u64>,
    pub ty: TensorType,
    /// Absolute byte range in the file.
    pub start: usize,
    pub len: usize,
}

impl TensorInfo {
    /// Number of elements.
    pub fn elements(&self) -> u64 {
        self.ne.iter().product()
    }

    /// The shape as numpy / Hugging Face order it (`ne` reversed).
    pub fn shape(&self) -> Vec<usize> {
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A parsed GGUF file held in memory.
pub struct Gguf {
    pub bytes: Vec<u8>,
    pub meta: HashMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
}

/// Reads little-endian fields with bounds checks.
struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64) -> Result<&'a [u8], String> {
        let end = usize::try_from(n).ok().and_then(|n| self.pos.checked_add(n));
        match end {
            Some(end) if end <= self.b.len() => {
                let s = &self.b[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            _ => Err(format!("truncated at byte {} (wanted {n} more bytes)", self.pos)),
        }
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let s = self.take(N as u64)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    fn string(&mut self) -> Result<String, String> {
        let n = self.u64()?;
        let at = self.pos;
        let s = self.take(n)?;
        String::from_utf8(s.to_vec()).map_err(|_| format!("string at byte {at} is not UTF-8"))
    }
    fn value(&mut self, ty: u32, depth: usize) -> Result<Value, String> {
        Ok(match ty {
            0 => Value::U(self.arr::<1>()?[0] as u64),
            1 => Value::I(self.arr::<1>()?[0] as i8 as i64),
            2 => Value::U(u16::from_le_bytes(self.arr()?) as u64),
            3 => Value::I(i16::from_le_bytes(self.arr()?) as i64),
            4 => Value::U(self.u32()? as u64),
            5 => Value::I(i32::from_le_bytes(self.arr()?) as i64),
            6 => Value::F32(f32::from_le_bytes(self.arr()?)),
            7 => Value::Bool(self.arr::<1>()?[0] != 0),
            8 => Value::Str(self.string()?),
            9 if depth == 0 => {
                let item = self.u32()?;
                let n = self.u64()?;
                // Each item takes at least one byte: a count beyond the file is corrupt.
                if n > (self.b.len() - self.pos) as u64 {
                    return Err(format!("array of {n} items at byte {} runs past the file", self.pos));
                }
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(item, depth + 1)?);
                }
                Value::Arr(items)
            }
            10 => Value::U(self.u64()?),
            11 => Value::I(i64::from_le_bytes(self.arr()?)),
            12 => Value::F64(f64::from_le_bytes(self.arr()?)),
            _ => return Err(format!("unknown or nested metadata value type {ty} at byte {}", self.pos)),
        })
    }
}

impl Gguf {
    /// Parses `bytes` (a whole GGUF file).
    pub fn parse(bytes: Vec<u8>) -> Result<Gguf, String> {
        let mut c = Cursor { b: &bytes, pos: 0 };
        if c.take(4)? != b"GGUF" {
            return Err("not a GGUF file (no GGUF magic)".into());
        }
        let version = c.u32()?;
        if !(2..=3).contains(&version) {
            return Err(format!("GGUF version {version} is not supported (2 or 3)"));
        }
        let n_tensors = c.u64()?;
        let n_kv = c.u64()?;
        let mut meta = HashMap::new();
        for _ in 0..n_kv {
            let key = c.string()?;
            let ty = c.u32()?;
            let v = c.value(ty, 0).map_err(|e| format!("metadata {key:?}: {e}"))?;
            meta.insert(key, v);
        }
        let mut raw = Vec::new();
        for _ in 0..n_tensors {
            let name = c.string()?;
            let n_dims = c.u32()?;
            if n_dims > 4 {
                return Err(format!("tensor {name:?}: {n_dims} dims (at most 4)"));
            }
            let ne = (0..n_dims).map(|_| c.u64()).collect::<Result<Vec<_>, _>>()?;
            let code = c.u32()?;
            let ty = TensorType::from_code(code)
                .ok_or_else(|| format!("tensor {name:?}: ggml type {code} not supported (Q4_1/Q8_0/F16/F32 only)"))?;
            raw.push((name, ne, ty, c.u64()?));
        }
        let align = match meta.get("general.alignment") {
            None => 32,
            Some(v) => v.as_int().filter(|a| *a > 0).ok_or("general.alignment is not a positive integer")? as usize,
        };
        let data = c.pos.div_ceil(align) * align;
        let mut tensors = Vec::with_capacity(raw.len());
        for (name, ne, ty, offset) in raw {
            let n = ne.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            let len = n.and_then(|n| ty.bytes_for(n));
            let start = usize::try_from(offset).ok().and_then(|o| o.checked_add(data));
            let (Some(len), Some(start)) = (len, start) else {
                return Err(format!(
                    "tensor {name:?}: size or offset overflows, or not whole {} blocks",
                    ty.name()
                ));
            };
            let len = len as usize;
            if start.checked_add(len).is_none_or(|end| end > bytes.len()) {
                return Err(format!("tensor {name:?}: data runs past the end of the file"));
            }
            tensors.push(TensorInfo { name, ne, ty, start, len });
        }
        Ok(Gguf { bytes, meta, tensors })
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.meta.get(key)
    }

    /// The tensor's elements as f32, dequantised exactly as ggml does.
    pub fn dequantize(&self, t: &TensorInfo) -> Vec<f32> {
        dequantize(t.ty, &self.bytes[t.start..t.start + t.len])
    }
}

fn f16(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// ggml's reference dequantisers: Q4_1 `y = d*q + m` (d*q exact, one rounding
/// for +m), Q8_0 `y = d*q` (exact), F16 widened exactly, F32 copied. `raw`
/// holds whole blocks (checked when the file was parsed).
pub fn dequantize(ty: TensorType, raw: &[u8]) -> Vec<f32> {
    match ty {
        TensorType::F32 => raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        TensorType::F16 => raw.chunks_exact(2).map(f16).collect(),
        TensorType::Q8_0 => {
            let mut out = Vec::with_capacity(raw.len() / 34 * 32);
            for block in raw.chunks_exact(34) {
                let d = f16(&block[0..2]);
                out.extend(block[2..].iter().map(|&q| d * (q as i8) as f32));
            }
            out
        }
        TensorType::Q4_1 => {
            let mut out = Vec::with_capacity(raw.len() / 20 * 32);
            for block in raw.chunks_exact(20) {
                let (d, m) = (f16(&block[0..2]), f16(&block[2..4]));
                let qs = &block[4..];
                out.extend(qs.iter().map(|&q| d * (q & 0x0F) as f32 + m));
                out.extend(qs.iter().map(|&q| d * (q >> 4) as f32 + m));
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_1_low_nibbles_then_high() {
        let mut block = Vec::new();
        block.extend(half::f16::from_f32(0.5).to_le_bytes());
        block.extend(half::f16::from_f32(-1.0).to_le_bytes());
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let y = dequantize(TensorType::Q4_1, &block);
        assert_eq!(y.len(), 32);
        assert_eq!(y[0], -1.0);
        assert_eq!(y[15], 0.5 * 15.0 - 1.0);
        assert_eq!(y[16], 0.5 * 15.0 - 1.0);
        assert_eq!(y[31], -1.0);
    }

    #[test]
    fn truncated_files_are_errors() {
        assert!(Gguf::parse(b"GGUF".to_vec()).is_err());
        assert!(Gguf::parse(b"nope".to_vec()).is_err());
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend(u64::MAX.to_le_bytes());
        assert!(Gguf::parse(b).is_err());
    }
}
