//! A draft model: any checkpoint larder can run that shares the target's
//! vocabulary, kept in RAM with its own KV cache; or the **target itself**
//! in its cache-resident mode (every MoE layer uses only experts already in
//! RAM, router weights rescaled over them: drafting costs no expert I/O).
//! It drafts greedily; its cache follows the context (cut back to the common
//! prefix whenever the target rejected part of a guess).

use std::sync::Arc;

use larder_model::{DecoderModel, KvCache};
use larder_tensor::ops::argmax;

use crate::{Drafter, SpecError};

pub struct ModelDrafter {
    model: Arc<DecoderModel>,
    cache: KvCache,
    /// Tokens whose KV state is in `cache`.
    fed: Vec<u32>,
    /// Self-draft: the target in its cache-resident mode.
    resident_only: bool,
}

impl ModelDrafter {
    /// A drafter over `model`, which must have `target_vocab` tokens.
    pub fn new(model: Arc<DecoderModel>, target_vocab: usize) -> Result<Self, SpecError> {
        let vocab = model.spec().vocab_size;
        if vocab != target_vocab {
            return Err(SpecError::Invalid(format!(
                "the draft model has {vocab} tokens, the target {target_vocab}: they must share one vocabulary"
            )));
        }
        Ok(ModelDrafter {
            cache: model.new_cache(),
            model,
            fed: Vec::new(),
            resident_only: false,
        })
    }

    /// The cache-resident self-draft over the target `model` itself.
    pub fn self_draft(model: Arc<DecoderModel>) -> Self {
        ModelDrafter {
            cache: model.new_cache(),
            model,
            fed: Vec::new(),
            resident_only: true,
        }
    }

    fn step(&mut self, ids: &[u32]) -> Result<Vec<f32>, SpecError> {
        Ok(if self.resident_only {
            self.model.forward_last_resident(ids, &mut self.cache)?
        } else {
            self.model.forward_last(ids, &mut self.cache, None)?
        })
    }
}

impl Drafter for ModelDrafter {
    fn name(&self) -> &'static str {
        if self.resident_only {
            "self"
        } else {
            "model"
        }
    }

    fn propose(&mut self, context: &[u32], k: usize) -> Result<Vec<u32>, SpecError> {
        if k == 0 || context.is_empty() {
            return Ok(Vec::new());
        }
        let max = self.model.spec().max_position_embeddings;
        let k = k.min(max.saturating_sub(context.len()));
        if k == 0 {
            return Ok(Vec::new());
        }
        // Keep the common prefix (at least one token must run for logits).
        let common = self.fed.iter().zip(context).take_while(|(a, b)| a == b).count();
        let keep = common.min(context.len() - 1);
        self.cache.truncate(keep);
        self.fed.truncate(keep);
        let mut logits = self.step(&context[keep..])?;
        self.fed.extend_from_slice(&context[keep..]);
        let mut out = Vec::with_capacity(k);
        for i in 0..k {
            let t = argmax(&logits);
            out.push(t);
            if i + 1 < k {
                logits = self.step(&[t])?;
                self.fed.push(t);
            }
        }
        Ok(out)
    }
}
