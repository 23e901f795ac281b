//! `larder run`: generate from ids, a text prompt or a chat, streaming text
//! to stdout (or one JSON document with --json). The request is one job of
//! an engine handle (`larder_engine::EngineHandle`), the path `larder serve`
//! runs its requests through.

use std::io::Write;
use std::path::PathBuf;

use anyhow::bail;
use larder_engine::{
    ChatMessage, DrafterChoice, Engine, EngineHandle, Event, Events, GenerateOptions, HandleConfig, Job, Outcome, SamplingParams,
    SchedulerConfig,
};
use serde_json::json;

/// Arguments of `larder run`.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  larder run --model ./fixtures/qwen3_moe_tok --prompt \"The capital of France is\" --max-new 16\n  larder run --model ./fixtures/qwen3_moe_tok --chat --prompt \"Explain tides\"\n  larder run --model ./fixtures/qwen3_moe_tiny --ids 1,200,31 --max-new 8 --json\n  larder run --model ./fixtures/qwen3_moe_tok --prompt \"The capital of France is\" --stop . --stop ,"
)]
pub struct Args {
    /// Checkpoint folder or packed store (see `larder pack`).
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    #[command(flatten)]
    experts: super::ExpertArgs,
    /// Prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',', num_args = 1.., conflicts_with = "prompt", required_unless_present = "prompt")]
    ids: Option<Vec<u32>>,
    /// Prompt text, tokenized with the checkpoint's tokenizer.json.
    #[arg(long)]
    prompt: Option<String>,
    /// Treat --prompt as a user message and render the checkpoint's chat template.
    #[arg(long, requires = "prompt")]
    chat: bool,
    /// With --chat: a system message placed before the user message.
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// Maximum number of new tokens, 1 to 16777216 (generation also stops at the model's context length).
    #[arg(long, default_value_t = 128, value_parser = super::range(1, 1 << 24))]
    max_new: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f32,
    /// Nucleus sampling: keep the most likely tokens up to this probability mass (1 = off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    top_p: f32,
    /// Keep only the K most likely tokens, 0 to 16777216 (0 = off; K at or above the vocabulary keeps all).
    #[arg(long, default_value_t = 0, value_parser = super::range(0, 1 << 24))]
    top_k: usize,
    /// Seed of the sampler (sampling is reproducible for a given seed).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep generating past EOS tokens (until --max-new).
    #[arg(long)]
    ignore_eos: bool,
    /// Stop when the text contains STR (repeatable); STR and what follows are not printed.
    /// Text that may start a stop string is held back until it cannot.
    #[arg(long, value_name = "STR")]
    stop: Vec<String>,
    /// Print {"ids", "text", "finish_reason", "stats"} on stdout instead of streaming text ("stop_string" too
    /// when one ended generation).
    #[arg(long)]
    json: bool,
    /// After the text, print detailed stats on stderr (expert I/O and per-layer cache hit rates when streaming).
    #[arg(long)]
    stats: bool,
    /// Speculative decoding: `ngram` (prompt lookup), `model` (needs --draft-model), `self` (the model
    /// itself using only experts already in the RAM cache: no I/O to draft) or `off`.
    /// The model still verifies every token: greedy output is identical, sampling keeps its distribution.
    #[arg(long, value_name = "ngram|model|self|off", default_value = "off", value_parser = ["ngram", "model", "self", "off"])]
    draft: String,
    /// A small checkpoint sharing the model's vocabulary, used as draft model (implies --draft model).
    #[arg(long, value_name = "DIR")]
    draft_model: Option<PathBuf>,
    /// Most tokens drafted per verification pass, 1 to 64 (the length adapts below it).
    #[arg(long, default_value_t = 8, value_parser = super::range(1, super::MAX_DRAFT))]
    draft_max: usize,
    /// Record every token's experts per MoE layer (prompt and decode, each forward pass, and what the next
    /// 3 MoE layers' routers pick on its input) to FILE, JSON Lines; read it with `larder trace stats FILE`
    /// or `larder bench cache --trace FILE`. Written atomically when generation ends. FILE is checked before
    /// the model loads: it may not be an input of the run, and an existing trace is replaced only with --overwrite.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    #[command(flatten)]
    output: super::OverwriteArg,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let mut trace_out = check_trace(&args)?;
    let engine = super::load_engine_with(&args.model, &args.experts, args.json)?;
    let prompt_ids = prompt_ids(&args, &engine)?;
    let ids_only = engine.tokenizer().is_err();
    if ids_only {
        if !args.stop.is_empty() {
            bail!(
                "--stop needs text, but {} has no tokenizer (tokenizer.json or tiktoken.model); leave out --stop",
                args.model.display()
            );
        }
        tracing::info!(
            "{} has no tokenizer (tokenizer.json or tiktoken.model): printing token ids instead of text",
            args.model.display()
        );
    }
    let job = job(&args, &engine, prompt_ids.clone())?;
    // One job on the engine handle, the path `larder serve` runs requests through.
    let one_job = HandleConfig {
        scheduler: SchedulerConfig {
            max_batch: 1,
            prefix_cache: 0,
            ..SchedulerConfig::default()
        },
        ..HandleConfig::default()
    };
    let handle = EngineHandle::start(engine, one_job)?;
    let engine = handle.engine().clone();
    let streamed = stream(handle.submit(job)?, ids_only, args.json);
    // Every job has ended (a broken pipe cancelled it): the engine thread stops.
    handle.stop()?;
    let (generation, write_error) = streamed?;
    if let (Some(out), Some(rt)) = (&mut trace_out, &generation.routes) {
        let bytes = super::trace::expert_bytes(&args.model)?;
        let file = super::trace::to_file(rt, engine.model().spec(), &args.model, prompt_ids.len(), bytes)?;
        out.write_with(|w| file.write_lines(w))?;
    }
    if let Some(e) = write_error {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            return Err(e.into());
        }
        return Ok(());
    }
    report(&args, &engine, &generation)
}

/// `--trace FILE`, checked before the model loads.
fn check_trace(args: &Args) -> anyhow::Result<Option<larder_engine::OutputFile>> {
    let Some(path) = &args.trace else { return Ok(None) };
    let mut inputs = super::model_inputs(&args.model, &args.experts);
    if let Some(draft) = &args.draft_model {
        inputs = inputs.model("--draft-model", draft);
    }
    Ok(Some(super::trace::check_output(path, args.output.overwrite, &inputs)?))
}

/// The prompt's ids: `--ids`, or `--prompt` tokenized (as a chat with `--chat`).
fn prompt_ids(args: &Args, engine: &Engine) -> anyhow::Result<Vec<u32>> {
    Ok(match (&args.ids, &args.prompt) {
        (Some(ids), _) => ids.clone(),
        (None, Some(text)) if args.chat => {
            let mut messages = Vec::new();
            if let Some(system) = &args.system {
                messages.push(ChatMessage::new("system", system));
            }
            messages.push(ChatMessage::new("user", text));
            engine.encode_chat(&messages)?
        }
        (None, Some(text)) => engine.encode_prompt(text)?,
        (None, None) => bail!("give a prompt with --ids or --prompt"),
    })
}

/// The job the flags ask for: sampling, stop strings, the drafter, route
/// recording. Generation stops where the context is full: `--max-new` is
/// capped to the room the prompt leaves.
fn job(args: &Args, engine: &Engine, prompt: Vec<u32>) -> anyhow::Result<Job> {
    let room = engine.check_prompt(&prompt, None)?;
    let options = GenerateOptions {
        max_new: args.max_new.min(room),
        sampling: SamplingParams {
            temperature: args.temperature,
            top_p: args.top_p,
            top_k: args.top_k,
            seed: args.seed,
        },
        stop_at_eos: !args.ignore_eos,
        draft_max: args.draft_max,
    };
    let drafting = engine.drafting(&DrafterChoice::parse(&args.draft, args.draft_model.as_deref())?)?;
    Ok(Job {
        prompt,
        options,
        stop: args.stop.clone(),
        drafter: drafting.drafter()?,
        record_routes: args.trace.as_ref().map(|_| super::trace::LOOKAHEAD),
        ..Job::default()
    })
}

/// What ends the run: the JSON document (`--json`), or a newline after the
/// streamed text and the summary (and `--stats`) on stderr.
fn report(args: &Args, engine: &Engine, generation: &Outcome) -> anyhow::Result<()> {
    let text = match engine.tokenizer().ok() {
        // Without stop strings, the whole decode (identical to the streamed pieces).
        Some(t) if args.stop.is_empty() => t.decode(&generation.ids, true)?,
        Some(_) => generation.text.clone(),
        None => String::new(),
    };
    let s = &generation.stats;
    if args.json {
        let mut doc = json!({
            "ids": generation.ids,
            "text": text,
            "finish_reason": generation.finish_reason,
            "stats": s,
        });
        if let Some(stop) = &generation.stop_string {
            doc["stop_string"] = json!(stop);
        }
        return super::print_json(&doc);
    }
    writeln!(std::io::stdout().lock())?;
    eprintln!("{}", larder_tools::text::run_summary(s, generation));
    if args.stats {
        eprint!("{}", larder_tools::text::run_stats_text(s));
    }
    Ok(())
}

/// Prints the job's text as it streams (token ids when the model has no
/// tokenizer; nothing with `--json`) and returns its outcome, with the error
/// that stopped writing to stdout (a closed pipe, say: generation is then
/// cancelled) if one did.
fn stream(mut events: Events, ids_only: bool, json: bool) -> anyhow::Result<(Outcome, Option<std::io::Error>)> {
    let mut stdout = std::io::stdout().lock();
    let mut write_error = None;
    let mut outcome = None;
    while let Some(event) = events.blocking_recv() {
        let piece = match event {
            Event::Done(o) => {
                outcome = Some(*o);
                continue;
            }
            Event::Failed(e) => return Err(e.into()),
            _ if json || write_error.is_some() => continue,
            Event::Token { id, .. } if ids_only => format!("{id} "),
            Event::Token { text, .. } | Event::Text(text) => text,
        };
        if piece.is_empty() {
            continue;
        }
        if let Err(e) = stdout.write_all(piece.as_bytes()).and_then(|_| stdout.flush()) {
            // A closed pipe (e.g. `| head`) stops generation instead of panicking.
            write_error = Some(e);
            events.cancel();
        }
    }
    let outcome = outcome.ok_or_else(|| anyhow::anyhow!("internal: the engine thread stopped without ending the request"))?;
    Ok((outcome, write_error))
}
