//! Drafter choice for speculative decoding: the CLI and the server only name
//! a [`DrafterChoice`]; the engine resolves it once ([`Engine::drafting`]:
//! loading and checking a draft model) into a [`Drafting`] that hands each
//! request a fresh drafter.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use larder_model::{load_model, DecoderModel};
use larder_spec::{Drafter, ModelDrafter, NgramDrafter};

use crate::engine::Engine;
use crate::error::EngineError;
use crate::tokenizer::TextTokenizer;

/// Which drafter speculative decoding uses, as a user names it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum DrafterChoice {
    /// No speculative decoding.
    #[default]
    Off,
    /// Prompt lookup: n-grams of the context predict what follows.
    Ngram,
    /// The model itself using only experts already in the RAM cache.
    SelfDraft,
    /// A small checkpoint sharing the model's vocabulary.
    DraftModel { dir: PathBuf },
}

impl DrafterChoice {
    /// The choice a `--draft KIND [--draft-model DIR]` pair names: a draft
    /// model implies `model`; `model` without one is an error naming the flag.
    pub fn parse(kind: &str, draft_model: Option<&Path>) -> Result<Self, EngineError> {
        if let Some(dir) = draft_model {
            return Ok(DrafterChoice::DraftModel { dir: dir.to_path_buf() });
        }
        match kind {
            "off" => Ok(DrafterChoice::Off),
            "ngram" => Ok(DrafterChoice::Ngram),
            "self" => Ok(DrafterChoice::SelfDraft),
            "model" => Err(EngineError::Invalid {
                field: "draft",
                message: "--draft model needs --draft-model DIR".into(),
            }),
            other => Err(EngineError::Invalid {
                field: "draft",
                message: format!("`{other}` is not a drafter; use ngram, model, self or off"),
            }),
        }
    }
}

/// A resolved drafter choice: makes one fresh drafter per request.
#[derive(Clone, Default)]
pub struct Drafting(Resolved);

#[derive(Clone, Default)]
enum Resolved {
    #[default]
    Off,
    Ngram,
    SelfDraft(Arc<DecoderModel>),
    Model {
        model: Arc<DecoderModel>,
        vocab: usize,
    },
}

impl Drafting {
    /// No speculative decoding.
    pub fn off() -> Self {
        Drafting(Resolved::Off)
    }

    pub fn is_off(&self) -> bool {
        matches!(self.0, Resolved::Off)
    }

    /// The drafter's name (`ngram`, `self`, `model`), `None` when off.
    pub fn name(&self) -> Option<&'static str> {
        match self.0 {
            Resolved::Off => None,
            Resolved::Ngram => Some("ngram"),
            Resolved::SelfDraft(_) => Some("self"),
            Resolved::Model { .. } => Some("model"),
        }
    }

    /// A fresh drafter for one request (`None` when drafting is off).
    pub fn drafter(&self) -> Result<Option<Box<dyn Drafter>>, EngineError> {
        Ok(match &self.0 {
            Resolved::Off => None,
            Resolved::Ngram => Some(Box::new(NgramDrafter::default())),
            Resolved::SelfDraft(m) => Some(Box::new(ModelDrafter::self_draft(m.clone()))),
            Resolved::Model { model, vocab } => {
                let d = ModelDrafter::new(model.clone(), *vocab).map_err(|e| EngineError::Invalid {
                    field: "draft",
                    message: e.to_string(),
                })?;
                Some(Box::new(d))
            }
        })
    }
}

impl Engine {
    /// Resolves `choice`: a draft model is loaded and checked to share this
    /// model's vocabulary (tokenizer and size) once, here.
    pub fn drafting(&self, choice: &DrafterChoice) -> Result<Drafting, EngineError> {
        Ok(Drafting(match choice {
            DrafterChoice::Off => Resolved::Off,
            DrafterChoice::Ngram => Resolved::Ngram,
            DrafterChoice::SelfDraft => Resolved::SelfDraft(self.shared_model()),
            DrafterChoice::DraftModel { dir } => {
                let bad = |message: String| EngineError::Draft { dir: dir.clone(), message };
                let model = load_model(dir, None).map_err(|e| bad(format!("cannot load it: {e}")))?;
                self.check_same_vocabulary(dir)?;
                let vocab = self.model().spec().vocab_size;
                let model = Arc::new(model);
                // Checked here (not per request): a vocabulary of another size is refused at once.
                ModelDrafter::new(model.clone(), vocab).map_err(|e| bad(e.to_string()))?;
                Resolved::Model { model, vocab }
            }
        }))
    }

    /// A draft model must tokenize like the target: the same vocabulary when
    /// both have a tokenizer (tokenizer.json or tiktoken.model, either form).
    fn check_same_vocabulary(&self, dir: &Path) -> Result<(), EngineError> {
        if let (Ok(target), Some(draft)) = (self.tokenizer(), TextTokenizer::from_dir(dir)?) {
            if draft.vocab() != target.vocab() {
                return Err(EngineError::Draft {
                    dir: dir.to_path_buf(),
                    message: "its tokenizer's vocabulary differs from the model's; a draft model must share the \
                              vocabulary"
                        .into(),
                });
            }
        }
        Ok(())
    }
}
