//! `Linear`: `y = x W^T + b` with `W` in its shipped dtype and `x` in f32.

use crate::kernels::{self, KernelError};
use crate::mat::Mat;
use crate::weight::{WeightError, WeightMatrix};

/// A linear layer (torch `nn.Linear` layout: weight is `[out, in]`).
#[derive(Debug, Clone)]
pub struct Linear {
    weight: WeightMatrix,
    bias: Option<Vec<f32>>,
}

impl Linear {
    /// A layer of `weight` and an optional bias (one value per output
    /// feature); an error where the bias has another length.
    pub fn try_new(weight: WeightMatrix, bias: Option<Vec<f32>>) -> Result<Self, WeightError> {
        match &bias {
            Some(b) if b.len() != weight.rows() => Err(WeightError::Layout {
                name: "linear bias".into(),
                message: format!("{} values for a layer of {} output features", b.len(), weight.rows()),
            }),
            _ => Ok(Linear { weight, bias }),
        }
    }

    /// [`try_new`](Self::try_new) for loaders that checked the bias.
    ///
    /// # Panics
    /// If the bias length differs from the output features.
    pub fn new(weight: WeightMatrix, bias: Option<Vec<f32>>) -> Self {
        Linear::try_new(weight, bias).unwrap_or_else(|e| panic!("Linear: {e}"))
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

    /// `x [m, in] -> [m, out]`; an error, computing nothing, where `x` is
    /// not `in` wide.
    pub fn try_forward(&self, x: &Mat) -> Result<Mat, KernelError> {
        let mut y = kernels::try_matmul_t(x, &self.weight)?;
        if let Some(b) = &self.bias {
            for r in 0..y.rows() {
                for (v, bb) in y.row_mut(r).iter_mut().zip(b) {
                    *v += *bb;
                }
            }
        }
        Ok(y)
    }

    /// [`try_forward`](Self::try_forward) for callers whose shapes were
    /// checked when the model loaded.
    ///
    /// # Panics
    /// If `x` is not `in` wide.
    pub fn forward(&self, x: &Mat) -> Mat {
        self.try_forward(x).unwrap_or_else(|e| panic!("Linear: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::WeightDType;

    #[test]
    fn a_bias_or_activations_of_the_wrong_size_are_errors() {
        let w = || WeightMatrix::from_f32(WeightDType::BF16, 3, 4, &[0.5; 12]);
        let err = Linear::try_new(w(), Some(vec![0.0; 4])).unwrap_err();
        assert!(err.to_string().contains("4 values for a layer of 3 output features"), "{err}");
        let layer = Linear::try_new(w(), Some(vec![1.0, 2.0, 3.0])).unwrap();
        assert!(layer.try_forward(&Mat::zeros(1, 5)).is_err());
        let y = layer.try_forward(&Mat::from_vec(1, 4, vec![1.0; 4])).unwrap();
        assert_eq!(y.row(0), &[3.0, 4.0, 5.0]);
    }
}
