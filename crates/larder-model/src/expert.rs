//! Where routed experts come from. The model asks an [`ExpertProvider`] for
//! the experts of one layer step and never learns whether their bytes were in
//! RAM, in a cache or on a drive.
//!
//! Also: the names and shapes of each routed expert's tensors, as the
//! loader asks for them ([`expert_tensors`]), and loading every routed
//! expert of a layer into RAM ([`load_routed_experts`]). Where each shipped
//! part of every expert lies is [`crate::expert_parts`]'.

use std::sync::Arc;

use crate::error::ModelError;
use crate::fused_experts::load_gpt_oss_layer;
use crate::mlp::Mlp;
use crate::source::{with_expert_tag, ExpertTag, TensorPath, WeightSource};
use crate::spec::{ExpertKind, FfnSpec, ModelSpec};

/// Supplies routed expert weights.
pub trait ExpertProvider: Send + Sync {
    /// Calls `run(i, expert)` once for each `ids[i]` (sorted, unique) of
    /// `layer`, in any order (a streaming provider calls it as bytes arrive,
    /// so computing one expert overlaps reading the next). Stops at the
    /// first error, from the provider or from `run`.
    fn with_experts(
        &self,
        layer: usize,
        ids: &[usize],
        run: &mut dyn FnMut(usize, &Mlp) -> Result<(), ModelError>,
    ) -> Result<(), ModelError>;

    /// A hint that `layer` will probably need `ids` soon (sorted, unique):
    /// a streaming provider may start reading them in the background. It
    /// must never change results, only when bytes arrive. Default: ignored.
    fn prefetch(&self, _layer: usize, _ids: &[usize]) {}

    /// Whether an expert's bytes are in RAM now (reading it costs no I/O).
    fn is_resident(&self, _layer: usize, _expert: usize) -> bool {
        true
    }

    /// Whether [`prefetch`](Self::prefetch) does anything (the model skips
    /// predicting otherwise).
    fn wants_prefetch(&self) -> bool {
        false
    }
}

/// Every expert held in memory (the all-in-RAM path, and the reference every
/// streaming provider must match bit for bit).
#[derive(Default)]
pub struct InMemoryExperts {
    /// `layers[l]` is empty for dense layers.
    layers: Vec<Vec<Arc<Mlp>>>,
}

impl InMemoryExperts {
    pub fn new(layers: Vec<Vec<Arc<Mlp>>>) -> Self {
        InMemoryExperts { layers }
    }
}

impl ExpertProvider for InMemoryExperts {
    fn with_experts(
        &self,
        layer: usize,
        ids: &[usize],
        run: &mut dyn FnMut(usize, &Mlp) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        let experts = self
            .layers
            .get(layer)
            .ok_or_else(|| ModelError::Experts(format!("no layer {layer}")))?;
        for (i, &e) in ids.iter().enumerate() {
            let mlp = experts
                .get(e)
                .ok_or_else(|| ModelError::Experts(format!("layer {layer} has no expert {e}")))?;
            run(i, mlp)?;
        }
        Ok(())
    }
}

/// One routed expert tensor: its checkpoint name and `[rows, cols]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertTensor {
    /// `gate`, `up` or `down`.
    pub role: &'static str,
    pub name: String,
    pub shape: [usize; 2],
}

/// The routed-expert layers of a model: `(layer, number of experts)`.
pub fn expert_layers(spec: &ModelSpec) -> Vec<(usize, usize)> {
    spec.layers
        .iter()
        .enumerate()
        .filter_map(|(l, ls)| match &ls.ffn {
            FfnSpec::Moe(m) => Some((l, m.num_experts)),
            FfnSpec::Dense { .. } => None,
        })
        .collect()
}

/// The module of expert `expert` of MoE layer `layer`
/// (`model.layers.{layer}.{block}.experts.{expert}`).
fn expert_path(spec: &ModelSpec, layer: usize, expert: usize) -> TensorPath {
    TensorPath::decoder_layer(layer).pp(spec.moe_names.block).pp("experts").pp(expert)
}

/// The tensors of expert `expert` of MoE layer `layer` (gate, up, down), or
/// `None` for a dense layer.
pub fn expert_tensors(spec: &ModelSpec, layer: usize, expert: usize) -> Option<[ExpertTensor; 3]> {
    let FfnSpec::Moe(m) = &spec.layers.get(layer)?.ffn else {
        return None;
    };
    // Latent-space experts are `latent` wide, not `hidden_size`.
    let (h, i) = (m.expert_width(spec.hidden_size), m.expert_intermediate);
    let path = expert_path(spec, layer, expert);
    let t = |k: usize, role, shape| ExpertTensor {
        role,
        name: path.pp(spec.moe_names.expert_proj[k]).name("weight"),
        shape,
    };
    Some([t(0, "gate", [i, h]), t(1, "up", [i, h]), t(2, "down", [h, i])])
}

/// Every routed expert of MoE layer `layer`, in RAM (what
/// [`InMemoryExperts`] holds), each request tagged with its [`ExpertTag`]:
/// gpt-oss's from its fused tensors, the others' from [`expert_tensors`].
pub fn load_routed_experts(spec: &ModelSpec, layer: usize, weights: &dyn WeightSource) -> Result<Vec<Arc<Mlp>>, ModelError> {
    let not_moe = || ModelError::Experts(format!("layer {layer}: not a MoE layer"));
    let FfnSpec::Moe(m) = &spec.layers.get(layer).ok_or_else(not_moe)?.ffn else {
        return Err(not_moe());
    };
    if let ExpertKind::GptOss { .. } = m.experts {
        return load_gpt_oss_layer(spec, layer, weights);
    }
    (0..m.num_experts)
        .map(|e| {
            let [g, u, d] = expert_tensors(spec, layer, e).ok_or_else(not_moe)?;
            let load = |t: &ExpertTensor| {
                let tag = ExpertTag {
                    layer,
                    expert: Some(e),
                    role: t.role,
                };
                with_expert_tag(weights, tag, || weights.matrix(&t.name, t.shape[0], t.shape[1]))
            };
            let (g, u, d) = (load(&g)?, load(&u)?, load(&d)?);
            let mlp = Mlp::new(expert_path(spec, layer, e).as_str(), g, u, d)?;
            Ok(Arc::new(mlp.with_activation(spec.ffn_activation)))
        })
        .collect()
}
