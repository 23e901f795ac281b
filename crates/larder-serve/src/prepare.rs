//! Request preparation, off the engine thread: rendering a chat with the
//! model's template, tokenizing, the prompt checks (ids in the vocabulary,
//! the prompt plus `max_tokens` within the context) and resolving the
//! sampling. A 1 MiB prompt takes a large fraction of a second to tokenize;
//! done on the engine thread it would stall every running stream (and every
//! request queued behind it) for that long, so the HTTP handler hands it to
//! a [`Preparer`] and gives the engine thread a job that is ready to run.
//!
//! Preparation is CPU work that competes with the engine thread, so it is
//! bounded: a [`Preparer`] has two lanes of [`concurrency`] threads each
//! (the cores the engine thread leaves, at least one, at most
//! [`MAX_CONCURRENCY`]). Large prompts prepare in the first lane, whose
//! threads run at a lower CPU priority (nice [`NICE`] on Linux): when they
//! compete with the engine thread for a core, the engine thread runs first,
//! so however many large prompts arrive, running streams keep their pace.
//! Small prompts (up to [`SMALL_PROMPT_BYTES`] of text, or token ids) have
//! the second lane, at normal priority, to themselves, so a short request
//! never waits behind the tokenization of large ones. Each lane takes
//! requests in arrival order; one whose client left while it waited is
//! skipped.
//!
//! Errors are the request's (a 400 naming the field) or, for anything about
//! the server's files, a logged 500 whose message names no path: the same
//! answers as when preparation ran on the engine thread.

use std::sync::{mpsc, Arc, Mutex};

use larder_engine::reasoning::BudgetConstraint;
use larder_engine::{
    Engine, EngineError, GenerateOptions, GrammarConstraint, GrammarSpec, LogitAdjustments, RenderOptions, SamplingParams, TokenConstraint,
};
use tokio::sync::oneshot;

use crate::api::{ApiError, GenerationRequest, Prompt, ResponseFormat};
use crate::tools::ChatReader;

/// Prompts with at most this many bytes of text prepare in the small lane.
/// Tokenizing them takes milliseconds, so they cannot keep the engine thread
/// from a core for long, even all at once (the queue depth bounds how many).
pub const SMALL_PROMPT_BYTES: usize = 64 << 10;

/// Most threads per lane, however many cores the machine has.
pub const MAX_CONCURRENCY: usize = 8;

/// The large lane's nice value (Linux): the scheduler runs the engine
/// thread and the HTTP threads first when they compete for a core.
pub const NICE: i32 = 10;

/// A request ready for the engine thread: its prompt's token ids, the
/// generation options and the stop strings.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
    pub stop: Vec<String>,
    /// `logit_bias` and the penalties.
    pub adjust: LogitAdjustments,
    /// Logprobs with this many alternatives per token, when asked for.
    pub logprobs: Option<usize>,
    /// What each choice may sample (each choice gets a copy).
    pub constraint: Option<Constraint>,
    /// A chat's output reader (reasoning, content, tool calls).
    pub reader: Option<ChatReader>,
    /// The generated text spells special tokens (the reader's markers are).
    pub keep_special_tokens: bool,
}

/// What a request may sample: `response_format`'s grammar or a forced tool
/// call's, or a reasoning budget.
#[derive(Debug, Clone)]
pub enum Constraint {
    Grammar(Box<GrammarConstraint>),
    Budget(BudgetConstraint),
}

impl Constraint {
    /// The engine's form of it.
    pub fn boxed(self) -> Box<dyn TokenConstraint> {
        match self {
            Constraint::Grammar(g) => g,
            Constraint::Budget(b) => Box::new(b),
        }
    }
}

/// What a lane's thread prepares, and where the result goes.
struct Task {
    request: GenerationRequest,
    reply: oneshot::Sender<Result<Prepared, ApiError>>,
}

/// Prepares requests on its own threads: a low-priority lane for large
/// prompts and one for small ones, [`concurrency`] threads each, each lane
/// first come first served. Its threads end when it is dropped.
pub struct Preparer {
    large: mpsc::Sender<Task>,
    small: mpsc::Sender<Task>,
}

/// How many requests prepare at once per lane: the cores the engine thread
/// leaves, at least one and at most [`MAX_CONCURRENCY`].
pub fn concurrency() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get().saturating_sub(1))
        .unwrap_or(1)
        .clamp(1, MAX_CONCURRENCY)
}

/// Bytes of text `prompt` asks to render and tokenize (token ids need neither).
pub fn prompt_bytes(prompt: &Prompt) -> usize {
    match prompt {
        Prompt::Chat(messages) => messages
            .iter()
            .map(|m| {
                let calls: usize = m
                    .tool_calls
                    .iter()
                    .map(|c| c.function.name.len() + c.function.arguments.len())
                    .sum();
                m.role.len() + m.text().len() + m.reasoning_content.as_deref().map_or(0, str::len) + calls
            })
            .sum(),
        Prompt::Text(text) => text.len(),
        Prompt::Ids(_) => 0,
    }
}

impl Preparer {
    /// A preparer sharing `engine` (its tokenizer and chat template) with
    /// the engine thread, `threads` threads per lane (at least one); an
    /// error when a thread cannot start.
    pub fn new(engine: Arc<Engine>, defaults: SamplingParams, threads: usize) -> Result<Preparer, std::io::Error> {
        let threads = threads.max(1);
        Ok(Preparer {
            large: lane(Lane::Large, &engine, defaults, threads)?,
            small: lane(Lane::Small, &engine, defaults, threads)?,
        })
    }

    /// Prepares `request` on a lane's thread, in its turn. Dropping the
    /// future gives up the turn (a request not started yet is skipped).
    pub async fn prepare(&self, request: &GenerationRequest) -> Result<Prepared, ApiError> {
        let lane = if prompt_bytes(&request.prompt) <= SMALL_PROMPT_BYTES {
            &self.small
        } else {
            &self.large
        };
        let (reply, result) = oneshot::channel();
        let task = Task {
            request: request.clone(),
            reply,
        };
        lane.send(task).map_err(|_| stopped())?;
        result.await.map_err(|_| stopped())?
    }
}

/// Which lane: large prompts (low priority) or small ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    Large,
    Small,
}

/// Starts a lane's `threads` threads; the sender feeds them in order.
fn lane(which: Lane, engine: &Arc<Engine>, defaults: SamplingParams, threads: usize) -> Result<mpsc::Sender<Task>, std::io::Error> {
    let (tasks, queue) = mpsc::channel::<Task>();
    let queue = Arc::new(Mutex::new(queue));
    let name = if which == Lane::Large { "large" } else { "small" };
    for i in 0..threads {
        let (engine, queue) = (engine.clone(), queue.clone());
        std::thread::Builder::new().name(format!("larder-prep-{name}-{i}")).spawn(move || {
            if which == Lane::Large {
                lower_priority();
            }
            serve_lane(&engine, &queue, &defaults)
        })?;
    }
    Ok(tasks)
}

/// A lane thread: prepares tasks until the preparer is dropped.
fn serve_lane(engine: &Engine, queue: &Mutex<mpsc::Receiver<Task>>, defaults: &SamplingParams) {
    loop {
        // The lock is held only while waiting for the next task.
        let next = match queue.lock() {
            Ok(q) => q.recv(),
            Err(_) => return,
        };
        let Ok(Task { request, reply }) = next else { return };
        if reply.is_closed() {
            continue; // the client left while it waited
        }
        let prepared =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| prepare(engine, &request, defaults))).unwrap_or_else(|_| {
                Err(ApiError::plain(
                    500,
                    "server_error",
                    None,
                    "preparing the prompt failed (a bug: see the server log)",
                ))
            });
        let _ = reply.send(prepared);
    }
}

/// Lowers the calling thread's CPU priority to [`NICE`] (Linux: nice is per
/// thread); elsewhere, and if refused, it keeps its priority.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority only reads its integer arguments; `who` 0 is the calling thread.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, NICE);
    }
}

fn stopped() -> ApiError {
    ApiError::plain(503, "server_error", None, "the request preparation threads stopped")
}

/// The prompt's token ids, the generation options and the stop strings of
/// `request`, on the calling thread.
pub fn prepare(engine: &Engine, request: &GenerationRequest, defaults: &SamplingParams) -> Result<Prepared, ApiError> {
    let (prompt, rendered, reader, budget) = match &request.prompt {
        Prompt::Chat(messages) => {
            let chat = encode_chat(engine, request, messages).map_err(|e| prompt_error(&e))?;
            (chat.ids, chat.rendered, Some(chat.reader), chat.budget)
        }
        Prompt::Text(text) => (engine.encode_prompt(text).map_err(|e| prompt_error(&e))?, String::new(), None, None),
        Prompt::Ids(ids) => (ids.clone(), String::new(), None, None),
    };
    let max_new = engine.check_prompt(&prompt, request.max_tokens).map_err(|e| request_error(&e))?;
    let options = GenerateOptions {
        max_new,
        sampling: resolve_sampling(request, defaults),
        stop_at_eos: !request.ignore_eos,
        ..GenerateOptions::default()
    };
    let forced = request.tools.as_ref().and_then(|t| t.forced());
    if forced.is_some() && request.response_format.is_some() {
        return Err(ApiError::invalid(
            "response_format",
            "response_format cannot be combined with a required or named tool_choice",
        ));
    }
    if budget.is_some() && (forced.is_some() || request.response_format.is_some()) {
        return Err(ApiError::invalid(
            "max_reasoning_tokens",
            "max_reasoning_tokens cannot be combined with response_format or a required or named tool_choice \
             (their grammar applies from the first token, leaving no reasoning to budget)",
        ));
    }
    let constraint = match &request.response_format {
        None => match forced {
            None => None,
            Some((tools, strict)) => Some(
                engine
                    .tool_call_constraint(&rendered, &tools, strict)
                    .map_err(|e| request_error(&e))?,
            ),
        },
        Some(format) => {
            let spec = match format {
                ResponseFormat::JsonObject => GrammarSpec::JsonObject,
                ResponseFormat::JsonSchema { schema, strict } => GrammarSpec::JsonSchema {
                    schema: schema.clone(),
                    strict: *strict,
                },
            };
            let invalid = |m: String| ApiError::invalid("response_format", m);
            let grammar = engine.grammar().map_err(|e| invalid(e.to_string()))?;
            Some(grammar.compile(&spec).map_err(|e| invalid(e.to_string()))?)
        }
    };
    let keep_special_tokens = reader.as_ref().is_some_and(|r| r.keep_special_tokens);
    let constraint = match (constraint, budget) {
        (Some(grammar), _) => Some(Constraint::Grammar(Box::new(grammar))),
        (None, Some(budget)) => Some(Constraint::Budget(budget)),
        (None, None) => None,
    };
    Ok(Prepared {
        prompt,
        options,
        constraint,
        reader: reader.map(|r| ChatReader(r.parser.into())),
        keep_special_tokens,
        stop: request.stop.clone(),
        adjust: LogitAdjustments {
            logit_bias: request.logit_bias.clone(),
            frequency_penalty: request.frequency_penalty,
            presence_penalty: request.presence_penalty,
        },
        logprobs: request.logprobs,
    })
}

/// A chat, rendered and tokenized.
struct ChatPrompt {
    ids: Vec<u32>,
    /// The prompt as text (what the output readers look at).
    rendered: String,
    /// The reader of what the model writes after it.
    reader: larder_engine::OutputReader,
    /// Its reasoning budget, if asked.
    budget: Option<BudgetConstraint>,
}

/// A chat's prompt (tools and template kwargs rendered; a forced call's
/// `tool_choice` as the template variable `"required"` and the
/// `response_format`, which Kimi K3's encoder reads as notes; templates
/// that do not use them ignore them).
fn encode_chat(engine: &Engine, request: &GenerationRequest, messages: &[larder_engine::ChatMessage]) -> Result<ChatPrompt, EngineError> {
    let mut kwargs = request.template_kwargs.clone();
    if request.tools.as_ref().is_some_and(|t| t.forced().is_some()) {
        kwargs.entry("tool_choice").or_insert_with(|| "required".into());
    }
    if let Some(format) = &request.response_format {
        let value = match format {
            ResponseFormat::JsonObject => serde_json::json!({"type": "json_object"}),
            ResponseFormat::JsonSchema { schema, .. } => serde_json::json!({"type": "json_schema", "json_schema": {"schema": schema}}),
        };
        kwargs.entry("response_format").or_insert(value);
    }
    let options = RenderOptions {
        add_generation_prompt: true,
        tools: request.tools.as_ref().map(|t| t.declarations.clone()),
        kwargs,
    };
    if request.tools.is_some() && engine.tool_family().is_none() {
        return Err(EngineError::Invalid {
            field: "tools",
            message: "larder knows no tool-call format for this model (docs/tools.md lists the families), \
                      so it cannot read its calls; send the request without tools"
                .into(),
        });
    }
    let (rendered, ids) = engine.chat_prompt(messages, &options)?;
    let reader = engine.output_reader(&rendered, request.tools.is_some())?;
    let budget = match request.max_reasoning_tokens {
        Some(max) => Some(engine.reasoning_budget(&rendered, max)?),
        None => None,
    };
    Ok(ChatPrompt {
        ids,
        rendered,
        reader,
        budget,
    })
}

/// The sampling a request runs with: its own fields, else the model's
/// defaults; an unseeded request gets a fresh random seed.
pub fn resolve_sampling(request: &GenerationRequest, defaults: &SamplingParams) -> SamplingParams {
    SamplingParams {
        temperature: request.temperature.unwrap_or(defaults.temperature),
        top_p: request.top_p.unwrap_or(defaults.top_p),
        top_k: request.top_k.unwrap_or(defaults.top_k),
        seed: request.seed.unwrap_or_else(fresh_seed),
    }
}

/// A seed no earlier request used (std's per-instance random hasher keys).
fn fresh_seed() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now())
}

/// An engine error while preparing the prompt, as the client sees it:
/// the request's own faults are 400s; anything about the server's files is
/// a logged 500 whose message names no path.
fn prompt_error(e: &EngineError) -> ApiError {
    match e {
        EngineError::NoTokenizer { .. } => {
            tracing::warn!("refused a text request: {e}");
            ApiError::invalid(
                "prompt",
                "this model has no tokenizer (tokenizer.json or tiktoken.model), so text prompts and chats cannot be served; \
                 send token ids as `prompt` to /v1/completions",
            )
        }
        EngineError::NoChatTemplate { .. } => {
            tracing::warn!("refused a chat request: {e}");
            ApiError::invalid("messages", "this model has no chat template; use /v1/completions with a prompt")
        }
        EngineError::Invalid { field, message } => ApiError::invalid(field, message.clone()),
        EngineError::Tokenizer(_) | EngineError::Template(_) => ApiError::invalid("messages", e.to_string()),
        _ => ApiError::internal("preparing the prompt", e),
    }
}

/// A request the engine refused before generating: a 400 naming the field
/// (`max_tokens` for a request over the KV budget).
pub fn request_error(e: &EngineError) -> ApiError {
    match e {
        EngineError::Invalid { field, message } => ApiError::invalid(field, message.clone()),
        EngineError::KvBudget { .. } => ApiError::invalid("max_tokens", e.to_string()),
        e => ApiError::invalid("prompt", e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ids_and_short_texts_are_small_and_long_texts_large() {
        assert_eq!(prompt_bytes(&Prompt::Ids(vec![1; 100_000])), 0);
        assert_eq!(prompt_bytes(&Prompt::Text("abc".into())), 3);
        let chat = Prompt::Chat(vec![larder_engine::ChatMessage::new("user", &"x".repeat(SMALL_PROMPT_BYTES))]);
        assert!(prompt_bytes(&chat) > SMALL_PROMPT_BYTES);
        assert!(concurrency() >= 1);
    }
}
