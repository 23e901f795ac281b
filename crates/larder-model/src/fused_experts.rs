//! Routed experts shipped as slices of per-layer fused tensors (gpt-oss,
//! [`ExpertKind::GptOss`]): what each expert needs ([`gpt_oss_expert_parts`])
//! and loading every expert of a layer into RAM ([`load_gpt_oss_layer`]).
//!
//! transformers 5.24.0 (`GptOssExperts`) holds and saves, per MoE layer,
//! `gate_up_proj` `[E, H, 2I]` and `down_proj` `[E, I, H]` input-major
//! (`x @ W[e]`), with `gate_up_proj_bias` `[E, 2I]` and `down_proj_bias`
//! `[E, H]`. larder's matrices are output-major (`[out, in]`), so expert `e`
//! takes slice `[e]` of each weight transposed: element for element the
//! stored values in the stored dtype, nothing widened or rounded. gate_up's
//! output units stay interleaved (row `2i` gate unit `i`, `2i + 1` up unit `i`).

use std::sync::Arc;

use larder_tensor::expert::GluActivation;
use larder_tensor::weight::SharedBytes;
use larder_tensor::{WeightDType, WeightMatrix};

use crate::checkpoint::Checkpoint;
use crate::config::ExpertKind;
use crate::error::ModelError;
use crate::mlp::Mlp;

/// One fused per-layer tensor an expert takes slice `[e]` of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FusedPart {
    /// Checkpoint name (`model.layers.{L}.mlp.experts.gate_up_proj`, ...).
    pub name: String,
    /// Stored shape, experts first.
    pub shape: Vec<usize>,
}

/// The four fused tensors of a gpt-oss MoE layer at `block`
/// (`model.layers.{L}.mlp`), for `experts` experts of `hidden` -> `inter`:
/// gate_up `[E, H, 2I]`, gate_up bias `[E, 2I]`, down `[E, I, H]`, down bias `[E, H]`.
pub fn gpt_oss_expert_parts(block: &str, experts: usize, hidden: usize, inter: usize) -> [FusedPart; 4] {
    let part = |n: &str, shape: Vec<usize>| FusedPart {
        name: format!("{block}.experts.{n}"),
        shape,
    };
    [
        part("gate_up_proj", vec![experts, hidden, 2 * inter]),
        part("gate_up_proj_bias", vec![experts, 2 * inter]),
        part("down_proj", vec![experts, inter, hidden]),
        part("down_proj_bias", vec![experts, hidden]),
    ]
}

/// Every expert of the gpt-oss MoE layer at `block`, in RAM.
pub fn load_gpt_oss_layer(
    ckpt: &Checkpoint,
    block: &str,
    experts: usize,
    hidden: usize,
    inter: usize,
    kind: ExpertKind,
) -> Result<Vec<Arc<Mlp>>, ModelError> {
    let ExpertKind::GptOss { alpha, limit } = kind else {
        return Err(ModelError::Experts(format!("{block}: not a gpt-oss expert layer")));
    };
    let [gu, gub, down, db] = gpt_oss_expert_parts(block, experts, hidden, inter);
    let gate_up = FusedMatrices::read(ckpt, &gu)?;
    let down_w = FusedMatrices::read(ckpt, &down)?;
    let gate_up_bias = ckpt.tensor_f32(&gub.name, &gub.shape)?;
    let down_bias = ckpt.tensor_f32(&db.name, &db.shape)?;
    (0..experts)
        .map(|e| {
            let name = format!("{block}.experts.{e}");
            let mlp = Mlp::interleaved(
                &name,
                gate_up.expert(e)?,
                gate_up_bias[e * 2 * inter..(e + 1) * 2 * inter].to_vec(),
                down_w.expert(e)?,
                down_bias[e * hidden..(e + 1) * hidden].to_vec(),
                GluActivation::GptOss { alpha, limit },
            )?;
            Ok(Arc::new(mlp))
        })
        .collect()
}

/// A fused `[E, in, out]` weight read whole, handing out expert `e` as an
/// `[out, in]` matrix.
struct FusedMatrices {
    name: String,
    dtype: WeightDType,
    /// `in`, `out`.
    dims: (usize, usize),
    bytes: Vec<u8>,
}

impl FusedMatrices {
    fn read(ckpt: &Checkpoint, part: &FusedPart) -> Result<Self, ModelError> {
        let info = ckpt.tensor_info(&part.name)?;
        let dtype = match info.dtype.as_str() {
            "BF16" => WeightDType::BF16,
            "F16" => WeightDType::F16,
            "F32" => WeightDType::F32,
            other => {
                return Err(ModelError::TensorDType {
                    name: part.name.clone(),
                    path: ckpt.file_paths()[info.file].clone(),
                    dtype: other.to_string(),
                })
            }
        };
        // tensor_f32's shape and size checks, without widening: check the shape here.
        if info.shape != part.shape {
            return Err(ModelError::TensorShape {
                name: part.name.clone(),
                path: ckpt.file_paths()[info.file].clone(),
                got: info.shape,
                expected: part.shape.clone(),
            });
        }
        // An unread checkpoint (sizes and plans only) hands out zeros, as `Checkpoint::matrix` does.
        let bytes = match ckpt.reads_weights() {
            true => ckpt.tensor_bytes(&part.name)?,
            false => vec![0u8; info.len as usize],
        };
        let (e, n_in, n_out) = (part.shape[0], part.shape[1], part.shape[2]);
        if bytes.len() != e * n_in * n_out * dtype.size() {
            return Err(ModelError::Experts(format!(
                "{}: {} bytes for {:?} {dtype:?}",
                part.name,
                bytes.len(),
                part.shape
            )));
        }
        Ok(FusedMatrices {
            name: part.name.clone(),
            dtype,
            dims: (n_in, n_out),
            bytes,
        })
    }

    /// Expert `e`'s slice, transposed to `[out, in]` (the stored elements, moved).
    fn expert(&self, e: usize) -> Result<WeightMatrix, ModelError> {
        let (n_in, n_out) = self.dims;
        let size = self.dtype.size();
        let slice = &self.bytes[e * n_in * n_out * size..(e + 1) * n_in * n_out * size];
        let mut out = vec![0u8; slice.len()];
        for i in 0..n_in {
            for o in 0..n_out {
                let src = (i * n_out + o) * size;
                let dst = (o * n_in + i) * size;
                out[dst..dst + size].copy_from_slice(&slice[src..src + size]);
            }
        }
        let name = format!("{}[{e}]", self.name);
        Ok(WeightMatrix::new(&name, self.dtype, n_out, n_in, SharedBytes::from_vec(out))?)
    }
}
