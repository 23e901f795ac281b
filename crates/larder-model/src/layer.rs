//! One decoder layer ([`DecoderLayer`]): its norms, its token mixer, its
//! feed-forward half (a dense MLP or a MoE block) and, for block attention
//! residuals, its depth queries; and loading it from the tensors under
//! `model.layers.{l}` as the layer's [`LayerSpec`] says. The decoder
//! ([`crate::decoder`]) stacks and runs them.

use std::sync::Arc;

use crate::attention::Mixer;
use crate::attn_residual::LayerAttnRes;
use crate::error::ModelError;
use crate::mlp::{load_mlp, Mlp};
use crate::moe::MoeBlock;
use crate::source::{TensorPath, WeightSource, WeightView};
use crate::spec::{FfnSpec, LayerSpec, ModelSpec, DENSE_MLP_PROJ};

/// The feed-forward half of a layer.
// One per layer, so the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Ffn {
    Dense(Mlp),
    Moe(MoeBlock),
}

/// One decoder layer.
pub(crate) struct DecoderLayer {
    pub input_norm: Vec<f32>,
    pub mixer: Mixer,
    pub post_attention_norm: Vec<f32>,
    pub ffn: Ffn,
    /// Block attention residuals (`ModelSpec::attn_res_block`), else `None`.
    pub attn_res: Option<LayerAttnRes>,
}

impl DecoderLayer {
    /// Layer `l` of `spec` (`layer_spec`), from the tensors under
    /// `model.layers.{l}`; with `in_ram`, also its routed experts (empty for
    /// a dense layer, or without `in_ram`: a provider streams them).
    pub(crate) fn load(
        spec: &ModelSpec,
        l: usize,
        layer_spec: &LayerSpec,
        weights: &dyn WeightSource,
        in_ram: bool,
    ) -> Result<(Self, Vec<Arc<Mlp>>), ModelError> {
        let at = WeightView::at(weights, TensorPath::decoder_layer(l));
        let mixer = Mixer::load(spec, layer_spec, &at.pp("self_attn"))?;
        let (ffn, experts) = load_ffn(spec, layer_spec, l, &at, in_ram)?;
        let h = spec.hidden_size;
        let layer = DecoderLayer {
            input_norm: at.vector("input_layernorm.weight", h)?,
            mixer,
            post_attention_norm: at.vector("post_attention_layernorm.weight", h)?,
            ffn,
            attn_res: match spec.attn_res_block {
                None => None,
                Some(block) => Some(LayerAttnRes::load(&at, l, block, h, spec.rms_norm_eps)?),
            },
        };
        Ok((layer, experts))
    }
}

/// The feed-forward half of layer `l` under `at` (`model.layers.{l}`): a
/// dense MLP under `mlp`, or the MoE block under the module
/// `spec.moe_names` says (with its routed experts when `in_ram`).
fn load_ffn(spec: &ModelSpec, layer: &LayerSpec, l: usize, at: &WeightView<'_>, in_ram: bool) -> Result<(Ffn, Vec<Arc<Mlp>>), ModelError> {
    match &layer.ffn {
        FfnSpec::Dense { intermediate } => {
            let mlp =
                load_mlp(&dense_mlp_block(at)?, DENSE_MLP_PROJ, spec.hidden_size, *intermediate)?.with_activation(spec.ffn_activation);
            Ok((Ffn::Dense(mlp), Vec::new()))
        }
        FfnSpec::Moe(m) => {
            let (moe, experts) = MoeBlock::load(spec, m, l, &at.pp(spec.moe_names.block), in_ram)?;
            Ok((Ffn::Moe(moe), experts))
        }
    }
}

/// A dense layer's MLP module: `mlp`, or `block_sparse_moe` where only that
/// ships (Kimi Linear as transformers 5.x `save_pretrained` may name it);
/// both is an error naming them.
fn dense_mlp_block<'a>(at: &WeightView<'a>) -> Result<WeightView<'a>, ModelError> {
    let (mlp, moe) = (at.pp("mlp"), at.pp("block_sparse_moe"));
    let gate = |v: &WeightView<'_>| v.pp(DENSE_MLP_PROJ[0]).has("weight");
    match (gate(&mlp)?, gate(&moe)?) {
        (false, true) => Ok(moe),
        (true, true) => Err(ModelError::Experts(format!(
            "{}: a dense layer ships its MLP twice, under mlp and block_sparse_moe; keep one",
            at.path()
        ))),
        _ => Ok(mlp),
    }
}
