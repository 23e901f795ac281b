//! The decoder-only transformer every supported architecture is an instance
//! of: embeddings, `num_layers` x (RMSNorm, token mixer (GQA, MLA or KDA, per
//! layer), residual, RMSNorm, dense MLP or MoE, residual), final RMSNorm, LM
//! head; with block attention residuals (`attn_residual.rs`) the mixer,
//! MLP and final-norm inputs are attentions over the per-position block
//! states.
//!
//! Architectures differ only in their [`ModelSpec`] (and tensor names); this
//! file loads the spine (embeddings, final norm, LM head), stacks the layers
//! [`crate::layer`] loads, and runs all of them.
//!
//! Every pass checks the residual stream after the embeddings and after each
//! layer, and the logits, for NaN and infinities: the first place they appear
//! is an error ([`ModelError::NonFinite`]) instead of a silently wrong token.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use larder_router::Route;
use larder_tensor::ops::rms_norm;
use larder_tensor::{Linear, Mat, WeightMatrix};

use crate::attention::MixerRows;
use crate::attn_residual::DepthAttention;
use crate::error::{ModelError, Stage};
use crate::expert::{ExpertProvider, InMemoryExperts};
use crate::layer::{DecoderLayer, Ffn};
use crate::rope::Rope;
use crate::source::{WeightSource, WeightView};
use crate::spec::ModelSpec;
use crate::state::SequenceState;

/// Routes taken by every MoE layer during forward passes, per layer in
/// position order (for tests, traces and predictors).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RouteTrace {
    pub layers: BTreeMap<usize, Vec<Route>>,
    /// How many MoE layers ahead to record router lookahead for (0: none).
    /// Depth 1 is what prefetch predicts.
    pub lookahead: usize,
    /// `(target MoE layer, depth)` -> per row, the experts the target's
    /// router picks on the FFN input of the MoE layer `depth` MoE layers
    /// before it (filled only up to [`lookahead`](Self::lookahead)).
    pub predicted: BTreeMap<(usize, usize), Vec<Vec<usize>>>,
    /// Rows of each forward pass, in order (a decode step is one row per
    /// sequence; a prefill pass many).
    pub passes: Vec<usize>,
}

impl RouteTrace {
    /// A trace that also records router lookahead up to `depth` MoE layers.
    pub fn with_lookahead(depth: usize) -> RouteTrace {
        RouteTrace {
            lookahead: depth,
            ..RouteTrace::default()
        }
    }

    /// Mean over layers and consecutive positions of the share of a
    /// position's experts that the previous position also chose (uniform,
    /// independent routing gives about top_k / num_experts); with each
    /// layer's own mean.
    pub fn consecutive_overlap(&self) -> (f64, Vec<(usize, f64)>) {
        let mut per_layer = Vec::new();
        for (&l, routes) in &self.layers {
            let shares: Vec<f64> = routes
                .windows(2)
                .filter(|w| !w[1].experts.is_empty())
                .map(|w| w[1].experts.iter().filter(|e| w[0].experts.contains(e)).count() as f64 / w[1].experts.len() as f64)
                .collect();
            if !shares.is_empty() {
                per_layer.push((l, shares.iter().sum::<f64>() / shares.len() as f64));
            }
        }
        let mean = if per_layer.is_empty() {
            0.0
        } else {
            per_layer.iter().map(|(_, v)| v).sum::<f64>() / per_layer.len() as f64
        };
        (mean, per_layer)
    }
}

/// A loaded model.
pub struct DecoderModel {
    spec: ModelSpec,
    embed: WeightMatrix,
    layers: Vec<DecoderLayer>,
    norm: Vec<f32>,
    /// `model.final_input` (block attention residuals), before `norm`.
    final_input: Option<DepthAttention>,
    lm_head: Linear,
    rope: Rope,
    experts: Arc<dyn ExpertProvider>,
}

impl DecoderModel {
    /// Loads the spine and, with `experts = None`, every routed expert into
    /// RAM, asking `weights` for every tensor (a [`Checkpoint`](crate::checkpoint::Checkpoint),
    /// or a [`Recorder`](crate::Recorder) that learns what is asked).
    pub fn load(spec: ModelSpec, weights: &dyn WeightSource, experts: Option<Arc<dyn ExpertProvider>>) -> Result<Self, ModelError> {
        let (prefix, wrapped) = (spec.config_prefix, spec.wrapped_text_model);
        Self::load_unscoped(spec, weights, experts).map_err(|e| {
            let e = e.scoped(prefix);
            match wrapped {
                true => e.named_as_wrapped(),
                false => e,
            }
        })
    }

    fn load_unscoped(spec: ModelSpec, weights: &dyn WeightSource, experts: Option<Arc<dyn ExpertProvider>>) -> Result<Self, ModelError> {
        weights.configure(&spec);
        let (root, h) = (WeightView::new(weights), spec.hidden_size);
        let embed = root.param_matrix("model.embed_tokens.weight", spec.vocab_size, h)?;
        let lm_head = match spec.tie_word_embeddings && !root.has("lm_head.weight")? {
            true => Linear::new(embed.clone(), None),
            false => root.linear("lm_head", spec.vocab_size, h)?,
        };
        let norm = root.vector("model.norm.weight", h)?;
        let mut layers = Vec::with_capacity(spec.layers.len());
        let mut in_memory = Vec::with_capacity(spec.layers.len());
        for (l, layer_spec) in spec.layers.iter().enumerate() {
            let (layer, layer_experts) = DecoderLayer::load(&spec, l, layer_spec, weights, experts.is_none())?;
            layers.push(layer);
            in_memory.push(layer_experts);
        }
        let experts = experts.unwrap_or_else(|| Arc::new(InMemoryExperts::new(in_memory)));
        let final_input = match spec.attn_res_block {
            None => None,
            Some(_) => Some(DepthAttention::load(&root.pp("model"), "output_attn", h, spec.rms_norm_eps)?),
        };
        Ok(DecoderModel {
            rope: Rope::new(&spec.rope, spec.head_dim),
            spec,
            embed,
            layers,
            norm,
            final_input,
            lm_head,
            experts,
        })
    }

    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// KV-cache bytes each further position of a sequence adds, over all
    /// layers (MLA layers as [`ModelSpec::mla_cache`] says; recurrent layers
    /// add none): [`ModelSpec::kv_bytes_per_token`] of this model's spec.
    pub fn kv_bytes_per_token(&self) -> usize {
        self.layers.iter().map(|l| l.mixer.new_state().bytes_per_position()).sum()
    }

    /// A fresh, empty state for one sequence of this model: per layer, its
    /// mixer's state (keys and values for GQA and MLA, a zero recurrent
    /// state for KDA).
    pub fn new_state(&self) -> SequenceState {
        SequenceState::new(self.layers.iter().map(|l| l.mixer.new_state()).collect())
    }

    /// Whether `state` has this model's layers and widths (made by
    /// [`new_state`](Self::new_state) of this model or one of its shape).
    pub fn fits(&self, state: &SequenceState) -> bool {
        state.num_layers() == self.layers.len()
            && self
                .layers
                .iter()
                .enumerate()
                .all(|(l, layer)| state.layer(l).is_some_and(|s| layer.mixer.fits(s)))
    }

    /// Checks ids against the vocabulary and the context length.
    pub fn check_ids(&self, ids: &[u32], cached: usize) -> Result<(), ModelError> {
        if ids.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.spec.vocab_size) {
            return Err(ModelError::TokenOutOfVocab {
                id,
                vocab: self.spec.vocab_size,
            });
        }
        let len = cached + ids.len();
        if len > self.spec.max_position_embeddings {
            return Err(ModelError::ContextOverflow {
                len,
                max: self.spec.max_position_embeddings,
            });
        }
        Ok(())
    }

    /// Runs `ids` as the positions after those already in `state`, appending
    /// to it, and returns the logits of every row `[ids.len(), vocab]`.
    pub fn forward(&self, ids: &[u32], state: &mut SequenceState, trace: Option<&mut RouteTrace>) -> Result<Mat, ModelError> {
        self.forward_one(ids, state, Wanted::All, trace, false)
    }

    /// Like [`forward`](Self::forward) but returns only the last row's logits.
    pub fn forward_last(&self, ids: &[u32], state: &mut SequenceState, trace: Option<&mut RouteTrace>) -> Result<Vec<f32>, ModelError> {
        self.forward_one(ids, state, Wanted::Last, trace, false).map(Mat::into_vec)
    }

    /// Last-row logits of a cheap approximate pass in which every MoE layer
    /// uses only experts already in RAM (see `MoeBlock::forward_with`):
    /// what a cache-resident self-draft guesses with. Never the model's answer.
    pub fn forward_last_resident(&self, ids: &[u32], state: &mut SequenceState) -> Result<Vec<f32>, ModelError> {
        self.forward_one(ids, state, Wanted::Last, None, true).map(Mat::into_vec)
    }

    /// One sequence through [`run_batch`](Self::run_batch); its errors as
    /// they are (not wrapped in [`ModelError::Sequence`]).
    fn forward_one(
        &self,
        ids: &[u32],
        state: &mut SequenceState,
        logits: Wanted,
        trace: Option<&mut RouteTrace>,
        resident_only: bool,
    ) -> Result<Mat, ModelError> {
        let mut seqs = [BatchSeq { ids, state, logits }];
        let out = self.run_batch(&mut seqs, trace, resident_only).map_err(|(_, e)| e)?;
        out.into_iter().next().ok_or(ModelError::EmptyInput)
    }

    /// Runs several sequences together, each its `ids` as the positions after
    /// those already in its state, and returns each one's wanted logits
    /// (`[1, vocab]` for [`Wanted::Last`], `[ids.len(), vocab]` for
    /// [`Wanted::All`]), in `seqs` order.
    ///
    /// Per layer, attention runs per sequence over its own rows and state;
    /// then the rows of all sequences go through one MoE step (one router
    /// pass, one request for the union of their experts), so a streamed
    /// expert is read once per layer for every sequence that chose it. Each
    /// sequence's logits are bit-identical to running it alone (batch
    /// invariance, docs/design.md §3). `trace` gets every MoE layer's routes
    /// in batch row order (sequence 0's rows, then sequence 1's, ...).
    ///
    /// Errors name the sequence at fault ([`ModelError::Sequence`]) when one
    /// is (bad ids, context overflow, non-finite values in its rows, a state
    /// of another model); on any error every state is left as it was.
    pub fn forward_batch(&self, seqs: &mut [BatchSeq<'_>], trace: Option<&mut RouteTrace>) -> Result<Vec<Mat>, ModelError> {
        self.run_batch(seqs, trace, false).map_err(|(i, e)| match i {
            Some(index) => ModelError::Sequence {
                index,
                source: Box::new(e),
            },
            None => e,
        })
    }

    /// [`forward_batch`](Self::forward_batch), errors paired with the index
    /// of the sequence at fault (if one is); states unchanged on error.
    fn run_batch(&self, seqs: &mut [BatchSeq<'_>], trace: Option<&mut RouteTrace>, resident_only: bool) -> Result<Vec<Mat>, BatchError> {
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        for (i, s) in seqs.iter().enumerate() {
            if !self.fits(s.state) {
                let msg = "its state was made by another model (layers or widths differ); make it with new_state()";
                return Err((Some(i), ModelError::State(msg.into())));
            }
            self.check_ids(s.ids, s.state.len()).map_err(|e| (Some(i), e))?;
        }
        let result = self.run_checked(seqs, trace, resident_only);
        for s in seqs.iter_mut() {
            match &result {
                Ok(_) => {
                    let len = s.state.len() + s.ids.len();
                    s.state.commit(len);
                }
                Err(_) => s.state.discard_uncommitted(),
            }
        }
        result
    }

    /// The pass itself, inputs checked. Appends to the layer states (recurrent
    /// layers uncommitted) but leaves each state's length and commit to the
    /// caller.
    fn run_checked(
        &self,
        seqs: &mut [BatchSeq<'_>],
        mut trace: Option<&mut RouteTrace>,
        resident_only: bool,
    ) -> Result<Vec<Mat>, BatchError> {
        let mut spans = Vec::with_capacity(seqs.len());
        let mut row = 0;
        for s in seqs.iter() {
            spans.push(Span {
                row,
                rows: s.ids.len(),
                pos: s.state.len(),
            });
            row += s.ids.len();
        }
        if let Some(t) = trace.as_deref_mut() {
            t.passes.push(row);
        }
        let (h, eps) = (self.spec.hidden_size, self.spec.rms_norm_eps);
        let mut x = Mat::zeros(row, h);
        for (r, &id) in seqs.iter().flat_map(|s| s.ids).enumerate() {
            self.embed.decode_row(id as usize, x.row_mut(r));
        }
        check_spans(&x, &spans, Stage::Embeddings)?;
        // Block states of every row (attention-residual models; docs/kimi_linear.md).
        let mut blocks: Vec<Mat> = Vec::new();
        // A prefill step reads exactly the experts its rows route to: a guess
        // at the next layer's union would be most of the layer, more than its
        // share of the cache holds, and read twice (docs/design.md §3).
        let prefilling = seqs.iter().any(|s| s.logits == Wanted::Last && s.ids.len() > 1);
        for (l, layer) in self.layers.iter().enumerate() {
            let mixer_in = layer.attn_res.as_ref().and_then(|a| a.mixer_input(&blocks, &x));
            let normed = rms_norm(mixer_in.as_ref().unwrap_or(&x), &layer.input_norm, eps);
            // Every sequence's rows through the mixer at once (GQA projects
            // them in one matrix product; each row as alone).
            let mut parts = Vec::with_capacity(seqs.len());
            for (i, (s, sp)) in seqs.iter_mut().zip(&spans).enumerate() {
                let state = s
                    .state
                    .layer_mut(l)
                    .ok_or_else(|| (Some(i), ModelError::State(format!("it has no state for layer {l}"))))?;
                parts.push(MixerRows {
                    rows: sp.row..sp.row + sp.rows,
                    start: sp.pos,
                    state,
                });
            }
            let attn = layer
                .mixer
                .forward_rows(&normed, &mut parts, &self.rope)
                .map_err(|(i, e)| (Some(i), e))?;
            drop(parts);
            let mlp_in = match &layer.attn_res {
                None => {
                    x.add_assign(&attn);
                    None
                }
                Some(a) => Some(a.after_mixer(&mut blocks, &mut x, attn)),
            };
            let normed = rms_norm(mlp_in.as_ref().unwrap_or(&x), &layer.post_attention_norm, eps);
            let y = match &layer.ffn {
                Ffn::Dense(mlp) => mlp.forward(&normed),
                Ffn::Moe(moe) => {
                    if !resident_only && !prefilling {
                        self.prefetch_next(l, &normed);
                    }
                    let (y, routes) = moe
                        .forward_with(&normed, self.experts.as_ref(), resident_only)
                        .map_err(|e| (None, e))?;
                    if let Some(t) = trace.as_deref_mut() {
                        t.layers.entry(l).or_default().extend(routes);
                        self.record_lookahead(l, &normed, t);
                    }
                    y
                }
            };
            x.add_assign(&y);
            check_spans(&x, &spans, Stage::Layer(l))?;
        }
        if let Some(f) = &self.final_input {
            x = f.forward(&blocks, &x);
        }
        self.head(&x, seqs, &spans)
    }

    /// Final norm and LM head for the rows each sequence wants.
    fn head(&self, x: &Mat, seqs: &[BatchSeq<'_>], spans: &[Span]) -> Result<Vec<Mat>, BatchError> {
        let mut rows = Vec::new();
        let mut wanted = Vec::with_capacity(spans.len());
        for (s, sp) in seqs.iter().zip(spans) {
            let w = match s.logits {
                Wanted::Last => Span {
                    row: rows.len(),
                    rows: 1,
                    pos: sp.pos + sp.rows - 1,
                },
                Wanted::All => Span {
                    row: rows.len(),
                    rows: sp.rows,
                    pos: sp.pos,
                },
            };
            let first = sp.row + sp.rows - w.rows;
            rows.extend(first..sp.row + sp.rows);
            wanted.push(w);
        }
        let out = rms_norm(&x.gather_rows(&rows), &self.norm, self.spec.rms_norm_eps);
        check_spans(&out, &wanted, Stage::FinalNorm)?;
        let logits = self.lm_head.forward(&out);
        check_spans(&logits, &wanted, Stage::LmHead)?;
        Ok(wanted.iter().map(|w| w.slice(&logits)).collect())
    }
}

/// Which logits a sequence of a batch wants back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    /// The last row's only (decoding, or the end of a prefill).
    Last,
    /// Every row's (scoring, speculative verification).
    All,
}

/// One sequence of a [`DecoderModel::forward_batch`]: its new token ids, its
/// state (the ids sit at positions `state.len()..`), and the logits it wants.
pub struct BatchSeq<'a> {
    pub ids: &'a [u32],
    pub state: &'a mut SequenceState,
    pub logits: Wanted,
}

impl<'a> BatchSeq<'a> {
    pub fn new(ids: &'a [u32], state: &'a mut SequenceState, logits: Wanted) -> Self {
        BatchSeq { ids, state, logits }
    }
}

/// An error, with the index of the sequence at fault when there is one.
type BatchError = (Option<usize>, ModelError);

/// One sequence's rows in a batch matrix: `rows` rows from `row`, the first
/// at position `pos`.
struct Span {
    row: usize,
    rows: usize,
    pos: usize,
}

impl Span {
    /// A copy of the span's rows of `m`.
    fn slice(&self, m: &Mat) -> Mat {
        let c = m.cols();
        Mat::from_vec(self.rows, c, m.as_slice()[self.row * c..(self.row + self.rows) * c].to_vec())
    }
}

/// [`check_finite`] of every sequence's rows of `m`, naming the sequence.
fn check_spans(m: &Mat, spans: &[Span], stage: Stage) -> Result<(), BatchError> {
    for (i, sp) in spans.iter().enumerate() {
        check_finite(m, sp.row..sp.row + sp.rows, sp.pos, stage).map_err(|e| (Some(i), e))?;
    }
    Ok(())
}

/// An error naming `stage` and the position of the first of `m`'s `rows`
/// holding a NaN or an infinity (row `rows.start` is position
/// `first_position`). One pass over the values: negligible next to the matrix
/// products that made them.
fn check_finite(m: &Mat, rows: Range<usize>, first_position: usize, stage: Stage) -> Result<(), ModelError> {
    let start = rows.start;
    match rows.into_iter().find(|&r| !m.row(r).iter().all(|v| v.is_finite())) {
        None => Ok(()),
        Some(r) => Err(ModelError::NonFinite {
            stage,
            position: first_position + r - start,
        }),
    }
}

impl DecoderModel {
    /// Predicts the experts of the next MoE layer by applying its router to
    /// this layer's MoE input (the residual stream changes little from one
    /// layer to the next) and hints them to the provider, so their reads
    /// overlap this layer's work. Only timing depends on the guess.
    /// Traces only: the routes the next `trace.lookahead` MoE layers'
    /// routers pick on layer `l`'s FFN input (recall by lookahead depth).
    fn record_lookahead(&self, l: usize, normed: &Mat, trace: &mut RouteTrace) {
        let ahead = self
            .layers
            .iter()
            .enumerate()
            .skip(l + 1)
            .filter_map(|(i, layer)| match &layer.ffn {
                Ffn::Moe(m) => Some((i, m)),
                Ffn::Dense(_) => None,
            });
        for (depth, (target, moe)) in ahead.take(trace.lookahead).enumerate() {
            let picks = moe.route(normed).into_iter().map(|r| r.experts);
            trace.predicted.entry((target, depth + 1)).or_default().extend(picks);
        }
    }

    fn prefetch_next(&self, l: usize, normed: &Mat) {
        if !self.experts.wants_prefetch() {
            return;
        }
        let next = self.layers[l + 1..].iter().enumerate().find_map(|(i, layer)| match &layer.ffn {
            Ffn::Moe(m) => Some((l + 1 + i, m)),
            Ffn::Dense(_) => None,
        });
        if let Some((nl, moe)) = next {
            let mut ids: Vec<usize> = moe.route(normed).into_iter().flat_map(|r| r.experts).collect();
            ids.sort_unstable();
            ids.dedup();
            self.experts.prefetch(nl, &ids);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_finite_names_the_stage_and_the_first_bad_position() {
        let mut m = Mat::zeros(4, 8);
        assert!(check_finite(&m, 0..4, 10, Stage::Layer(3)).is_ok());
        m.row_mut(3)[0] = f32::NAN;
        m.row_mut(2)[7] = f32::INFINITY;
        let e = check_finite(&m, 0..4, 10, Stage::Layer(3)).unwrap_err();
        assert!(
            matches!(
                e,
                ModelError::NonFinite {
                    stage: Stage::Layer(3),
                    position: 12
                }
            ),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(msg.contains("layer 3 (model.layers.3)") && msg.contains("position 12"), "{msg}");
        m.row_mut(2)[7] = f32::NEG_INFINITY;
        let msg = check_finite(&m, 0..4, 0, Stage::LmHead).unwrap_err().to_string();
        assert!(msg.contains("lm_head") && msg.contains("position 2"), "{msg}");
    }
}
