//! The MoE step (docs/design.md §3): route every row, fetch the union of chosen
//! experts once, run each expert on exactly the rows that chose it, and sum
//! each row's expert outputs in its canonical router order. Optional shared
//! expert (with Qwen2-MoE's sigmoid gate) is added after.
//!
//! Latent-space experts (Kimi K3, Moonshot's `KimiSparseMoeBlock`): the
//! router and the shared experts see the full hidden rows; the routed
//! experts run on `routed_expert_down_proj · x`, their weighted sum (in
//! latent space, f32, canonical order) goes through `routed_expert_norm`
//! (when `latent_moe_use_norm`) and `routed_expert_up_proj` back to the
//! hidden width; the shared experts' output is added last.

use std::sync::Arc;

use larder_router::{Route, Router, RouterError, SigmoidGroupTopK, SoftmaxTopK, TopKSoftmax};
use larder_tensor::ops::{rms_norm, sigmoid};
use larder_tensor::{Linear, Mat};

use crate::error::ModelError;
use crate::expert::{load_routed_experts, ExpertProvider};
use crate::mlp::{load_mlp, Mlp};
use crate::source::WeightView;
use crate::spec::{LatentSpec, ModelSpec, MoeSpec, Scoring, SharedExpertSpec, DENSE_MLP_PROJ};

/// An always-applied shared expert.
pub(crate) struct SharedExpert {
    pub mlp: Mlp,
    /// `sigmoid(gate(x))` scales the shared output (Qwen2-MoE).
    pub gate: Option<Linear>,
}

/// The projections around latent-space experts (spine tensors, in RAM).
pub(crate) struct LatentProj {
    /// `routed_expert_down_proj`, `[latent, hidden]`: the experts' input.
    pub down: Linear,
    /// `routed_expert_norm.weight` `[latent]` and its eps: RMSNorm of the
    /// experts' weighted sum (`latent_moe_use_norm`).
    pub norm: Option<(Vec<f32>, f32)>,
    /// `routed_expert_up_proj`, `[hidden, latent]`: back from the experts' weighted sum.
    pub up: Linear,
}

impl LatentProj {
    /// `routed_expert_down_proj.weight`, `routed_expert_up_proj.weight` and
    /// (with a norm) `routed_expert_norm.weight` under `block` (no biases);
    /// a missing tensor is an error naming it.
    pub(crate) fn load(block: &WeightView<'_>, hidden: usize, latent: LatentSpec, eps: f32) -> Result<LatentProj, ModelError> {
        let w = latent.width;
        if let Some(shape) = block.pp("routed_expert_down_proj").stored_shape("weight")? {
            if shape != [w, hidden] {
                return Err(ModelError::config(
                    &block.config_path(),
                    "routed_expert_hidden_size",
                    format!(
                        "is {w}, but tensor `{}` has shape {shape:?} (want [{w}, {hidden}] with hidden_size {hidden})",
                        block.name("routed_expert_down_proj.weight")
                    ),
                ));
            }
        }
        Ok(LatentProj {
            down: block.linear("routed_expert_down_proj", w, hidden)?,
            norm: match latent.norm {
                true => Some((block.pp("routed_expert_norm").vector("weight", w)?, eps)),
                false => None,
            },
            up: block.linear("routed_expert_up_proj", hidden, w)?,
        })
    }

    /// The experts' weighted sum `y` `[rows, latent]` back at the hidden width.
    fn up(&self, y: Mat) -> Mat {
        match &self.norm {
            Some((weight, eps)) => self.up.forward(&rms_norm(&y, weight, *eps)),
            None => self.up.forward(&y),
        }
    }
}

impl SharedExpert {
    /// The shared expert under `block` (the module `spec.moe_names` says),
    /// with its sigmoid gate when `shared` has one.
    pub(crate) fn load(spec: &ModelSpec, shared: &SharedExpertSpec, block: &WeightView<'_>) -> Result<SharedExpert, ModelError> {
        let (h, names) = (spec.hidden_size, &spec.moe_names);
        Ok(SharedExpert {
            mlp: load_mlp(&block.pp(names.shared_expert), DENSE_MLP_PROJ, h, shared.intermediate)?.with_activation(spec.ffn_activation),
            gate: match shared.sigmoid_gate {
                true => Some(block.linear(names.shared_expert_gate, 1, h)?),
                false => None,
            },
        })
    }
}

/// A routed MoE block.
pub(crate) struct MoeBlock {
    pub layer: usize,
    pub router: Linear,
    pub routing: Router,
    /// Latent-space experts: the projections around them (`None`: experts at hidden width).
    pub latent: Option<LatentProj>,
    pub shared: Option<SharedExpert>,
}

impl MoeBlock {
    /// MoE layer `layer` as `m` says, from its tensors under `block`
    /// (`model.layers.{layer}.{moe_names.block}`): router, shared expert,
    /// routing function, latent projections; with `in_ram`, also every
    /// routed expert (for [`InMemoryExperts`](crate::InMemoryExperts)),
    /// returned beside the block (empty otherwise: a provider streams them).
    pub(crate) fn load(
        spec: &ModelSpec,
        m: &MoeSpec,
        layer: usize,
        block: &WeightView<'_>,
        in_ram: bool,
    ) -> Result<(MoeBlock, Vec<Arc<Mlp>>), ModelError> {
        let router = block.pp(spec.moe_names.router);
        let router_bias = match m.scoring {
            Scoring::TopKSoftmax => Some(router.vector("bias", m.num_experts)?),
            _ => None,
        };
        let router_weight = Linear::new(router.param_matrix("weight", m.num_experts, spec.hidden_size)?, router_bias);
        let shared = m.shared_expert.as_ref().map(|s| SharedExpert::load(spec, s, block)).transpose()?;
        let latent = m
            .latent
            .map(|l| LatentProj::load(block, spec.hidden_size, l, spec.rms_norm_eps))
            .transpose()?;
        let experts = match in_ram {
            true => load_routed_experts(spec, layer, block.source())?,
            false => Vec::new(),
        };
        let moe = MoeBlock {
            layer,
            router: router_weight,
            routing: routing(m, layer, &router)?,
            latent,
            shared,
        };
        Ok((moe, experts))
    }

    /// Routes every row of `x`.
    pub(crate) fn route(&self, x: &Mat) -> Vec<Route> {
        let logits = self.router.forward(x);
        (0..x.rows()).map(|r| self.routing.route(logits.row(r))).collect()
    }

    /// Computes the block for rows `x`, returning the routes it took; with
    /// `resident_only`, each row keeps only
    /// the chosen experts the provider holds in RAM, their weights rescaled
    /// to the original total (the cheap, approximate pass a self-draft uses;
    /// never used for tokens the model emits).
    pub(crate) fn forward_with(&self, x: &Mat, experts: &dyn ExpertProvider, resident_only: bool) -> Result<(Mat, Vec<Route>), ModelError> {
        let mut routes = self.route(x);
        if resident_only {
            for r in routes.iter_mut() {
                let total: f32 = r.weights.iter().sum();
                let keep: Vec<(usize, f32)> = r
                    .experts
                    .iter()
                    .zip(&r.weights)
                    .filter(|(&e, _)| experts.is_resident(self.layer, e))
                    .map(|(&e, &w)| (e, w))
                    .collect();
                let kept: f32 = keep.iter().map(|(_, w)| w).sum();
                r.experts = keep.iter().map(|(e, _)| *e).collect();
                r.weights = keep.iter().map(|(_, w)| if kept > 0.0 { w * total / kept } else { 0.0 }).collect();
            }
        }
        let mut union: Vec<usize> = routes.iter().flat_map(|r| r.experts.iter().copied()).collect();
        union.sort_unstable();
        union.dedup();
        // The experts' input: the rows themselves, or their latent projections.
        let latent_x = self.latent.as_ref().map(|p| p.down.forward(x));
        let expert_x = latent_x.as_ref().unwrap_or(x);
        // outputs[row][slot]: the output of the row's slot-th routed expert.
        let mut outputs: Vec<Vec<Option<Vec<f32>>>> = routes.iter().map(|r| vec![None; r.experts.len()]).collect();
        // The shared expert runs when the first routed expert is handed over:
        // a streaming provider has its reads in flight by then, so this
        // compute overlaps them. It is added after the routed sum whenever it ran.
        let mut shared_out: Option<(Mat, Option<Mat>)> = None;
        // Experts may arrive in any order; each fills its own slots, and the
        // sum below runs in canonical router order.
        experts.with_experts(self.layer, &union, &mut |i, mlp| {
            if shared_out.is_none() {
                shared_out = self.shared_forward(x);
            }
            let e = union[i];
            let mut rows = Vec::new();
            let mut slots = Vec::new();
            for (r, route) in routes.iter().enumerate() {
                if let Some(s) = route.experts.iter().position(|&x| x == e) {
                    rows.push(r);
                    slots.push(s);
                }
            }
            let y = mlp.forward(&expert_x.gather_rows(&rows));
            for (k, (&r, &s)) in rows.iter().zip(&slots).enumerate() {
                outputs[r][s] = Some(y.row(k).to_vec());
            }
            Ok(())
        })?;

        let mut out = Mat::zeros(expert_x.rows(), expert_x.cols());
        for (r, route) in routes.iter().enumerate() {
            let acc = out.row_mut(r);
            for (slot, &w) in route.weights.iter().enumerate() {
                let y = outputs[r][slot]
                    .as_ref()
                    .ok_or_else(|| ModelError::Experts(format!("layer {}: expert output missing", self.layer)))?;
                for (a, v) in acc.iter_mut().zip(y) {
                    *a += v * w;
                }
            }
        }
        if let Some(p) = &self.latent {
            out = p.up(out);
        }

        if let Some((y, g)) = shared_out.or_else(|| self.shared_forward(x)) {
            for r in 0..x.rows() {
                let scale = g.as_ref().map_or(1.0, |g| sigmoid(g.row(r)[0]));
                for (a, v) in out.row_mut(r).iter_mut().zip(y.row(r)) {
                    *a += scale * v;
                }
            }
        }
        Ok((out, routes))
    }

    /// The shared expert's output for rows `x` and its gate's logits, if
    /// the block has one.
    fn shared_forward(&self, x: &Mat) -> Option<(Mat, Option<Mat>)> {
        let shared = self.shared.as_ref()?;
        Some((shared.mlp.forward(x), shared.gate.as_ref().map(|g| g.forward(x))))
    }
}

/// The routing function `m.scoring` names (DeepSeek's selection-only
/// correction bias read under `router`, when it ships); a setting the
/// router refuses is an error naming layer `layer`.
fn routing(m: &MoeSpec, layer: usize, router: &WeightView<'_>) -> Result<Router, ModelError> {
    let bad = |e: RouterError| ModelError::Experts(format!("layer {layer}: {e}"));
    Ok(match &m.scoring {
        Scoring::Softmax => Router::Softmax(SoftmaxTopK::new(m.num_experts, m.top_k, m.renormalize).map_err(bad)?),
        Scoring::SigmoidGroups {
            n_group,
            topk_group,
            scaling,
        } => {
            let bias = router.optional_vector("e_score_correction_bias", m.num_experts)?;
            let groups = SigmoidGroupTopK::new(m.num_experts, m.top_k, *n_group, *topk_group, m.renormalize, *scaling, bias);
            Router::SigmoidGroup(groups.map_err(bad)?)
        }
        Scoring::TopKSoftmax => Router::TopKSoftmax(TopKSoftmax::new(m.num_experts, m.top_k).map_err(bad)?),
    })
}
