//! `larder serve`: the OpenAI-compatible HTTP server. Binds first (so
//! `/health` answers "loading" at once), loads the model on a thread, and
//! drains gracefully on SIGINT/SIGTERM (exit 0). Every flag is range-checked.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use larder_engine::DrafterChoice;
use larder_serve::{run, ServerConfig};

/// Arguments of `larder serve`.
#[derive(clap::Args)]
#[command(
    after_help = "Endpoints: GET /v1/models, GET /v1/models/{id}, POST /v1/chat/completions, POST /v1/completions \
(both with \"stream\": true for server-sent events), GET /health (503 {\"status\": \"loading\"} until the model has \
loaded), GET /metrics (Prometheus text). HEAD and OPTIONS work on every route.\n\n\
Sampling fields a request omits (temperature, top_p, top_k) follow the model's generation_config.json, as vLLM \
does (OpenAI's defaults where it gives none: temperature 1, top_p 1); a request without a seed gets a fresh random one.\n\n\
Requests the server cannot honour exactly (n > 1, logit_bias, tools, images, non-zero penalties, unknown \
fields) get an OpenAI-shaped 400 error before generation starts; bodies over --max-request-bytes get 413. \
Generation runs on one engine thread: up to --max-batch requests decode together, each token-for-token what it \
would be alone; more wait FIFO up to --queue-depth, then get 429. A request whose prompt plus max_tokens could \
not fit in --kv-budget gets a 400 before generation. Prompts are rendered and tokenized off the engine thread \
(large ones at a lower CPU priority), so a large prompt never stalls running streams. With --draft, every request \
decodes speculatively, batched with the others like any request (the model still decides every token).\n\n\
SIGINT/SIGTERM: stop accepting, let running requests finish within --shutdown-grace, end streams still running \
with an error event and [DONE], exit 0.\n\n\
Examples:\n  larder serve --model ./fixtures/qwen3_moe_tok\n  \
larder serve --model /fast/k2 --ram-budget 96GiB --host 0.0.0.0 --port 8000 --api-key $KEY\n  \
larder serve --model ./fixtures/qwen3_moe_tok --cors-origin http://localhost:3000\n  \
curl http://127.0.0.1:8000/v1/chat/completions -H 'content-type: application/json' \\\n    \
-d '{\"model\": \"qwen3_moe_tok\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}'"
)]
pub struct Args {
    /// Checkpoint folder or packed store.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    #[command(flatten)]
    experts: super::ExpertArgs,
    /// Address to bind (loopback by default; 0.0.0.0 exposes the server to the network).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on, 0..=65535 (0 picks a free one).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Model id clients must send (default: the model folder's name).
    #[arg(long)]
    served_name: Option<String>,
    /// Require `Authorization: Bearer KEY` on /v1 endpoints (the scheme in any case). An empty key is refused
    /// (an unset variable, most likely); without a key, listening on a non-loopback address is warned about.
    #[arg(long, env = "LARDER_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Requests queued or running before the server answers 429 (1..=4096).
    #[arg(long, default_value_t = 16, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=4096))]
    queue_depth: u16,
    /// Requests decoding together in one batched step (1..=256), drafting or not; more wait in the queue.
    #[arg(long, default_value_t = 8, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    max_batch: u16,
    /// Memory all requests' sequence state (KV cache) may take together, e.g. 2GiB (default: half of what
    /// MemAvailable at start leaves after the expert cache budget, at least 64MiB). A request whose worst case
    /// (prompt + max_tokens positions) cannot fit is refused with a 400. KV bytes per token: `larder doctor
    /// --model DIR` and each response's stats (`state_bytes_per_position`); MLA layers (DeepSeek-V3, Kimi)
    /// cache the compressed latent, kv_lora_rank + rope floats per layer (DeepSeek-V3: 137 KiB per token
    /// instead of 9.5 MiB expanded).
    #[arg(long, value_name = "SIZE", value_parser = larder_serve::defaults::kv_size)]
    kv_budget: Option<u64>,
    /// Largest request body accepted, 1KiB..=1GiB (e.g. 1MiB); larger bodies get 413.
    #[arg(long, default_value = "1MiB", value_name = "SIZE", value_parser = larder_serve::defaults::body_size)]
    max_request_bytes: u64,
    /// Seconds running requests get to finish after SIGINT/SIGTERM (0..=3600).
    #[arg(long, default_value_t = 30, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(0..=3600))]
    shutdown_grace: u64,
    /// Allow browser requests from ORIGIN (scheme://host[:port], or `*` for any); repeatable. Default: no CORS.
    #[arg(long, value_name = "ORIGIN", value_parser = larder_serve::cors::parse_origin)]
    cors_origin: Vec<String>,
    /// Speculative decoding for every request: `ngram` (prompt lookup), `model` (needs --draft-model), `self`
    /// (the model using only experts already in the RAM cache) or `off`. Greedy output is identical.
    #[arg(long, value_name = "ngram|model|self|off", default_value = "off", value_parser = ["ngram", "model", "self", "off"])]
    draft: String,
    /// A small checkpoint sharing the model's vocabulary, used as draft model (implies --draft model).
    #[arg(long, value_name = "DIR")]
    draft_model: Option<PathBuf>,
    /// Keep finished conversations' model state (KV cache, recurrent state and its snapshots) in DIR too, so a
    /// later request sharing a prefix loads it instead of prefilling, also after a restart. Created if missing;
    /// it must be writable. Files are digested and tagged with the model's identity; a corrupt file or another
    /// model's is never used. Default: no disk tier (RAM only).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Most bytes of state files kept in --state-dir, e.g. 20GiB (least recently used files are removed to stay
    /// under it; a state larger than it is not saved). Default: 10% of the free space on that file system at start.
    #[arg(long, value_name = "SIZE", value_parser = larder_store::parse_size, requires = "state_dir")]
    state_quota: Option<u64>,
    /// Record every forward pass's routes (each token's experts per MoE layer, its request, position and phase,
    /// and what the next 3 MoE layers' routers pick on its input) to FILE, JSON Lines; read it with `larder trace
    /// stats FILE` or `larder bench cache --trace FILE`. Rewritten atomically whenever the server goes idle
    /// (at most every 10 s while busy) and when it stops. It grows with every token served (a few hundred bytes
    /// each): for measurement sessions. FILE is checked before the model loads: it may not be an input of the run
    /// (the model's files, --cache-dir, --state-dir), and an existing trace is replaced only with --overwrite.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    #[command(flatten)]
    output: super::OverwriteArg,
}

/// `--kv-budget`, or its default for this model and these expert flags.
fn kv_budget(args: &Args) -> Option<u64> {
    if args.kv_budget.is_some() {
        return args.kv_budget;
    }
    let budget = larder_serve::defaults::kv_budget_for(&args.experts.load_options(&args.model))?;
    eprintln!(
        "[larder] KV budget {} (default: half of MemAvailable after the expert cache; --kv-budget sets it)",
        larder_engine::format_size(budget)
    );
    Some(budget)
}

/// `--state-dir` and `--state-quota`, checked before anything loads: the
/// folder is created and must be writable.
fn state_dir(args: &Args) -> anyhow::Result<Option<larder_engine::DiskTierConfig>> {
    let Some(dir) = args.state_dir.clone() else { return Ok(None) };
    larder_engine::check_state_dir(&dir).map_err(|e| anyhow::anyhow!("--state-dir {}: {e}", dir.display()))?;
    let quota = match args.state_quota {
        Some(q) => q,
        None => {
            let (quota, free) = larder_engine::default_state_quota(&dir);
            eprintln!(
                "[larder] state dir {}: quota {} (default: 10% of the {} free there; --state-quota sets it)",
                dir.display(),
                larder_engine::format_size(quota),
                larder_engine::format_size(free)
            );
            quota
        }
    };
    Ok(Some(larder_engine::DiskTierConfig { dir, quota }))
}

/// `--api-key` (or `LARDER_API_KEY`), checked before anything else: a key
/// no client can send (empty, or with whitespace around it) is refused.
fn check_api_key(key: Option<&str>) -> anyhow::Result<()> {
    let config = ServerConfig {
        api_key: key.map(str::to_string),
        ..ServerConfig::default()
    };
    config.check_api_key().context("--api-key (or LARDER_API_KEY)")
}

/// `--trace`, checked before anything loads: an output path it may write
/// (`larder_engine::OutputFile`), and a model with routed experts.
fn trace(args: &Args) -> anyhow::Result<Option<larder_engine::TraceConfig>> {
    let Some(path) = args.trace.clone() else { return Ok(None) };
    let mut inputs = super::model_inputs(&args.model, &args.experts);
    if let Some(draft) = &args.draft_model {
        inputs = inputs.model("--draft-model", draft);
    }
    if let Some(dir) = &args.state_dir {
        inputs = inputs.folder("--state-dir", dir);
    }
    let output = super::trace::check_output(&path, args.output.overwrite, &inputs)?;
    let sizes = super::inspect_model(&args.model)
        .with_context(|| format!("--trace {}: reading the model's MoE shape", path.display()))?
        .sizes;
    if sizes.moe_layers == 0 {
        bail!(
            "--trace {}: {} has no MoE layers, so there are no routes to record",
            path.display(),
            args.model.display()
        );
    }
    Ok(Some(larder_engine::TraceConfig {
        output,
        model: args.model.display().to_string(),
        expert_bytes: sizes.expert_bytes,
        lookahead: super::trace::LOOKAHEAD,
    }))
}

pub fn run_cmd(args: Args) -> anyhow::Result<()> {
    check_api_key(args.api_key.as_deref())?;
    let kv = kv_budget(&args);
    let state_dir = state_dir(&args)?;
    let trace = trace(&args)?;
    let lazy = args.experts.cache_dir.is_some();
    let name = args
        .served_name
        .clone()
        .unwrap_or_else(|| larder_serve::defaults::served_name(&args.model, lazy));
    let config = ServerConfig {
        host: args.host,
        port: args.port,
        served_name: name,
        api_key: args.api_key,
        queue_depth: usize::from(args.queue_depth),
        max_request_bytes: usize::try_from(args.max_request_bytes)?,
        shutdown_grace: Duration::from_secs(args.shutdown_grace),
        cors_origins: args.cors_origin,
        max_batch: usize::from(args.max_batch),
        kv_budget: kv.map(usize::try_from).transpose()?,
        state_dir,
        trace,
        ..ServerConfig::default()
    };
    // Checked before loading, so a missing --draft-model is said at once.
    let choice = DrafterChoice::parse(&args.draft, args.draft_model.as_deref())?;
    let (model, experts) = (args.model, args.experts);
    run(config, move || {
        let engine = super::load_engine(&model, &experts).map_err(|e| super::error_text(&e))?;
        let drafting = engine.drafting(&choice).map_err(|e| super::error_text(&anyhow::Error::from(e)))?;
        Ok((engine, drafting))
    })?;
    Ok(())
}
