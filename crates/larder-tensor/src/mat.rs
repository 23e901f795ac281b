//! `Mat`: a dense row-major f32 matrix, the activation type of larder.
//!
//! One row per position of a batch. Activations are always f32 (the product
//! rule: weights compute in their shipped dtype, activations in f32).

/// A row-major f32 matrix of `rows x cols`.
#[derive(Debug, Clone, PartialEq)]
pub struct Mat {
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

impl Mat {
    /// A matrix of zeros.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Mat {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }

    /// Wraps `data` (length `rows * cols`, row-major).
    ///
    /// # Panics
    /// If the length does not match; callers build `data` from the same sizes.
    pub fn from_vec(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        assert_eq!(data.len(), rows * cols, "Mat::from_vec: {rows}x{cols} needs {} values", rows * cols);
        Mat { rows, cols, data }
    }

    /// Stacks equally long rows.
    pub fn from_rows<R: AsRef<[f32]>>(cols: usize, rows: &[R]) -> Self {
        let mut data = Vec::with_capacity(rows.len() * cols);
        for r in rows {
            let r = r.as_ref();
            assert_eq!(r.len(), cols, "Mat::from_rows: ragged rows");
            data.extend_from_slice(r);
        }
        Mat {
            rows: rows.len(),
            cols,
            data,
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.cols..(i + 1) * self.cols]
    }

    pub fn row_mut(&mut self, i: usize) -> &mut [f32] {
        &mut self.data[i * self.cols..(i + 1) * self.cols]
    }

    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        &mut self.data
    }

    pub fn into_vec(self) -> Vec<f32> {
        self.data
    }

    /// A new matrix made of the selected rows, in the given order.
    pub fn gather_rows(&self, idx: &[usize]) -> Mat {
        let mut data = Vec::with_capacity(idx.len() * self.cols);
        for &i in idx {
            data.extend_from_slice(self.row(i));
        }
        Mat {
            rows: idx.len(),
            cols: self.cols,
            data,
        }
    }

    /// Elementwise `self += other`.
    pub fn add_assign(&mut self, other: &Mat) {
        assert_eq!((self.rows, self.cols), (other.rows, other.cols), "Mat::add_assign: shape mismatch");
        for (a, b) in self.data.iter_mut().zip(&other.data) {
            *a += *b;
        }
    }
}
