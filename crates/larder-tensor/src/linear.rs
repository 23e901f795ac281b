//! `Linear`: `y = x W^T + b` with `W` in its shipped dtype and `x` in f32.

use crate::kernels;
use crate::mat::Mat;
use crate::weight::WeightMatrix;

/// A linear layer (torch `nn.Linear` layout: weight is `[out, in]`).
#[derive(Debug, Clone)]
pub struct Linear {
    weight: WeightMatrix,
    bias: Option<Vec<f32>>,
}

impl Linear {
    /// # Panics
    /// If the bias length differs from the output features (checked by loaders).
    pub fn new(weight: WeightMatrix, bias: Option<Vec<f32>>) -> Self {
        if let Some(b) = &bias {
            assert_eq!(b.len(), weight.rows(), "Linear: bias length");
        }
        Linear { weight, bias }
    }

    pub fn weight(&self) -> &WeightMatrix {
        &self.weight
    }

    pub fn in_features(&self) -> usize {
        self.weight.cols()
    }

    pub fn out_features(&self) -> usize {
        self.weight.rows()
    }

    /// `x [m, in] -> [m, out]`.
    pub fn forward(&self, x: &Mat) -> Mat {
        let mut y = kernels::matmul_t(x, &self.weight);
        if let Some(b) = &self.bias {
            for r in 0..y.rows() {
                for (v, bb) in y.row_mut(r).iter_mut().zip(b) {
                    *v += *bb;
                }
            }
        }
        y
    }
}
