//! Tensor names built one module at a time, as candle-nn's `VarBuilder::pp`
//! builds them: [`TensorPath`] (a dotted module path, `model.layers.3.mlp`)
//! and [`WeightView`], a [`WeightSource`] scoped to one path, so a loader
//! asks `layer.pp("self_attn").linear("q_proj", rows, cols)` and never
//! formats a full tensor name. The source still receives the full name, so
//! its errors name the tensor (and its file) exactly as before.

use std::fmt::{self, Display, Write};
use std::path::PathBuf;

use larder_tensor::{Linear, WeightMatrix};

use super::{with_expert_tag, ExpertTag, RawTensor, WeightSource};
use crate::error::ModelError;

/// Where the decoder layers' tensors live (`model.layers.{l}`).
const DECODER_LAYERS: &str = "model.layers";

/// A dotted module path in a checkpoint (`model.layers.3.self_attn`); the
/// root is the empty path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct TensorPath(String);

impl TensorPath {
    /// The root: names under it are taken as they are.
    pub fn root() -> Self {
        TensorPath(String::new())
    }

    /// Decoder layer `layer`'s module, `model.layers.{layer}`.
    pub(crate) fn decoder_layer(layer: usize) -> Self {
        TensorPath::root().pp(DECODER_LAYERS).pp(layer)
    }

    /// The path one (or more, dotted) module(s) further down: `pp("mlp")`,
    /// `pp(3)`, `pp("experts.7")`.
    pub fn pp(&self, module: impl Display) -> TensorPath {
        let mut path = self.0.clone();
        if !path.is_empty() {
            path.push('.');
        }
        // Writing to a String cannot fail.
        let _ = write!(path, "{module}");
        TensorPath(path)
    }

    /// The full name of tensor (or module) `name` under this path.
    pub fn name(&self, name: &str) -> String {
        match self.0.is_empty() {
            true => name.to_string(),
            false => [self.0.as_str(), name].join("."),
        }
    }

    /// The path itself (empty at the root).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Display for TensorPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A [`WeightSource`] seen from one module path: every request names a
/// tensor relative to the path. Cheap to clone and to scope further.
#[derive(Clone)]
pub struct WeightView<'a> {
    source: &'a dyn WeightSource,
    path: TensorPath,
}

impl<'a> WeightView<'a> {
    /// `source` at the root (names as given).
    pub fn new(source: &'a dyn WeightSource) -> Self {
        WeightView {
            source,
            path: TensorPath::root(),
        }
    }

    /// `source` at `path`.
    pub fn at(source: &'a dyn WeightSource, path: TensorPath) -> Self {
        WeightView { source, path }
    }

    /// The view one (or more, dotted) module(s) further down.
    pub fn pp(&self, module: impl Display) -> WeightView<'a> {
        WeightView {
            source: self.source,
            path: self.path.pp(module),
        }
    }

    /// This view's module path.
    pub fn path(&self) -> &TensorPath {
        &self.path
    }

    /// The full name of tensor `name` under this view (for error messages).
    pub fn name(&self, name: &str) -> String {
        self.path.name(name)
    }

    /// The source itself.
    pub fn source(&self) -> &'a dyn WeightSource {
        self.source
    }

    /// A linear layer's `[rows, cols]` weight `name` in its shipped format.
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<WeightMatrix, ModelError> {
        self.source.matrix(&self.name(name), rows, cols)
    }

    /// A 2-D parameter that is not a linear layer's weight (embedding, router).
    pub(crate) fn param_matrix(&self, name: &str, rows: usize, cols: usize) -> Result<WeightMatrix, ModelError> {
        self.source.param_matrix(&self.name(name), rows, cols)
    }

    /// A 1-D tensor of length `len`, widened to f32 (norm weights, biases).
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        self.source.vector(&self.name(name), len)
    }

    /// An optional 1-D tensor: `None` when absent, an error when present but wrong.
    pub(crate) fn optional_vector(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>, ModelError> {
        self.source.optional_vector(&self.name(name), len)
    }

    /// A tensor stored in one of `shapes`, widened to f32, with the index of
    /// the shape it has.
    pub(crate) fn tensor_f32_any(&self, name: &str, shapes: &[&[usize]]) -> Result<(Vec<f32>, usize), ModelError> {
        self.source.tensor_f32_any(&self.name(name), shapes)
    }

    /// Whether tensor `name` ships.
    pub fn has(&self, name: &str) -> Result<bool, ModelError> {
        self.source.has(&self.name(name))
    }

    /// The stored shape of `name`, where the source knows it.
    pub fn stored_shape(&self, name: &str) -> Result<Option<Vec<usize>>, ModelError> {
        self.source.stored_shape(&self.name(name))
    }

    /// A whole tensor as shipped (the caller checks dtype and shape).
    pub fn raw_tensor(&self, name: &str, dtypes: &[&'static str], shape: &[usize]) -> Result<RawTensor, ModelError> {
        self.source.raw_tensor(&self.name(name), dtypes, shape)
    }

    /// Linear module `module` without a bias: `{module}.weight` `[rows, cols]`.
    pub fn linear(&self, module: &str, rows: usize, cols: usize) -> Result<Linear, ModelError> {
        self.biased_linear(module, rows, cols, false)
    }

    /// Linear module `module`: `{module}.weight` `[rows, cols]`, and
    /// `{module}.bias` `[rows]` when `has_bias`.
    pub(crate) fn biased_linear(&self, module: &str, rows: usize, cols: usize, has_bias: bool) -> Result<Linear, ModelError> {
        let m = self.pp(module);
        let weight = m.matrix("weight", rows, cols)?;
        let bias = match has_bias {
            true => Some(m.vector("bias", rows)?),
            false => None,
        };
        Ok(Linear::new(weight, bias))
    }

    /// Linear module `module` (no bias) that config field `field` switches
    /// on: loaded when `on`; when off, its presence is an error naming the
    /// field (the weight would be ignored).
    pub(crate) fn switched_linear(
        &self,
        module: &str,
        on: bool,
        rows: usize,
        cols: usize,
        field: &str,
    ) -> Result<Option<Linear>, ModelError> {
        if on {
            return self.linear(module, rows, cols).map(Some);
        }
        let weight = self.pp(module).name("weight");
        if self.source.has(&weight)? {
            return Err(ModelError::config(
                &self.config_path(),
                field,
                format!("is not true, but the checkpoint has the output gate `{weight}`: set it to true, or remove the tensor"),
            ));
        }
        Ok(None)
    }

    /// Runs `load` with the requests it makes tagged `tag` (routed-expert
    /// tensors; see [`WeightSource::tag_expert`]).
    pub fn with_expert_tag<T>(&self, tag: ExpertTag, load: impl FnOnce() -> T) -> T {
        with_expert_tag(self.source, tag, load)
    }

    /// Whether every answer is a zero-filled placeholder (a recorded load).
    pub(crate) fn zero_placeholders(&self) -> bool {
        self.source.zero_placeholders()
    }

    /// The config.json that errors about a config field point at.
    pub(crate) fn config_path(&self) -> PathBuf {
        self.source.config_path()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_join_with_dots_from_the_root() {
        assert_eq!(TensorPath::root().name("lm_head.weight"), "lm_head.weight");
        let attn = TensorPath::decoder_layer(3).pp("self_attn");
        assert_eq!(attn.as_str(), "model.layers.3.self_attn");
        assert_eq!(attn.name("q_proj.weight"), "model.layers.3.self_attn.q_proj.weight");
        assert_eq!(attn.pp("experts.7").to_string(), "model.layers.3.self_attn.experts.7");
    }
}
