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
//!
//! gpt-oss experts are slices `[e]` of per-layer fused tensors
//! (`gpt_oss_fused_parts`, built by [`gpt_oss_expert`]):
//! - MXFP4 (transformers 5.24.0 `integrations/mxfp4.py`):
//!   `mlp.experts.gate_up_proj_blocks` U8 `[E, 2I, H/32, 16]` +
//!   `_scales` U8 `[E, 2I, H/32]`, `down_proj_blocks` `[E, H, I/32, 16]` +
//!   `_scales` `[E, H, I/32]`: already output-major, so slice `[e]` is an
//!   MXFP4 matrix as it lies (low nibble = even column, e8m0 scale per 32);
//! - unquantized: `gate_up_proj` `[E, H, 2I]`, `down_proj` `[E, I, H]`
//!   input-major; slice `[e]` is transposed to `[out, in]` (elements moved,
//!   never rounded);
//! - both: `gate_up_proj_bias` `[E, 2I]`, `down_proj_bias` `[E, H]`
//!   (BF16/F16/F32, widened to f32 exactly).

use larder_tensor::{GluActivation, SharedBytes, SwigluExpert, WeightDType, WeightError, WeightFormat, WeightMatrix};

use crate::quant::PackedFormat;

/// Where a shipped part sits in the list `shipped_names` returns.
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
pub(crate) fn shipped_names(weight: &str, packed: bool) -> Vec<(PartKind, String)> {
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

/// How a weight ships, before its parts are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShippedAs {
    /// One float tensor (F32, F16 or BF16: the checkpoint's choice).
    Dense,
    /// fp8 e4m3 codes with f32 block scales (`weight_block_size`).
    Fp8 { block: (usize, usize) },
    /// compressed-tensors 4-bit packed.
    Packed(PackedFormat),
}

/// One tensor a weight ships in, as its format requires it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartLayout {
    pub kind: PartKind,
    /// The checkpoint name (see [`shipped_names`]).
    pub name: String,
    /// What follows the module name (`weight`, `weight_scale_inv`,
    /// `weight_packed`, `weight_scale`, `weight_shape`).
    pub suffix: &'static str,
    /// The safetensors dtypes it may ship in.
    pub dtypes: &'static [&'static str],
    pub shape: Vec<usize>,
}

/// The safetensors dtypes a float tensor may ship in.
pub(crate) const FLOAT_DTYPES: &[&str] = &["BF16", "F16", "F32"];

/// The tensors a `[rows, cols]` weight `weight` (`X.weight`) ships in as
/// `how`, each with the dtypes and shape it must have, codes first. Only
/// required parts are listed (MXFP4's optional `weight_shape` is not).
/// `Err` when `cols` does not fit the packed format.
pub(crate) fn part_layout(weight: &str, rows: usize, cols: usize, how: ShippedAs) -> Result<Vec<PartLayout>, String> {
    let names = shipped_names(weight, matches!(how, ShippedAs::Packed(_)));
    let part = |i: usize, suffix, dtypes, shape: Vec<usize>| {
        let (kind, name): &(PartKind, String) = &names[i];
        PartLayout {
            kind: *kind,
            name: name.clone(),
            suffix,
            dtypes,
            shape,
        }
    };
    Ok(match how {
        ShippedAs::Dense => vec![part(0, "weight", FLOAT_DTYPES, vec![rows, cols])],
        ShippedAs::Fp8 { block: (br, bc) } => vec![
            part(0, "weight", &["F8_E4M3"], vec![rows, cols]),
            part(1, "weight_scale_inv", &["F32"], vec![rows.div_ceil(br), cols.div_ceil(bc)]),
        ],
        ShippedAs::Packed(PackedFormat::Int4 { group }) => {
            if !cols.is_multiple_of(8) {
                return Err(format!("int4 packs 8 columns per word; {cols} columns do not"));
            }
            vec![
                part(0, "weight_packed", &["I32"], vec![rows, cols / 8]),
                part(1, "weight_scale", FLOAT_DTYPES, vec![rows, cols.div_ceil(group)]),
                part(2, "weight_shape", &["I32", "I64"], vec![2]),
            ]
        }
        ShippedAs::Packed(PackedFormat::Mxfp4) => {
            if !cols.is_multiple_of(32) {
                return Err(format!("mxfp4 needs columns in multiples of 32, got {cols}"));
            }
            vec![
                part(0, "weight_packed", &["U8"], vec![rows, cols / 2]),
                part(1, "weight_scale", &["U8"], vec![rows, cols / 32]),
            ]
        }
    })
}

/// The format the shipped parts of a `[rows, cols]` weight make, after
/// checking every part's dtype and shape against `part_layout`; `Err`
/// names what disagrees. `packed` is the checkpoint's compressed-tensors
/// format (when the weight ships packed), `fp8_block` its fp8 block size.
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
    let (how, format) = match (packed, codes.dtype) {
        (Some(p @ PackedFormat::Int4 { group }), _) => (ShippedAs::Packed(p), WeightFormat::Int4Group { group }),
        (Some(p @ PackedFormat::Mxfp4), _) => (ShippedAs::Packed(p), WeightFormat::Mxfp4),
        (None, "F8_E4M3") => {
            let (br, bc) = fp8_block.ok_or("it is fp8 but config.json has no quantization_config.weight_block_size")?;
            let format = WeightFormat::Fp8Block {
                block_rows: br,
                block_cols: bc,
            };
            (ShippedAs::Fp8 { block: (br, bc) }, format)
        }
        (None, d) => {
            let dtype = dense_dtype(d).ok_or_else(|| format!("dtype {d} is not supported (supported: F32, F16, BF16, F8_E4M3)"))?;
            (ShippedAs::Dense, WeightFormat::Dense(dtype))
        }
    };
    let layout = part_layout(&format!("{module}.weight"), rows, cols, how)?;
    // A dense weight may ship in any float dtype: its codes' own.
    let own_dtype = [codes.dtype];
    let codes_dtypes: &[&str] = if how == ShippedAs::Dense { &own_dtype } else { layout[0].dtypes };
    expect(layout[0].suffix, codes, codes_dtypes, &layout[0].shape)?;
    match layout.iter().find(|p| p.kind == PartKind::Scales) {
        Some(p) => {
            let s = scales.ok_or_else(|| format!("the scale tensor of `{module}` is missing"))?;
            expect(p.suffix, s, p.dtypes, &p.shape)?;
        }
        None if scales.is_some() => return Err(format!("a {} weight ships with a scale tensor", codes.dtype)),
        None => {}
    }
    Ok(format)
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

/// One fused per-layer tensor a gpt-oss expert takes slice `[e]` of, and
/// the role that slice has in an expert record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FusedPart {
    /// `gate_up`, `gate_up.scale`, `gate_up.bias`, `down`, `down.scale`, `down.bias`.
    pub role: &'static str,
    /// Checkpoint name (`model.layers.{L}.mlp.experts.gate_up_proj_blocks`, ...).
    pub name: String,
    /// Stored shape, experts first.
    pub shape: Vec<usize>,
    /// The safetensors dtypes it may ship in.
    pub dtypes: &'static [&'static str],
}

const FLOATS: &[&str] = FLOAT_DTYPES;
const BYTES: &[&str] = &["U8"];

/// The fused tensors of the gpt-oss MoE layer at `block`
/// (`model.layers.{L}.mlp`), `experts` experts of `hidden` -> `inter`, in
/// record order: MXFP4 (`mxfp4`) gate_up blocks, scales, bias, down blocks,
/// scales, bias; unquantized gate_up, bias, down, bias.
pub(crate) fn gpt_oss_fused_parts(block: &str, experts: usize, hidden: usize, inter: usize, mxfp4: bool) -> Vec<FusedPart> {
    let part = |role, n: &str, shape: Vec<usize>, dtypes| FusedPart {
        role,
        name: format!("{block}.experts.{n}"),
        shape,
        dtypes,
    };
    let e = experts;
    if mxfp4 {
        vec![
            part("gate_up", "gate_up_proj_blocks", vec![e, 2 * inter, hidden / 32, 16], BYTES),
            part("gate_up.scale", "gate_up_proj_scales", vec![e, 2 * inter, hidden / 32], BYTES),
            part("gate_up.bias", "gate_up_proj_bias", vec![e, 2 * inter], FLOATS),
            part("down", "down_proj_blocks", vec![e, hidden, inter / 32, 16], BYTES),
            part("down.scale", "down_proj_scales", vec![e, hidden, inter / 32], BYTES),
            part("down.bias", "down_proj_bias", vec![e, hidden], FLOATS),
        ]
    } else {
        vec![
            part("gate_up", "gate_up_proj", vec![e, hidden, 2 * inter], FLOATS),
            part("gate_up.bias", "gate_up_proj_bias", vec![e, 2 * inter], FLOATS),
            part("down", "down_proj", vec![e, inter, hidden], FLOATS),
            part("down.bias", "down_proj_bias", vec![e, hidden], FLOATS),
        ]
    }
}

/// Checks a shipped fused tensor (`sliced`: one expert's slice, shape
/// without the experts axis) against its part; `Err` names the tensor.
pub fn check_fused_part(part: &FusedPart, dtype: &str, shape: &[usize], sliced: bool) -> Result<(), String> {
    let want = if sliced { &part.shape[1..] } else { &part.shape[..] };
    if !part.dtypes.contains(&dtype) || shape != want {
        return Err(format!(
            "tensor `{}` has dtype {dtype} and shape {shape:?}; expected {} and shape {want:?}",
            part.name,
            part.dtypes.join("/")
        ));
    }
    Ok(())
}

/// A gpt-oss expert from its slices `[e]` (dtype, bytes), in the order of
/// `gpt_oss_fused_parts`: MXFP4 codes and scales viewed as they lie (no
/// copy), unquantized weights transposed to `[out, in]`, biases widened.
pub fn gpt_oss_expert(
    name: &str,
    hidden: usize,
    inter: usize,
    mxfp4: bool,
    slices: &[(&str, SharedBytes)],
    activation: GluActivation,
) -> Result<SwigluExpert, WeightError> {
    build_gpt_oss_expert(name, hidden, inter, mxfp4, slices, activation, true)
}

/// [`gpt_oss_expert`] over zero-filled placeholder slices (a
/// [`Recorder`](crate::Recorder)'s answers): the transpose of zeros is the
/// same zeros, so bf16 slices are viewed as they are instead of moved into
/// owned memory (a recorded load holds no weight bytes).
pub(crate) fn gpt_oss_placeholder_expert(
    name: &str,
    hidden: usize,
    inter: usize,
    mxfp4: bool,
    slices: &[(&str, SharedBytes)],
    activation: GluActivation,
) -> Result<SwigluExpert, WeightError> {
    build_gpt_oss_expert(name, hidden, inter, mxfp4, slices, activation, false)
}

/// A gpt-oss expert; `move_elements` false views bf16 slices untransposed.
fn build_gpt_oss_expert(
    name: &str,
    hidden: usize,
    inter: usize,
    mxfp4: bool,
    slices: &[(&str, SharedBytes)],
    activation: GluActivation,
    move_elements: bool,
) -> Result<SwigluExpert, WeightError> {
    let layout = |message: String| WeightError::Layout {
        name: name.to_string(),
        message,
    };
    let want = if mxfp4 { 6 } else { 4 };
    if slices.len() != want {
        return Err(layout(format!("{} parts; a gpt-oss expert has {want}", slices.len())));
    }
    let bias = |(dtype, bytes): &(&str, SharedBytes), len: usize| -> Result<Vec<f32>, WeightError> {
        let d = dense_dtype(dtype).ok_or_else(|| layout(format!("a bias of dtype {dtype}")))?;
        if bytes.len() != len * d.size() {
            return Err(layout(format!("{} bias bytes for {len} {dtype} values", bytes.len())));
        }
        let mut out = vec![0.0f32; len];
        d.decode_into(bytes.as_slice(), &mut out);
        Ok(out)
    };
    let (gate_up, gate_up_bias, down, down_bias) = if mxfp4 {
        let gu = WeightMatrix::mxfp4(
            &format!("{name}.gate_up"),
            2 * inter,
            hidden,
            slices[0].1.clone(),
            slices[1].1.clone(),
        )?;
        let d = WeightMatrix::mxfp4(&format!("{name}.down"), hidden, inter, slices[3].1.clone(), slices[4].1.clone())?;
        (gu, bias(&slices[2], 2 * inter)?, d, bias(&slices[5], hidden)?)
    } else {
        let gu = transposed(&format!("{name}.gate_up"), &slices[0], hidden, 2 * inter, move_elements)?;
        let d = transposed(&format!("{name}.down"), &slices[2], inter, hidden, move_elements)?;
        (gu, bias(&slices[1], 2 * inter)?, d, bias(&slices[3], hidden)?)
    };
    SwigluExpert::interleaved(name, gate_up, gate_up_bias, down, down_bias, activation)
}

/// An input-major `[n_in, n_out]` dense slice as the `[n_out, n_in]`
/// matrix it means (the stored elements, moved; or, with `move_elements`
/// false, for zero-filled placeholders, the bytes viewed as they are).
fn transposed(
    name: &str,
    (dtype, bytes): &(&str, SharedBytes),
    n_in: usize,
    n_out: usize,
    move_elements: bool,
) -> Result<WeightMatrix, WeightError> {
    let d = dense_dtype(dtype).ok_or_else(|| WeightError::Layout {
        name: name.to_string(),
        message: format!("dtype {dtype} is not a dense weight dtype"),
    })?;
    let size = d.size();
    if bytes.len() != n_in * n_out * size {
        return Err(WeightError::Layout {
            name: name.to_string(),
            message: format!("{} bytes for [{n_in}, {n_out}] {dtype}", bytes.len()),
        });
    }
    if !move_elements {
        return WeightMatrix::new(name, d, n_out, n_in, bytes.clone());
    }
    let src = bytes.as_slice();
    let mut out = vec![0u8; src.len()];
    for i in 0..n_in {
        for o in 0..n_out {
            let (s, t) = ((i * n_out + o) * size, (o * n_in + i) * size);
            out[t..t + size].copy_from_slice(&src[s..s + size]);
        }
    }
    WeightMatrix::new(name, d, n_out, n_in, SharedBytes::from_vec(out))
}
