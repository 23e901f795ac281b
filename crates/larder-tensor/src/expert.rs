//! The routed-expert entry point: a SwiGLU expert (`down(silu(gate(x)) *
//! up(x))`) whose three projections live in **one contiguous record**, bytes
//! as shipped (the unit the expert store reads with one I/O).
//!
//! When gate and up are adjacent in the record and share a format, they form
//! one `[2 * intermediate, hidden]` matrix and are computed by a single kernel
//! call (one sequential pass over both). Results are bit-identical to
//! computing the three projections separately: kernels compute every
//! (row, feature) with the same arithmetic whatever matrix it belongs to.
//!
//! gpt-oss experts ([`SwigluExpert::interleaved`]) are the same block with
//! one `[2 * intermediate, hidden]` gate/up matrix whose rows interleave
//! (row `2i` gate unit `i`, row `2i + 1` up unit `i`), biases on both
//! projections, and the clamped activation [`GluActivation::GptOss`].

use crate::dtype::WeightDType;
use crate::kernels::KernelError;
use crate::linear::Linear;
use crate::mat::Mat;
use crate::ops::{sigmoid, silu};
use crate::weight::{SharedBytes, WeightError, WeightFormat, WeightMatrix};

/// Where one projection sits in an expert record.
#[derive(Debug, Clone, PartialEq)]
pub struct ComponentLayout {
    pub format: WeightFormat,
    /// Byte range of the weight codes in the record.
    pub offset: usize,
    pub len: usize,
    /// Byte range of the scales (quantized formats): f32 little-endian for fp8
    /// and int4, e8m0 bytes for mxfp4.
    pub scales: Option<(usize, usize)>,
}

/// The layout of a SwiGLU expert record.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertLayout {
    pub hidden: usize,
    pub intermediate: usize,
    pub gate: ComponentLayout,
    pub up: ComponentLayout,
    pub down: ComponentLayout,
}

/// Where a bias vector sits in an expert record (stored dtype; widened to
/// f32 when the expert is built, as checkpoint biases are).
#[derive(Debug, Clone, PartialEq)]
pub struct BiasLayout {
    pub dtype: WeightDType,
    pub offset: usize,
}

/// The layout of a gpt-oss expert record: `gate_up` `[2 * intermediate,
/// hidden]` output-major with interleaved rows (row `2i` gate unit `i`,
/// `2i + 1` up unit `i`), its bias `[2 * intermediate]`, `down` `[hidden,
/// intermediate]`, its bias `[hidden]`.
#[derive(Debug, Clone, PartialEq)]
pub struct InterleavedLayout {
    pub hidden: usize,
    pub intermediate: usize,
    pub gate_up: ComponentLayout,
    pub gate_up_bias: BiasLayout,
    pub down: ComponentLayout,
    pub down_bias: BiasLayout,
    pub activation: GluActivation,
}

/// How a gated unit combines its gate and up pre-activations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GluActivation {
    /// `silu(gate) * up` (every SwiGLU model).
    Silu,
    /// gpt-oss (transformers 5.24.0 `GptOssExperts._apply_gate`):
    /// `gate' = min(gate, limit)`, `up' = clamp(up, -limit, limit)`,
    /// `(up' + 1) * (gate' * sigmoid(gate' * alpha))`. NaN stays NaN (as
    /// `torch.clamp`).
    GptOss { alpha: f32, limit: f32 },
    /// SiTU-GLU (Kimi K3, Moonshot's `SituAndMul`): `gate' = beta ·
    /// tanh(gate / beta) · sigmoid(gate)`, `up' = linear_beta · tanh(up /
    /// linear_beta)` when `linear_beta` is set (else `up` as it is), `gate' ·
    /// up'`. NaN stays NaN.
    Situ { beta: f32, linear_beta: Option<f32> },
}

impl GluActivation {
    /// The activation of one unit.
    #[inline]
    pub fn apply(self, gate: f32, up: f32) -> f32 {
        match self {
            GluActivation::Silu => silu(gate) * up,
            GluActivation::GptOss { alpha, limit } => {
                let g = if gate > limit { limit } else { gate };
                let u = if up > limit {
                    limit
                } else if up < -limit {
                    -limit
                } else {
                    up
                };
                (u + 1.0) * (g * sigmoid(g * alpha))
            }
            GluActivation::Situ { beta, linear_beta } => {
                let g = beta * (gate / beta).tanh() * sigmoid(gate);
                let u = match linear_beta {
                    Some(lb) => lb * (up / lb).tanh(),
                    None => up,
                };
                g * u
            }
        }
    }
}

/// The gate and up projections of an expert.
#[derive(Debug, Clone)]
enum GateUp {
    /// `gate`, `up` `[intermediate, hidden]`; `fused` is `[gate; up]` as one
    /// matrix when the record allows it.
    Separate {
        fused: Option<WeightMatrix>,
        gate: WeightMatrix,
        up: WeightMatrix,
    },
    /// One `[2 * intermediate, hidden]` matrix, row `2i` gate unit `i`, row
    /// `2i + 1` up unit `i`, and its bias (same order), added before the
    /// activation.
    Interleaved { gate_up: WeightMatrix, bias: Vec<f32> },
}

/// A SwiGLU expert over one shared record.
#[derive(Debug, Clone)]
pub struct SwigluExpert {
    gate_up: GateUp,
    down: WeightMatrix,
    /// Added to the down projection's output (gpt-oss).
    down_bias: Option<Vec<f32>>,
    activation: GluActivation,
    intermediate: usize,
}

impl SwigluExpert {
    /// Views the record's three projections (no copy); checks every range
    /// and size against the layout.
    pub fn from_record(name: &str, record: &SharedBytes, layout: &ExpertLayout) -> Result<Self, WeightError> {
        let (h, i) = (layout.hidden, layout.intermediate);
        let gate = component(&format!("{name}.gate"), record, &layout.gate, i, h)?;
        let up = component(&format!("{name}.up"), record, &layout.up, i, h)?;
        let down = component(&format!("{name}.down"), record, &layout.down, h, i)?;
        let (g, u) = (&layout.gate, &layout.up);
        let fusable = g.format == u.format && g.offset + g.len == u.offset && matches!(g.format, WeightFormat::Dense(_));
        let fused = if fusable {
            Some(component(
                &format!("{name}.gate_up"),
                record,
                &ComponentLayout {
                    format: g.format,
                    offset: g.offset,
                    len: g.len + u.len,
                    scales: None,
                },
                2 * i,
                h,
            )?)
        } else {
            None
        };
        Ok(SwigluExpert {
            gate_up: GateUp::Separate { fused, gate, up },
            down,
            down_bias: None,
            activation: GluActivation::Silu,
            intermediate: i,
        })
    }

    /// From three separate weights (e.g. checkpoint tensors): gate and up
    /// `[intermediate, hidden]`, down `[hidden, intermediate]`.
    pub fn new(name: &str, gate: WeightMatrix, up: WeightMatrix, down: WeightMatrix) -> Result<Self, WeightError> {
        let (i, h) = (gate.rows(), gate.cols());
        if (up.rows(), up.cols()) != (i, h) || (down.rows(), down.cols()) != (h, i) {
            return Err(WeightError::Layout {
                name: name.to_string(),
                message: format!(
                    "SwiGLU shapes disagree: gate {i}x{h}, up {}x{}, down {}x{}",
                    up.rows(),
                    up.cols(),
                    down.rows(),
                    down.cols()
                ),
            });
        }
        Ok(SwigluExpert {
            gate_up: GateUp::Separate { fused: None, gate, up },
            down,
            down_bias: None,
            activation: GluActivation::Silu,
            intermediate: i,
        })
    }

    /// A gpt-oss expert over one record (see [`InterleavedLayout`]); views
    /// the weights (no copy), widens the biases; checks every range.
    pub fn interleaved_from_record(name: &str, record: &SharedBytes, layout: &InterleavedLayout) -> Result<Self, WeightError> {
        let (h, i) = (layout.hidden, layout.intermediate);
        let gate_up = component(&format!("{name}.gate_up"), record, &layout.gate_up, 2 * i, h)?;
        let down = component(&format!("{name}.down"), record, &layout.down, h, i)?;
        let bias = |what: &str, b: &BiasLayout, len: usize| -> Result<Vec<f32>, WeightError> {
            let bytes = range(&format!("{name}.{what}"), record, b.offset, len * b.dtype.size())?;
            let mut out = vec![0.0f32; len];
            b.dtype.decode_into(bytes.as_slice(), &mut out);
            Ok(out)
        };
        let gate_up_bias = bias("gate_up_bias", &layout.gate_up_bias, 2 * i)?;
        let down_bias = bias("down_bias", &layout.down_bias, h)?;
        Self::interleaved(name, gate_up, gate_up_bias, down, down_bias, layout.activation)
    }

    /// A gpt-oss expert: `gate_up` `[2 * intermediate, hidden]` with
    /// interleaved rows (row `2i` gate unit `i`, `2i + 1` up unit `i`) and
    /// its bias `[2 * intermediate]`, `down` `[hidden, intermediate]` and its
    /// bias `[hidden]`, combined by `activation`.
    pub fn interleaved(
        name: &str,
        gate_up: WeightMatrix,
        gate_up_bias: Vec<f32>,
        down: WeightMatrix,
        down_bias: Vec<f32>,
        activation: GluActivation,
    ) -> Result<Self, WeightError> {
        let (two_i, h) = (gate_up.rows(), gate_up.cols());
        let i = two_i / 2;
        let shapes_fit = two_i % 2 == 0 && (down.rows(), down.cols()) == (h, i);
        if !shapes_fit || gate_up_bias.len() != two_i || down_bias.len() != h {
            return Err(WeightError::Layout {
                name: name.to_string(),
                message: format!(
                    "interleaved gate/up shapes disagree: gate_up {two_i}x{h} (bias {}), down {}x{} (bias {}); \
                     want gate_up [2I, H], bias [2I], down [H, I], bias [H]",
                    gate_up_bias.len(),
                    down.rows(),
                    down.cols(),
                    down_bias.len()
                ),
            });
        }
        Ok(SwigluExpert {
            gate_up: GateUp::Interleaved {
                gate_up,
                bias: gate_up_bias,
            },
            down,
            down_bias: Some(down_bias),
            activation,
            intermediate: i,
        })
    }

    /// Weight bytes of the three projections (codes and scales).
    /// Weight bytes of the projections (codes and scales, and biases as f32).
    pub fn byte_len(&self) -> usize {
        let gate_up = match &self.gate_up {
            GateUp::Separate { gate, up, .. } => gate.byte_len() + up.byte_len(),
            GateUp::Interleaved { gate_up, bias } => gate_up.byte_len() + 4 * bias.len(),
        };
        gate_up + self.down.byte_len() + 4 * self.down_bias.as_ref().map_or(0, Vec::len)
    }

    /// Whether gate and up run as one matrix.
    pub fn is_fused(&self) -> bool {
        matches!(self.gate_up, GateUp::Separate { fused: Some(_), .. } | GateUp::Interleaved { .. })
    }

    /// This expert combining gate and up with `activation` instead.
    pub fn with_activation(mut self, activation: GluActivation) -> Self {
        self.activation = activation;
        self
    }

    /// The gate/up activation.
    pub fn activation(&self) -> GluActivation {
        self.activation
    }

    /// The matrix `x` is multiplied by first (its width is the expert's input).
    fn first(&self) -> &WeightMatrix {
        match &self.gate_up {
            GateUp::Separate { gate, .. } => gate,
            GateUp::Interleaved { gate_up, .. } => gate_up,
        }
    }

    /// `x [m, hidden] -> [m, hidden]`; an error, computing nothing, where
    /// `x` is not `hidden` wide.
    pub fn try_forward(&self, x: &Mat) -> Result<Mat, KernelError> {
        // The other products then fit by construction (`new`, `from_record`).
        crate::kernels::check_width(x, self.first())?;
        Ok(self.forward(x))
    }

    /// [`try_forward`](Self::try_forward) for callers whose shapes were
    /// checked when the model loaded.
    ///
    /// # Panics
    /// If `x` is not `hidden` wide.
    pub fn forward(&self, x: &Mat) -> Mat {
        let (i, act_fn) = (self.intermediate, self.activation);
        let mut act = Mat::zeros(x.rows(), i);
        match &self.gate_up {
            GateUp::Separate { fused: Some(gu), .. } => {
                let y = crate::kernels::matmul_t(x, gu);
                for r in 0..x.rows() {
                    let (g, u) = y.row(r).split_at(i);
                    for ((a, g), u) in act.row_mut(r).iter_mut().zip(g).zip(u) {
                        *a = act_fn.apply(*g, *u);
                    }
                }
            }
            GateUp::Separate { fused: None, gate, up } => {
                let g = crate::kernels::matmul_t(x, gate);
                let u = crate::kernels::matmul_t(x, up);
                for ((a, g), u) in act.as_mut_slice().iter_mut().zip(g.as_slice()).zip(u.as_slice()) {
                    *a = act_fn.apply(*g, *u);
                }
            }
            GateUp::Interleaved { gate_up, bias } => {
                let y = crate::kernels::matmul_t(x, gate_up);
                for r in 0..x.rows() {
                    let pairs = y.row(r).chunks_exact(2).zip(bias.chunks_exact(2));
                    for (a, (gu, b)) in act.row_mut(r).iter_mut().zip(pairs) {
                        *a = act_fn.apply(gu[0] + b[0], gu[1] + b[1]);
                    }
                }
            }
        }
        let mut out = crate::kernels::matmul_t(&act, &self.down);
        if let Some(b) = &self.down_bias {
            for r in 0..out.rows() {
                for (o, b) in out.row_mut(r).iter_mut().zip(b) {
                    *o += b;
                }
            }
        }
        out
    }

    /// The three projections as linear layers (for callers that need them
    /// apart); `None` for an interleaved (gpt-oss) expert.
    pub fn projections(&self) -> Option<[Linear; 3]> {
        match &self.gate_up {
            GateUp::Separate { gate, up, .. } => Some([
                Linear::new(gate.clone(), None),
                Linear::new(up.clone(), None),
                Linear::new(self.down.clone(), None),
            ]),
            GateUp::Interleaved { .. } => None,
        }
    }
}

fn range(name: &str, record: &SharedBytes, offset: usize, len: usize) -> Result<SharedBytes, WeightError> {
    if offset.checked_add(len).is_none_or(|end| end > record.len()) {
        return Err(WeightError::Layout {
            name: name.to_string(),
            message: format!("bytes {offset}..+{len} lie outside the {}-byte record", record.len()),
        });
    }
    Ok(record.slice(offset, len))
}

fn f32s(bytes: &SharedBytes) -> Vec<f32> {
    bytes
        .as_slice()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn component(name: &str, record: &SharedBytes, c: &ComponentLayout, rows: usize, cols: usize) -> Result<WeightMatrix, WeightError> {
    let codes = range(name, record, c.offset, c.len)?;
    let scales = || match c.scales {
        Some((o, l)) => range(name, record, o, l),
        None => Err(WeightError::Layout {
            name: name.to_string(),
            message: format!("{} needs scales", c.format),
        }),
    };
    match c.format {
        WeightFormat::Dense(d) => WeightMatrix::new(name, d, rows, cols, codes),
        WeightFormat::Fp8Block { block_rows, block_cols } => {
            WeightMatrix::fp8_block(name, rows, cols, codes, f32s(&scales()?), block_rows, block_cols)
        }
        WeightFormat::Mxfp4 => WeightMatrix::mxfp4(name, rows, cols, codes, scales()?),
        WeightFormat::Int4Group { group } => WeightMatrix::int4_group(name, rows, cols, codes, f32s(&scales()?), group),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{encode, WeightDType};

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 1000.0 - 0.5)
            .collect()
    }

    fn dense_record(h: usize, i: usize) -> (SharedBytes, ExpertLayout) {
        let d = WeightDType::BF16;
        let mut bytes = Vec::new();
        let mut comp = |rows: usize, cols: usize, seed: u32| {
            let offset = bytes.len();
            bytes.extend(encode(d, &values(rows * cols, seed)));
            ComponentLayout {
                format: WeightFormat::Dense(d),
                offset,
                len: rows * cols * 2,
                scales: None,
            }
        };
        let (gate, up, down) = (comp(i, h, 1), comp(i, h, 2), comp(h, i, 3));
        (
            SharedBytes::from_vec(bytes),
            ExpertLayout {
                hidden: h,
                intermediate: i,
                gate,
                up,
                down,
            },
        )
    }

    #[test]
    fn fused_gate_up_is_bit_identical_to_separate_projections() {
        let (h, i) = (96, 40);
        let (record, layout) = dense_record(h, i);
        let e = SwigluExpert::from_record("e", &record, &layout).unwrap();
        assert!(e.is_fused());
        let x = Mat::from_vec(3, h, values(3 * h, 9));
        let [g, u, d] = e.projections().unwrap();
        let (gy, uy) = (g.forward(&x), u.forward(&x));
        let mut act = Mat::zeros(3, i);
        for ((a, g), u) in act.as_mut_slice().iter_mut().zip(gy.as_slice()).zip(uy.as_slice()) {
            *a = silu(*g) * u;
        }
        assert_eq!(e.forward(&x), d.forward(&act));
    }

    #[test]
    fn activations_of_the_wrong_width_are_errors() {
        let (h, i) = (96, 40);
        let (record, layout) = dense_record(h, i);
        let e = SwigluExpert::from_record("e", &record, &layout).unwrap();
        let err = e.try_forward(&Mat::zeros(2, h + 1)).unwrap_err();
        assert!(err.to_string().contains("width 97"), "{err}");
        let x = Mat::from_vec(2, h, values(2 * h, 5));
        assert_eq!(e.try_forward(&x).unwrap(), e.forward(&x));
    }

    #[test]
    fn bad_records_are_errors() {
        let (record, mut layout) = dense_record(32, 8);
        layout.down.offset = record.len() - 4;
        assert!(SwigluExpert::from_record("e", &record, &layout).is_err());
        let (record, mut layout) = dense_record(32, 8);
        layout.gate.format = WeightFormat::Mxfp4;
        assert!(SwigluExpert::from_record("e", &record, &layout)
            .unwrap_err()
            .to_string()
            .contains("scales"));
        let (record, mut layout) = dense_record(32, 8);
        layout.up.len -= 2;
        assert!(SwigluExpert::from_record("e", &record, &layout).is_err());
    }

    #[test]
    fn gpt_oss_activation_clamps_as_transformers() {
        let a = GluActivation::GptOss { alpha: 1.702, limit: 7.0 };
        let reference = |g: f32, u: f32| (u + 1.0) * (g * sigmoid(g * 1.702));
        assert_eq!(a.apply(9.0, 0.5), reference(7.0, 0.5));
        assert_eq!(a.apply(-9.0, 0.5), reference(-9.0, 0.5));
        assert_eq!(a.apply(1.0, 8.0), reference(1.0, 7.0));
        assert_eq!(a.apply(1.0, -8.0), reference(1.0, -7.0));
        assert!(a.apply(f32::NAN, 0.0).is_nan() && a.apply(0.5, f32::NAN).is_nan());
        assert_eq!(GluActivation::Silu.apply(2.0, 3.0), silu(2.0) * 3.0);
        // SiTU: both tanh clips, in f32 (Moonshot's SituAndMul).
        let situ = GluActivation::Situ {
            beta: 4.0,
            linear_beta: Some(25.0),
        };
        let want = 4.0 * (9.0f32 / 4.0).tanh() * sigmoid(9.0) * (25.0 * (-60.0f32 / 25.0).tanh());
        assert_eq!(situ.apply(9.0, -60.0), want);
        let unclipped = GluActivation::Situ {
            beta: 1.0,
            linear_beta: None,
        };
        assert_eq!(unclipped.apply(-2.0, 100.0), (-2.0f32).tanh() * sigmoid(-2.0) * 100.0);
        assert!(situ.apply(f32::NAN, 1.0).is_nan());
    }

    #[test]
    fn interleaved_expert_pairs_rows_and_adds_biases() {
        let (h, i) = (64, 8);
        let d = WeightDType::BF16;
        let gu = WeightMatrix::from_f32(d, 2 * i, h, &values(2 * i * h, 11));
        let down = WeightMatrix::from_f32(d, h, i, &values(h * i, 12));
        let (gub, db) = (values(2 * i, 13), values(h, 14));
        let act = GluActivation::GptOss { alpha: 1.702, limit: 0.1 };
        let e = SwigluExpert::interleaved("e", gu.clone(), gub.clone(), down.clone(), db.clone(), act).unwrap();
        assert!(e.is_fused() && e.projections().is_none());
        let x = Mat::from_vec(3, h, values(3 * h, 15));
        let y = Linear::new(gu, Some(gub)).forward(&x);
        let mut a = Mat::zeros(3, i);
        for r in 0..3 {
            for u in 0..i {
                a.row_mut(r)[u] = act.apply(y.row(r)[2 * u], y.row(r)[2 * u + 1]);
            }
        }
        assert_eq!(e.forward(&x), Linear::new(down.clone(), Some(db.clone())).forward(&a));
        let bad = SwigluExpert::interleaved("e", down.clone(), vec![0.0; h], down, db, act);
        assert!(bad.unwrap_err().to_string().contains("interleaved"));
    }

    #[test]
    fn an_interleaved_record_is_the_same_expert() {
        let (h, i, d) = (64, 8, WeightDType::BF16);
        let parts = [values(2 * i * h, 21), values(2 * i, 22), values(h * i, 23), values(h, 24)];
        let mut bytes = Vec::new();
        let mut offsets = Vec::new();
        for p in &parts {
            offsets.push(bytes.len());
            bytes.extend(encode(d, p));
        }
        let dense = |k: usize, len: usize| ComponentLayout {
            format: WeightFormat::Dense(d),
            offset: offsets[k],
            len,
            scales: None,
        };
        let act = GluActivation::GptOss { alpha: 1.702, limit: 0.2 };
        let layout = InterleavedLayout {
            hidden: h,
            intermediate: i,
            gate_up: dense(0, 2 * i * h * 2),
            gate_up_bias: BiasLayout {
                dtype: d,
                offset: offsets[1],
            },
            down: dense(2, h * i * 2),
            down_bias: BiasLayout {
                dtype: d,
                offset: offsets[3],
            },
            activation: act,
        };
        let record = SharedBytes::from_vec(bytes);
        let from_record = SwigluExpert::interleaved_from_record("e", &record, &layout).unwrap();
        let m = |v: &[f32], r, c| WeightMatrix::from_f32(d, r, c, v);
        let rounded = |v: &[f32]| {
            let mut out = vec![0.0; v.len()];
            d.decode_into(&encode(d, v), &mut out);
            out
        };
        let direct = SwigluExpert::interleaved(
            "e",
            m(&parts[0], 2 * i, h),
            rounded(&parts[1]),
            m(&parts[2], h, i),
            rounded(&parts[3]),
            act,
        )
        .unwrap();
        let x = Mat::from_vec(2, h, values(2 * h, 25));
        assert_eq!(from_record.forward(&x), direct.forward(&x));
        let mut short = layout.clone();
        short.down_bias.offset = record.len() - 2;
        assert!(SwigluExpert::interleaved_from_record("e", &record, &short).is_err());
    }
}
