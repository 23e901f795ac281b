//! `larder serve`: the OpenAI-compatible HTTP server.

use std::path::PathBuf;

use anyhow::Context;
use larder_serve::{run, ServerConfig};

/// Arguments of `larder serve`.
#[derive(clap::Args)]
#[command(
    after_help = "Endpoints: GET /v1/models, POST /v1/chat/completions, POST /v1/completions (both with \
\"stream\": true for server-sent events), GET /health, GET /metrics (Prometheus text).\n\n\
Requests the server cannot honour exactly (n > 1, logit_bias, tools, images, non-zero penalties, unknown \
fields) get an OpenAI-shaped 400 error before generation starts. Generation runs on one engine thread; \
requests wait FIFO up to --queue-depth, then get 429.\n\n\
Examples:\n  larder serve --model ./fixtures/qwen3_moe_tok\n  \
larder serve --model /fast/k2 --ram-budget 96GiB --host 0.0.0.0 --port 8000 --api-key $KEY\n  \
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
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Model id clients must send (default: the model folder's name).
    #[arg(long)]
    served_name: Option<String>,
    /// Require `Authorization: Bearer KEY` on /v1 endpoints.
    #[arg(long, env = "LARDER_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Requests queued or running before the server answers 429.
    #[arg(long, default_value_t = 16)]
    queue_depth: usize,
    /// Largest request body accepted, in bytes (e.g. 1MiB).
    #[arg(long, default_value = "1MiB", value_parser = larder_store::parse_size)]
    max_request_bytes: u64,
}

pub fn run_cmd(args: Args) -> anyhow::Result<()> {
    let engine = super::load_engine(&args.model, &args.experts)?;
    let name = args.served_name.clone().unwrap_or_else(|| {
        std::fs::canonicalize(&args.model)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "larder".into())
    });
    let config = ServerConfig {
        host: args.host,
        port: args.port,
        served_name: name,
        api_key: args.api_key,
        queue_depth: args.queue_depth,
        max_request_bytes: args.max_request_bytes as usize,
        ..ServerConfig::default()
    };
    run(engine, config).context("the server stopped")
}
