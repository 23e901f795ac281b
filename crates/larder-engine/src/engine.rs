//! [`Engine`]: a loaded checkpoint (model, tokenizer, chat template,
//! generation config) and the generation loop: prefill in chunks, then one
//! forward per token, sampling, EOS and length stops, streaming callbacks
//! and stats.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use larder_model::arch::read_spec;
use larder_model::checkpoint::Checkpoint;
use larder_model::{load_model, DecoderModel, ExpertProvider, RouteTrace, SequenceState};
use larder_store::{ExpertStore, Manifest, StoreOptions};
use larder_tensor::Mat;
use serde::Serialize;

use crate::chat::{ChatMessage, ChatTemplate};
use crate::error::EngineError;
use crate::experts::{direct_index, packed_index, store_err, StoreExperts};
use crate::generation::GenerationConfig;
use crate::prefill::{passes, PrefillChunk};
use crate::return_points::ReturnPoints;
use crate::sampling::{Sampler, SamplingParams};
use crate::stats::{ExpertStats, Stats};
use larder_spec::Drafter;

mod speculative;
use crate::tokenizer::TextTokenizer;

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
    /// The chat template, or why it cannot be used: a broken template is
    /// reported when a chat is rendered, not at load (plain prompts need none).
    chat: Result<Option<ChatTemplate>, String>,
    generation: GenerationConfig,
    /// How prompts are split into forward passes.
    prefill: PrefillChunk,
    /// `--ram-budget auto`: resizes the expert cache under memory pressure.
    memory_watch: Option<crate::memory_watch::MemoryWatch>,
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
        if let Some(message) = unfinished_store(dir) {
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
        let chat = ChatTemplate::from_dir(dir).map_err(|e| e.to_string());
        let generation = GenerationConfig::from_dir(dir)?;
        Ok(Engine {
            dir: dir.to_path_buf(),
            model: Arc::new(model),
            store,
            tokenizer,
            chat,
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
    pub fn watch_memory(&mut self, config: crate::memory_watch::WatchConfig) {
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

    /// Renders a chat with the checkpoint's template (generation prompt added).
    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, EngineError> {
        let chat = self
            .chat
            .as_ref()
            .map_err(|e| EngineError::ChatTemplate(e.clone()))?
            .as_ref()
            .ok_or_else(|| EngineError::NoChatTemplate { dir: self.dir.clone() })?;
        chat.render(messages, true)
    }

    /// Token ids of a rendered chat (the template already holds special tokens,
    /// so none are added, as `apply_chat_template(tokenize=True)` does).
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, EngineError> {
        let text = self.render_chat(messages)?;
        self.tokenizer()?.encode(&text, false)
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

    /// Generates after `prompt`. `on_token` sees each new id as it is chosen
    /// and returns `false` to stop.
    pub fn generate(
        &self,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Generation, EngineError> {
        self.generate_traced(prompt, opts, on_token, None)
    }

    /// [`generate`](Self::generate), recording the routes of every position
    /// (prompt and decode) into `trace`.
    pub fn generate_traced(
        &self,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_token: &mut dyn FnMut(u32) -> bool,
        trace: Option<&mut RouteTrace>,
    ) -> Result<Generation, EngineError> {
        let mut state = self.model.new_state();
        self.generate_in(prompt, &mut state, None, 0, opts, on_token, trace, None)
    }

    /// [`generate`](Self::generate) with speculative decoding: `drafter`
    /// guesses up to `opts.draft_max` tokens at a time and the model verifies
    /// them in one batched pass. Greedy output is identical to `generate`'s;
    /// sampled output has the same distribution (reproducible per seed).
    pub fn generate_with_drafter(
        &self,
        prompt: &[u32],
        opts: &GenerateOptions,
        drafter: &mut dyn Drafter,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Generation, EngineError> {
        let mut state = self.model.new_state();
        self.generate_in(prompt, &mut state, None, 0, opts, on_token, None, Some(drafter))
    }

    /// The one generation loop behind every entry point: continues from
    /// `state`, whose first `cached` positions are the prompt's first tokens
    /// (prefix reuse, as [`Conversation::run`](crate::Conversation::run)
    /// does: only the rest is prefilled, and batch invariance makes the
    /// result identical to a fresh prefill); records routes into `trace`;
    /// drafts with `drafter` when given. A state that cannot roll back (a
    /// recurrent layer) goes back to the nearest of `points`' snapshots, and
    /// new ones are kept at the prompt minus its last token and at the end
    /// (see [`crate::return_points`]); without `points` it reuses its
    /// positions only when it holds no more than the shared prefix.
    /// Afterwards `state` holds every token fed to the model: the prompt and
    /// all new ids but the last (`Stats::cached_tokens` says how many prompt
    /// tokens were reused).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn generate_in(
        &self,
        prompt: &[u32],
        state: &mut SequenceState,
        mut points: Option<&mut ReturnPoints>,
        cached: usize,
        opts: &GenerateOptions,
        on_token: &mut dyn FnMut(u32) -> bool,
        mut trace: Option<&mut RouteTrace>,
        drafter: Option<&mut dyn Drafter>,
    ) -> Result<Generation, EngineError> {
        let started = Instant::now();
        let store_before = self.store.as_ref().map(|s| s.stats());
        let mut sampler = Sampler::new(opts.sampling)?;
        self.model.check_ids(prompt, 0)?;
        // At least the last prompt token runs, for its logits.
        let wanted = cached.min(prompt.len() - 1);
        let reuse = match points.as_deref_mut() {
            Some(p) => p.keep_prefix(state, wanted)?,
            None => ReturnPoints::new().keep_prefix(state, wanted)?,
        };
        let mut stats = Stats {
            prompt_tokens: prompt.len(),
            cached_tokens: reuse,
            ..Stats::default()
        };
        let logits = self.prefill(&prompt[reuse..], state, trace.as_deref_mut(), points.as_deref_mut())?;
        stats.prefill_s = started.elapsed().as_secs_f64();

        let (ids, finish_reason) = match drafter {
            Some(drafter) => {
                let run = speculative::Run {
                    engine: self,
                    prompt,
                    opts,
                    started,
                };
                run.decode(drafter, &mut sampler, state, logits, &mut stats, on_token, trace)?
            }
            None => self.decode_plain(&mut sampler, state, logits, opts, started, &mut stats, on_token, trace)?,
        };
        // The end of the turn: a later request may return here.
        let snapshot_bytes = points.map_or(0, |p| {
            p.record(state);
            p.bytes()
        });
        stats.record_state(state, snapshot_bytes);
        if let (Some(store), Some(before)) = (&self.store, store_before) {
            stats.experts = Some(ExpertStats::from_store(store.backend().name(), &store.stats().since(&before)));
        }
        Ok(Generation { ids, finish_reason, stats })
    }

    /// Plain decoding: one forward per token after the prompt's logits.
    #[allow(clippy::too_many_arguments)]
    fn decode_plain(
        &self,
        sampler: &mut Sampler,
        state: &mut SequenceState,
        mut logits: Vec<f32>,
        opts: &GenerateOptions,
        started: Instant,
        stats: &mut Stats,
        on_token: &mut dyn FnMut(u32) -> bool,
        mut trace: Option<&mut RouteTrace>,
    ) -> Result<(Vec<u32>, FinishReason), EngineError> {
        let max_ctx = self.model.spec().max_position_embeddings;
        let mut ids = Vec::new();
        let mut finish = FinishReason::Length;
        let mut decode_steps = 0;
        while ids.len() < opts.max_new {
            let next = sampler.sample(&logits);
            ids.push(next);
            if ids.len() == 1 {
                stats.time_to_first_token_s = started.elapsed().as_secs_f64();
            }
            if !on_token(next) {
                finish = FinishReason::Cancelled;
                break;
            }
            if opts.stop_at_eos && self.generation.eos_token_ids.contains(&next) {
                finish = FinishReason::Stop;
                break;
            }
            if ids.len() == opts.max_new || state.len() + 1 > max_ctx {
                break;
            }
            let step = Instant::now();
            logits = self.model.forward_last(&[next], state, trace.as_deref_mut())?;
            stats.decode_s += step.elapsed().as_secs_f64();
            decode_steps += 1;
        }
        stats.new_tokens = ids.len();
        stats.finish(decode_steps);
        Ok((ids, finish))
    }

    /// Runs the rest of the prompt in as few passes as its activations allow
    /// ([`crate::prefill`]), returning the last position's logits. With
    /// `points` and a state that cannot roll back, the pass holding the
    /// prompt's last token also snapshots the positions before it (the
    /// return point of a later turn sharing the prompt), so the last token
    /// needs no pass of its own and its experts are read once.
    fn prefill(
        &self,
        rest: &[u32],
        state: &mut SequenceState,
        mut trace: Option<&mut RouteTrace>,
        mut points: Option<&mut ReturnPoints>,
    ) -> Result<Vec<f32>, EngineError> {
        let point = match &points {
            Some(_) if !state.can_rollback() => rest.len().checked_sub(1),
            _ => None,
        };
        let mut last = Vec::new();
        let mut fed = 0;
        for chunk in chunks(rest, self.prefill_rows()) {
            if let Some(p) = point.filter(|p| (fed..fed + chunk.len()).contains(p)) {
                state.mark_after(p - fed);
            }
            last = self.model.forward_last(chunk, state, trace.as_deref_mut())?;
            if let (Some(snap), Some(points)) = (state.take_marked(), points.as_deref_mut()) {
                points.keep(snap);
            }
            fed += chunk.len();
        }
        Ok(last)
    }
}

/// `ids` cut into [`passes`] of at most `max_rows`.
fn chunks(ids: &[u32], max_rows: usize) -> impl Iterator<Item = &[u32]> {
    let mut start = 0;
    passes(ids.len(), max_rows).into_iter().map(move |n| {
        start += n;
        &ids[start - n..start]
    })
}

/// Progress of a load: `(bytes read so far, total bytes to read)`.
pub type LoadProgress = dyn Fn(u64, u64) + Send + Sync;

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

/// What an unfinished store folder (a plan but no manifest.json yet) is
/// and how to finish it: a `pack`, a `pull` (its journal or staging
/// folder), or the first open of a lazy cache; `None` for any other folder.
pub fn unfinished_store(dir: &Path) -> Option<String> {
    if !larder_store::pack::is_unfinished(dir) {
        return None;
    }
    #[cfg(feature = "remote")]
    {
        if crate::lazy::is_lazy_cache(dir) {
            return Some(
                "a lazy cache whose first open did not finish (no lazy.json yet): run it with `--model SOURCE \
                 --cache-dir DIR` again to resume it"
                    .into(),
            );
        }
        if dir.join(larder_store::pull::PULL_STATE).exists() || dir.join(crate::pull::STAGING).is_dir() {
            return Some(
                "an unfinished `larder pull` (no manifest.json yet): run the same `larder pull SOURCE --out DIR` again \
                 to resume it; only what is missing is fetched"
                    .into(),
            );
        }
    }
    Some("an unfinished `larder pack` (no manifest.json yet); re-run the same pack command to finish it".into())
}
