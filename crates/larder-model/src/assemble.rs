//! The one place a weight's shipped tensors become a [`WeightMatrix`]: which
//! tensors a weight ships in (names), what format they make (dtypes and
//! shapes checked against each other and the config), and the assembly of
//! their bytes. The in-RAM [`Checkpoint`](crate::checkpoint::Checkpoint),
//! direct streaming from the safetensors files and packed stores all go
//! through it, so an expert computes from the same view of the same bytes
//! whichever path brought them.
//!
//! Shipped forms (per `X.weight` of a `[rows, cols]` linear layer):
//! - dense: `X.weight` F32/F16/BF16 `[rows, cols]`;
//! - fp8 (DeepSeek-V3): `X.weight` F8_E4M3 `[rows, cols]` + `X.weight_scale_inv`
//!   F32 `[ceil(rows / br), ceil(cols / bc)]`;
//! - compressed-tensors INT4 `pack-quantized`: `X.weight_packed` I32
//!   `[rows, cols / 8]`, `X.weight_scale` BF16/F16/F32 `[rows, cols / group]`
//!   and `X.weight_shape` I32/I64 `[2]` = `[rows, cols]`; the scales are
//!   widened to f32 (exactly), the codes are used as shipped;
//! - compressed-tensors MXFP4: `X.weight_packed` U8 `[rows, cols / 2]` +
//!   `X.weight_scale` U8 `[rows, cols / 32]` (e8m0), optional `X.weight_shape`.

use larder_tensor::weight::SharedBytes;
use larder_tensor::{WeightDType, WeightError, WeightFormat, WeightMatrix};

use crate::quant::PackedFormat;

/// Where a shipped part sits in the list [`shipped_names`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartKind {
    /// Values or codes.
    Codes,
    /// Block or group scales.
    Scales,
    /// compressed-tensors `weight_shape` (checked, not computed with).
    Shape,
}

impl PartKind {
    /// The role suffix of this part in a store record (`gate`, `gate.scale`, `gate.shape`).
    pub fn role(self, projection: &str) -> String {
        match self {
            PartKind::Codes => projection.to_string(),
            PartKind::Scales => format!("{projection}.scale"),
            PartKind::Shape => format!("{projection}.shape"),
        }
    }

    /// The kind of a store record role (inverse of [`role`](Self::role)).
    pub fn of_role<'a>(role: &'a str, projection: &str) -> Option<PartKind> {
        let rest: &'a str = role.strip_prefix(projection)?;
        match rest {
            "" => Some(PartKind::Codes),
            ".scale" => Some(PartKind::Scales),
            ".shape" => Some(PartKind::Shape),
            _ => None,
        }
    }
}

/// The dtype (safetensors name) and shape of one shipped tensor.
#[derive(Debug, Clone, Copy)]
pub struct PartMeta<'a> {
    pub dtype: &'a str,
    pub shape: &'a [usize],
}

/// The names a weight `X.weight` may ship under, by kind: for a packed
/// weight `X.weight_packed`, `X.weight_scale`, `X.weight_shape`; otherwise
/// `X.weight` and (fp8) `X.weight_scale_inv`.
pub fn shipped_names(weight: &str, packed: bool) -> Vec<(PartKind, String)> {
    let module = weight.strip_suffix(".weight").unwrap_or(weight);
    if packed {
        vec![
            (PartKind::Codes, format!("{module}.weight_packed")),
            (PartKind::Scales, format!("{module}.weight_scale")),
            (PartKind::Shape, format!("{module}.weight_shape")),
        ]
    } else {
        vec![
            (PartKind::Codes, weight.to_string()),
            (PartKind::Scales, format!("{weight}_scale_inv")),
        ]
    }
}

/// The format the shipped parts of a `[rows, cols]` weight make, after
/// checking every part's dtype and shape; `Err` names what disagrees.
/// `packed` is the checkpoint's compressed-tensors format (when the weight
/// ships packed), `fp8_block` its fp8 block size.
pub fn shipped_format(
    module: &str,
    rows: usize,
    cols: usize,
    codes: PartMeta<'_>,
    scales: Option<PartMeta<'_>>,
    packed: Option<PackedFormat>,
    fp8_block: Option<(usize, usize)>,
) -> Result<WeightFormat, String> {
    let expect = |what: &str, m: PartMeta<'_>, dtypes: &[&str], shape: &[usize]| {
        if !dtypes.contains(&m.dtype) || m.shape != shape {
            let kind = if what == "weight" || what == "weight_packed" {
                "tensor"
            } else {
                "scale tensor"
            };
            return Err(format!(
                "{kind} `{module}.{what}` has dtype {} and shape {:?}; a [{rows}, {cols}] weight needs {} and shape {shape:?}",
                m.dtype,
                m.shape,
                dtypes.join("/")
            ));
        }
        Ok(())
    };
    let missing = || format!("the scale tensor of `{module}` is missing");
    match (packed, codes.dtype) {
        (Some(PackedFormat::Int4 { group }), _) => {
            if !cols.is_multiple_of(8) {
                return Err(format!("int4 packs 8 columns per word; {cols} columns do not"));
            }
            expect("weight_packed", codes, &["I32"], &[rows, cols / 8])?;
            let s = scales.ok_or_else(missing)?;
            expect("weight_scale", s, &["BF16", "F16", "F32"], &[rows, cols.div_ceil(group)])?;
            Ok(WeightFormat::Int4Group { group })
        }
        (Some(PackedFormat::Mxfp4), _) => {
            if !cols.is_multiple_of(32) {
                return Err(format!("mxfp4 needs columns in multiples of 32, got {cols}"));
            }
            expect("weight_packed", codes, &["U8"], &[rows, cols / 2])?;
            expect("weight_scale", scales.ok_or_else(missing)?, &["U8"], &[rows, cols / 32])?;
            Ok(WeightFormat::Mxfp4)
        }
        (None, "F8_E4M3") => {
            let (br, bc) = fp8_block.ok_or("it is fp8 but config.json has no quantization_config.weight_block_size")?;
            expect("weight", codes, &["F8_E4M3"], &[rows, cols])?;
            expect(
                "weight_scale_inv",
                scales.ok_or_else(missing)?,
                &["F32"],
                &[rows.div_ceil(br), cols.div_ceil(bc)],
            )?;
            Ok(WeightFormat::Fp8Block {
                block_rows: br,
                block_cols: bc,
            })
        }
        (None, d) => {
            let dtype = dense_dtype(d).ok_or_else(|| format!("dtype {d} is not supported (supported: F32, F16, BF16, F8_E4M3)"))?;
            expect("weight", codes, &[d], &[rows, cols])?;
            if scales.is_some() {
                return Err(format!("a {d} weight ships with a scale tensor"));
            }
            Ok(WeightFormat::Dense(dtype))
        }
    }
}

/// A dense element dtype by its safetensors name.
pub fn dense_dtype(name: &str) -> Option<WeightDType> {
    match name {
        "F32" => Some(WeightDType::F32),
        "F16" => Some(WeightDType::F16),
        "BF16" => Some(WeightDType::BF16),
        _ => None,
    }
}

/// Checks a compressed-tensors `weight_shape` tensor's bytes (I32 or I64
/// little-endian) say `[rows, cols]`.
pub fn check_weight_shape(dtype: &str, bytes: &[u8], rows: usize, cols: usize) -> Result<(), String> {
    let values: Vec<i64> = match dtype {
        "I32" if bytes.len() == 8 => bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
            .collect(),
        "I64" if bytes.len() == 16 => bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
        _ => {
            return Err(format!(
                "weight_shape is {dtype}, {} bytes; expected two I32 or I64 values",
                bytes.len()
            ))
        }
    };
    if values != [rows as i64, cols as i64] {
        return Err(format!("weight_shape says {values:?} but the packed weight is [{rows}, {cols}]"));
    }
    Ok(())
}

/// Builds the weight over its shipped bytes (codes never copied):
/// `scales` is the scale tensor's bytes with its safetensors dtype.
pub fn weight_matrix(
    name: &str,
    rows: usize,
    cols: usize,
    format: WeightFormat,
    codes: SharedBytes,
    scales: Option<(&str, SharedBytes)>,
) -> Result<WeightMatrix, WeightError> {
    let scales = || {
        scales.clone().ok_or_else(|| WeightError::Layout {
            name: name.to_string(),
            message: format!("{format} needs scales"),
        })
    };
    let widened = |(dtype, bytes): (&str, SharedBytes)| -> Result<Vec<f32>, WeightError> {
        let d = dense_dtype(dtype).ok_or_else(|| WeightError::Layout {
            name: name.to_string(),
            message: format!("scales of dtype {dtype} are not supported"),
        })?;
        let mut out = vec![0.0f32; bytes.len() / d.size()];
        if out.len() * d.size() != bytes.len() {
            return Err(WeightError::Layout {
                name: name.to_string(),
                message: format!("{} scale bytes are not whole {dtype} values", bytes.len()),
            });
        }
        d.decode_into(bytes.as_slice(), &mut out);
        Ok(out)
    };
    match format {
        WeightFormat::Dense(d) => WeightMatrix::new(name, d, rows, cols, codes),
        WeightFormat::Fp8Block { block_rows, block_cols } => {
            WeightMatrix::fp8_block(name, rows, cols, codes, widened(scales()?)?, block_rows, block_cols)
        }
        WeightFormat::Mxfp4 => WeightMatrix::mxfp4(name, rows, cols, codes, scales()?.1),
        WeightFormat::Int4Group { group } => WeightMatrix::int4_group(name, rows, cols, codes, widened(scales()?)?, group),
    }
}
