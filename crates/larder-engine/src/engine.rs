//! [`Engine`]: a loaded checkpoint (model, tokenizer, chat format,
//! generation config), what to generate ([`GenerateOptions`]) and what a
//! generation gives ([`Generation`]). Generating goes through the
//! [`Scheduler`](crate::Scheduler), the one generation path: on the
//! caller's thread ([`Engine::run`], [`Engine::generate`], `generate`
//! module) or on the engine thread of an [`EngineHandle`](crate::EngineHandle).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use larder_model::arch::read_spec;
use larder_model::checkpoint::Checkpoint;
use larder_model::{load_model, DecoderModel, ExpertProvider};
use larder_store::{ExpertStore, Manifest, StoreOptions};
use larder_tensor::Mat;
use serde::Serialize;

use crate::chat::{ChatFormat, ChatMessage, RenderOptions};
use crate::error::store_err;
use crate::error::EngineError;
use crate::experts::{direct_index, StoreExperts};
use crate::generation::GenerationConfig;
use crate::integrity::packed_index;
use crate::prefill::PrefillChunk;
use crate::sampling::SamplingParams;
use crate::stats::Stats;

mod chat_output;
mod generate;
use crate::tokenizer::TextTokenizer;
pub use chat_output::OutputReader;

/// Rows per pass of the fixed chunking larder used before read-once
/// prefill ([`PrefillChunk::Rows`]), kept for comparisons.
pub const PREFILL_CHUNK: usize = 256;

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An EOS token was produced.
    Stop,
    /// `max_new` tokens, or the model's context length, was reached.
    Length,
    /// The caller's callback asked to stop.
    Cancelled,
}

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_new: usize,
    pub sampling: SamplingParams,
    /// Stop at the generation config's EOS ids (default true).
    pub stop_at_eos: bool,
    /// Most tokens a drafter may propose per verification pass (speculative decoding).
    pub draft_max: usize,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_new: 128,
            sampling: SamplingParams::default(),
            stop_at_eos: true,
            draft_max: 8,
        }
    }
}

/// The result of one generation.
#[derive(Debug, Clone, Serialize)]
pub struct Generation {
    /// New token ids only (an EOS that ended generation is included).
    pub ids: Vec<u32>,
    pub finish_reason: FinishReason,
    pub stats: Stats,
}

/// Where routed experts live while the engine runs.
#[derive(Debug, Clone, Copy, Default)]
pub enum ExpertMode {
    /// Every expert in RAM (a checkpoint's files are memory-mapped). A packed
    /// store is then streamed with a cache large enough for all of it.
    #[default]
    InRam,
    /// Streamed through the expert store: from the checkpoint's own
    /// safetensors (direct) or from a packed store.
    Stream(StoreOptions),
}

/// How to load a model.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    pub experts: ExpertMode,
    /// What MLA layers cache per position (default: the compact latent).
    pub mla_cache: larder_model::MlaCache,
}

/// A loaded checkpoint ready to generate.
pub struct Engine {
    dir: PathBuf,
    model: Arc<DecoderModel>,
    /// The expert store, when experts are streamed.
    store: Option<Arc<ExpertStore>>,
    tokenizer: Option<TextTokenizer>,
    /// The chat format (a template, or Kimi K3's encoder), or why it cannot
    /// be used: a broken template is reported when a chat is rendered, not
    /// at load (plain prompts need none).
    chat: Result<Option<ChatFormat>, String>,
    generation: GenerationConfig,
    /// How prompts are split into forward passes.
    prefill: PrefillChunk,
    /// `--ram-budget auto`: resizes the expert cache under memory pressure.
    memory_watch: Option<crate::memory_watch::MemoryWatch>,
    /// Structured output's grammar engine over the tokenizer, built on
    /// first use (about a second for a 150k vocabulary), or why it cannot be.
    grammar: std::sync::OnceLock<Result<crate::GrammarEngine, String>>,
    /// A lazy cache's backend and folder lock, held while the engine lives.
    #[cfg(feature = "remote")]
    pub(crate) lazy: Option<(Arc<larder_store::lazy::LazyBackend>, larder_store::fsutil::FileLock)>,
}

/// A packed store keeps the heat of every run (`heat.json`), so a later run
/// can warm its cache ([`Engine::warm`]); a store it cannot write to is left
/// as it is (heat decides nothing the model computes).
impl Drop for Engine {
    fn drop(&mut self) {
        #[cfg(feature = "remote")]
        if self.lazy.is_some() {
            return; // a lazy cache keeps its own heat (larder_store::lazy)
        }
        if let Some(store) = &self.store {
            if Manifest::is_store(&self.dir) {
                let _ = larder_store::heat::save(&self.dir, &store.heat(), &store.read_heat());
            }
        }
    }
}

impl Engine {
    /// Loads a checkpoint folder (every expert in RAM) or a packed store.
    pub fn load(dir: &Path) -> Result<Self, EngineError> {
        Self::load_with(dir, &LoadOptions::default())
    }

    /// Loads a checkpoint folder or a packed store.
    pub fn load_with(dir: &Path, opts: &LoadOptions) -> Result<Self, EngineError> {
        Self::load_inner(dir, opts, None)
    }

    /// Loads like [`load_with`](Self::load_with), calling `progress(done,
    /// total)` as weight bytes are read (the spine when experts stream;
    /// every weight when they stay in RAM). The total is exact: counted first
    /// by building the model over the files' headers alone (no bytes read).
    pub fn load_with_progress(dir: &Path, opts: &LoadOptions, progress: Arc<LoadProgress>) -> Result<Self, EngineError> {
        Self::load_inner(dir, opts, Some(progress))
    }

    fn load_inner(dir: &Path, opts: &LoadOptions, progress: Option<Arc<LoadProgress>>) -> Result<Self, EngineError> {
        check_dir(dir)?;
        #[cfg(feature = "remote")]
        if larder_store::lazy::is_lazy(dir) {
            return Err(EngineError::File {
                path: dir.to_path_buf(),
                message: "a lazy cache: run it with `--model SOURCE --cache-dir DIR` (the source it was made from)".into(),
            });
        }
        if let Some(message) = crate::store_folder::unfinished_store(dir) {
            return Err(EngineError::File {
                path: dir.to_path_buf(),
                message,
            });
        }
        let packed = Manifest::is_store(dir);
        let stream = match (opts.experts, packed) {
            (ExpertMode::InRam, false) => {
                let mut spec = read_spec(dir)?;
                spec.mla_cache = opts.mla_cache;
                let mut ckpt = Checkpoint::open(dir)?;
                report_reads(&mut ckpt, dir, &spec, None, progress);
                let model = DecoderModel::load(spec, &ckpt, None)?;
                return Self::assemble(dir, model, None);
            }
            (ExpertMode::InRam, true) => StoreOptions {
                ram_budget: u64::MAX,
                ..StoreOptions::default()
            },
            (ExpertMode::Stream(o), _) => o,
        };
        let mut spec = read_spec(dir)?;
        spec.mla_cache = opts.mla_cache;
        let (mut ckpt, index) = if packed {
            // Carried files, spine header and every spine tensor are checked against the manifest.
            let (manifest, index) = packed_index(dir)?;
            (crate::integrity::open_spine(dir, &manifest)?, index)
        } else {
            let ckpt = Checkpoint::open(dir)?;
            let index = direct_index(&spec, &ckpt)?;
            (ckpt, index)
        };
        let store = Arc::new(ExpertStore::open(index, stream).map_err(store_err)?);
        let provider: Arc<dyn ExpertProvider> = Arc::new(StoreExperts::new(store.clone(), &spec)?);
        report_reads(&mut ckpt, dir, &spec, Some(provider.clone()), progress);
        let model = DecoderModel::load(spec, &ckpt, Some(provider))?;
        Self::assemble(dir, model, Some(store))
    }

    /// Loads a checkpoint folder, taking routed experts from `experts` when given.
    pub fn load_with_experts(dir: &Path, experts: Option<Arc<dyn ExpertProvider>>) -> Result<Self, EngineError> {
        check_dir(dir)?;
        let model = load_model(dir, experts)?;
        Self::assemble(dir, model, None)
    }

    pub(crate) fn assemble(dir: &Path, model: DecoderModel, store: Option<Arc<ExpertStore>>) -> Result<Self, EngineError> {
        let tokenizer = TextTokenizer::from_dir(dir)?;
        let chat = ChatFormat::from_dir(dir).map_err(|e| e.to_string());
        let mut generation = GenerationConfig::from_dir(dir)?;
        // Kimi K3 ends every message with <|end_of_msg|> (its config's
        // eos_token_id); a chat must stop there whatever the config files say.
        if let (Ok(Some(ChatFormat::KimiK3)), Some(t)) = (&chat, &tokenizer) {
            if let Some(id) = t.token_to_id(crate::kimi_k3_chat::END_OF_MSG) {
                if !generation.eos_token_ids.contains(&id) {
                    generation.eos_token_ids.push(id);
                }
            }
        }
        Ok(Engine {
            dir: dir.to_path_buf(),
            model: Arc::new(model),
            store,
            tokenizer,
            chat,
            grammar: std::sync::OnceLock::new(),
            generation,
            prefill: PrefillChunk::default(),
            memory_watch: None,
            #[cfg(feature = "remote")]
            lazy: None,
        })
    }

    /// Reads the hottest experts of a packed store's saved heat
    /// (`heat.json`, [`larder_store::heat`]) into the cache, up to its budget.
    /// Returns the experts and bytes read (none without a store or heat).
    pub fn warm(&self) -> Result<(usize, u64), EngineError> {
        match &self.store {
            Some(store) if Manifest::is_store(&self.dir) => {
                let warmed = store.warm(&larder_store::heat::load(&self.dir), u64::MAX);
                warmed.map_err(|e| EngineError::Model(larder_model::ModelError::Provider(Box::new(e))))
            }
            _ => Ok((0, 0)),
        }
    }

    /// Resizes the expert cache under memory pressure for as long as the
    /// engine lives ([`crate::memory_watch`]); nothing when experts are in RAM.
    pub(crate) fn watch_memory(&mut self, config: crate::memory_watch::WatchConfig) {
        if let Some(store) = &self.store {
            self.memory_watch = Some(crate::memory_watch::MemoryWatch::start(store, config));
        }
    }

    /// The folder the engine was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn model(&self) -> &DecoderModel {
        &self.model
    }

    /// The model, shared (a self-drafter runs it too).
    pub fn shared_model(&self) -> Arc<DecoderModel> {
        self.model.clone()
    }

    /// The expert store, when experts are streamed.
    pub fn store(&self) -> Option<&Arc<ExpertStore>> {
        self.store.as_ref()
    }

    /// Problems that failed no request since the last call, for the caller
    /// to print, each said once while it repeats: a lazy cache's experts
    /// fetched but not kept (a full drive, say), a damaged mirror copy read
    /// from its primary instead.
    pub fn take_warnings(&self) -> Vec<String> {
        #[cfg(feature = "remote")]
        let mut w = self.take_lazy_problems();
        #[cfg(not(feature = "remote"))]
        let mut w = Vec::new();
        if let Some(store) = self.store() {
            w.extend(store.take_warnings());
        }
        w
    }

    /// Sets how prompts are split into forward passes (default: read-once,
    /// [`PrefillChunk::Auto`]). Results never depend on it.
    pub fn set_prefill(&mut self, prefill: PrefillChunk) {
        self.prefill = prefill;
    }

    /// Most prompt rows one forward pass takes (see [`crate::prefill`]).
    pub fn prefill_rows(&self) -> usize {
        self.prefill.rows(self.model.spec())
    }

    pub fn generation_config(&self) -> &GenerationConfig {
        &self.generation
    }

    /// The tokenizer, or an error saying the checkpoint has none.
    /// The grammar engine structured output compiles with (over this
    /// model's tokenizer, its EOS ids and vocabulary), built once.
    pub fn grammar(&self) -> Result<&crate::GrammarEngine, EngineError> {
        let built = self.grammar.get_or_init(|| {
            let tokenizer = self.tokenizer().map_err(|e| e.to_string())?;
            crate::GrammarEngine::new(tokenizer, &self.generation.eos_token_ids, self.model.spec().vocab_size).map_err(|e| e.to_string())
        });
        built.as_ref().map_err(|message| EngineError::Invalid {
            field: "response_format",
            message: format!("structured output needs the model's tokenizer: {message}"),
        })
    }

    pub fn tokenizer(&self) -> Result<&TextTokenizer, EngineError> {
        self.tokenizer
            .as_ref()
            .ok_or_else(|| EngineError::NoTokenizer { dir: self.dir.clone() })
    }

    /// Token ids of a plain-text prompt (with the tokenizer's own special tokens, e.g. BOS).
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        if text.is_empty() {
            return Err(EngineError::Invalid {
                field: "prompt",
                message: "empty prompt".into(),
            });
        }
        self.tokenizer()?.encode(text, true)
    }

    /// Why the checkpoint's chat template cannot be used (unreadable or not
    /// compiling), if so: loading succeeds without it, chats fail with this.
    pub fn chat_template_error(&self) -> Option<&str> {
        self.chat.as_ref().err().map(String::as_str)
    }

    /// The checkpoint's chat format, or why there is none to use.
    fn chat_format(&self) -> Result<&ChatFormat, EngineError> {
        self.chat
            .as_ref()
            .map_err(|e| EngineError::ChatTemplate(e.clone()))?
            .as_ref()
            .ok_or_else(|| EngineError::NoChatTemplate { dir: self.dir.clone() })
    }

    /// Renders a chat with the checkpoint's template (generation prompt
    /// added); for Kimi K3, its segments joined
    /// ([`crate::kimi_k3_chat::render`]).
    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, EngineError> {
        self.render_chat_with(messages, &RenderOptions::generation())
    }

    /// Renders a chat with tools and template kwargs
    /// ([`ChatTemplate::render_with`]). Kimi K3's encoder reads its own
    /// switches from the kwargs (`thinking`, `thinking_effort` or
    /// `reasoning_effort`, `tool_choice`, `response_format`); other kwargs
    /// are ignored there.
    pub fn render_chat_with(&self, messages: &[ChatMessage], options: &RenderOptions) -> Result<String, EngineError> {
        match self.chat_format()? {
            ChatFormat::Template(t) => t.render_with(messages, options),
            ChatFormat::KimiK3 => Ok(crate::kimi_k3_chat::render(&kimi_k3_segments(messages, options)?)),
        }
    }

    /// The reader of the output generated after `prompt` (a render of this
    /// checkpoint's chat format): reasoning, content and tool calls per the
    /// checkpoint's family ([`ChatTemplate::output_parser`]; Kimi K3: its
    /// think and response tags, thinking when `prompt` ends in an open
    /// `think` tag).
    pub fn output_parser(&self, prompt: &str) -> Result<Box<dyn crate::tool_calls::OutputParser>, EngineError> {
        use crate::kimi_k3_chat::{OPEN, SEP};
        Ok(match self.chat_format()? {
            ChatFormat::Template(t) => t.output_parser(prompt),
            ChatFormat::KimiK3 => crate::reasoning::kimi_k3(prompt.ends_with(&format!("{OPEN}think{SEP}")), true),
        })
    }

    /// Token ids of a chat, as `apply_chat_template(tokenize=True)` gives
    /// them: a rendered template tokenized whole (it already holds its
    /// special tokens, so none are added); Kimi K3's segments each tokenized
    /// on its own, special tokens matched in its control segments only
    /// ([`crate::kimi_k3_chat::encode`]).
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, EngineError> {
        self.encode_chat_with(messages, &RenderOptions::generation())
    }

    /// [`Engine::encode_chat`] with tools and template kwargs.
    pub fn encode_chat_with(&self, messages: &[ChatMessage], options: &RenderOptions) -> Result<Vec<u32>, EngineError> {
        Ok(self.chat_prompt(messages, options)?.1)
    }

    /// A chat rendered once, as text ([`Engine::render_chat_with`]) and as
    /// ids ([`Engine::encode_chat_with`]): what a server needs to read the
    /// output against the prompt and to generate from it.
    pub fn chat_prompt(&self, messages: &[ChatMessage], options: &RenderOptions) -> Result<(String, Vec<u32>), EngineError> {
        match self.chat_format()? {
            ChatFormat::Template(t) => {
                let text = t.render_with(messages, options)?;
                let ids = self.tokenizer()?.encode(&text, false)?;
                Ok((text, ids))
            }
            ChatFormat::KimiK3 => {
                let segments = kimi_k3_segments(messages, options)?;
                let ids = crate::kimi_k3_chat::encode(self.tokenizer()?, &segments)?;
                Ok((crate::kimi_k3_chat::render(&segments), ids))
            }
        }
    }

    /// Text of generated ids, special tokens left out.
    pub fn decode(&self, ids: &[u32]) -> Result<String, EngineError> {
        self.tokenizer()?.decode(ids, true)
    }

    /// Logits of every position of `ids`, from an empty state.
    pub fn forward(&self, ids: &[u32]) -> Result<Mat, EngineError> {
        let mut state = self.model.new_state();
        Ok(self.model.forward(ids, &mut state, None)?)
    }
}

/// Kimi K3's segments of a chat with `apply_chat_template`'s defaults (the
/// generation prompt as `options` says); at least one message, as a
/// template render requires; tools, `tool_choice` and the thinking
/// switches from `options`.
fn kimi_k3_segments(messages: &[ChatMessage], options: &RenderOptions) -> Result<Vec<crate::kimi_k3_chat::Segment>, EngineError> {
    if messages.is_empty() {
        return Err(EngineError::Invalid {
            field: "messages",
            message: "at least one message is needed".into(),
        });
    }
    let mut k3 = crate::kimi_k3_chat::Options {
        add_generation_prompt: options.add_generation_prompt,
        tools: options.tools.clone(),
        tool_choice: options.kwargs.get("tool_choice").and_then(|c| c.as_str()).map(str::to_string),
        response_format: options.kwargs.get("response_format").filter(|f| f.is_object()).cloned(),
        ..Default::default()
    };
    // The release's switches, as `apply_chat_template` kwargs
    // (`reasoning_effort` is OpenAI's name for `thinking_effort`).
    let kw = &options.kwargs;
    match kw.get("thinking") {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Bool(on)) => k3.thinking = *on,
        Some(v) => {
            return Err(EngineError::Invalid {
                field: "chat_template_kwargs",
                message: format!("Kimi K3's `thinking` is a boolean, not {v}"),
            })
        }
    }
    match kw.get("thinking_effort").or_else(|| kw.get("reasoning_effort")) {
        None => {}
        Some(serde_json::Value::Null) => k3.thinking_effort = None,
        Some(serde_json::Value::String(e)) => k3.thinking_effort = Some(e.parse()?),
        Some(v) => {
            return Err(EngineError::Invalid {
                field: "thinking_effort",
                message: format!("Kimi K3's thinking effort is low, high or max, not {v}"),
            })
        }
    }
    crate::kimi_k3_chat::segments(messages, &k3)
}

/// Progress of a load: `(bytes read so far, total bytes to read)`.
pub(crate) type LoadProgress = dyn Fn(u64, u64) + Send + Sync;

/// Hooks `progress` to `ckpt`'s reads, with the total a load over `dir`
/// reads: counted by building the model over the headers alone (an error
/// there leaves the total 0; the real load reports it).
pub(crate) fn report_reads(
    ckpt: &mut Checkpoint,
    dir: &Path,
    spec: &larder_model::ModelSpec,
    experts: Option<Arc<dyn ExpertProvider>>,
    progress: Option<Arc<LoadProgress>>,
) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let Some(progress) = progress else { return };
    let counted = Arc::new(AtomicU64::new(0));
    if let Ok(mut dry) = Checkpoint::open_unread(dir) {
        let c = counted.clone();
        dry.set_read_progress(Arc::new(move |n| {
            c.fetch_add(n, Ordering::Relaxed);
        }));
        if DecoderModel::load(spec.clone(), &dry, experts).is_err() {
            counted.store(0, Ordering::Relaxed);
        }
    }
    let total = counted.load(Ordering::Relaxed);
    let done = Arc::new(AtomicU64::new(0));
    progress(0, total);
    ckpt.set_read_progress(Arc::new(move |n| {
        let now = done.fetch_add(n, Ordering::Relaxed) + n;
        progress(now, total.max(now));
    }));
}

fn check_dir(dir: &Path) -> Result<(), EngineError> {
    if dir.is_dir() {
        Ok(())
    } else {
        Err(EngineError::File {
            path: dir.to_path_buf(),
            message: "model folder not found (give a Hugging Face checkpoint folder or a store made by `larder pack`)".into(),
        })
    }
}
