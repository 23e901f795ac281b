//! The routed-expert entry point: a SwiGLU expert (`down(silu(gate(x)) *
//! up(x))`) whose three projections live in **one contiguous record**, bytes
//! as shipped (the unit the expert store reads with one I/O).
//!
//! When gate and up are adjacent in the record and share a format, they form
//! one `[2 * intermediate, hidden]` matrix and are computed by a single kernel
//! call (one sequential pass over both). Results are bit-identical to
//! computing the three projections separately: kernels compute every
//! (row, feature) with the same arithmetic whatever matrix it belongs to.

use crate::kernels::KernelError;
use crate::linear::Linear;
use crate::mat::Mat;
use crate::ops::silu;
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

/// A SwiGLU expert over one shared record.
#[derive(Debug, Clone)]
pub struct SwigluExpert {
    /// `[gate; up]` as one matrix when the record allows it.
    gate_up: Option<WeightMatrix>,
    gate: WeightMatrix,
    up: WeightMatrix,
    down: WeightMatrix,
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
        let gate_up = if fusable {
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
            gate_up,
            gate,
            up,
            down,
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
            gate_up: None,
            gate,
            up,
            down,
            intermediate: i,
        })
    }

    /// Weight bytes of the three projections (codes and scales).
    pub fn byte_len(&self) -> usize {
        self.gate.byte_len() + self.up.byte_len() + self.down.byte_len()
    }

    /// Whether gate and up run as one matrix.
    pub fn is_fused(&self) -> bool {
        self.gate_up.is_some()
    }

    /// `x [m, hidden] -> [m, hidden]`; an error, computing nothing, where
    /// `x` is not `hidden` wide.
    pub fn try_forward(&self, x: &Mat) -> Result<Mat, KernelError> {
        // The other products then fit by construction (`new`, `from_record`).
        crate::kernels::check_width(x, &self.gate)?;
        Ok(self.forward(x))
    }

    /// [`try_forward`](Self::try_forward) for callers whose shapes were
    /// checked when the model loaded.
    ///
    /// # Panics
    /// If `x` is not `hidden` wide.
    pub fn forward(&self, x: &Mat) -> Mat {
        let i = self.intermediate;
        let mut act = Mat::zeros(x.rows(), i);
        match &self.gate_up {
            Some(gu) => {
                let y = crate::kernels::matmul_t(x, gu);
                for r in 0..x.rows() {
                    let (g, u) = y.row(r).split_at(i);
                    for ((a, g), u) in act.row_mut(r).iter_mut().zip(g).zip(u) {
                        *a = silu(*g) * u;
                    }
                }
            }
            None => {
                let g = crate::kernels::matmul_t(x, &self.gate);
                let u = crate::kernels::matmul_t(x, &self.up);
                for ((a, g), u) in act.as_mut_slice().iter_mut().zip(g.as_slice()).zip(u.as_slice()) {
                    *a = silu(*g) * u;
                }
            }
        }
        crate::kernels::matmul_t(&act, &self.down)
    }

    /// The three projections as linear layers (for callers that need them apart).
    pub fn projections(&self) -> [Linear; 3] {
        [
            Linear::new(self.gate.clone(), None),
            Linear::new(self.up.clone(), None),
            Linear::new(self.down.clone(), None),
        ]
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
        let [g, u, d] = e.projections();
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
}
