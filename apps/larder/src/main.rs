//! `larder`: the one command-line binary. Each subcommand lives in `cmd/`.

mod cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Run mixture-of-experts language models exactly as their authors shipped them.
///
/// MODEL is a Hugging Face checkpoint folder (config.json, *.safetensors,
/// tokenizer.json or Kimi's tiktoken.model, tokenizer_config.json,
/// generation_config.json) or a packed store made by `larder pack`. Routed
/// experts stay in RAM for a checkpoint folder unless --ram-budget or --io
/// asks to stream them (from the original safetensors, read by range); a
/// packed store always streams. Supported architectures: Qwen3-MoE,
/// Qwen2-MoE, Mixtral, DeepSeek-V3 / Kimi-K2, Kimi Linear, gpt-oss, Llama,
/// Mistral. Weights are used in the format they ship in (bf16, f16, f32, fp8
/// e4m3 with block scales, compressed-tensors INT4 and MXFP4, gpt-oss MXFP4);
/// activations are f32. DeepSeek/Kimi multi-token-prediction layers are not
/// loaded (they stay in the checkpoint).
///
/// Logs go to stderr (set LARDER_LOG=debug for more; the HTTP client and TLS
/// log at most at debug level, where headers such as Authorization are left
/// out, so HF_TOKEN never reaches a log); with --json, stdout holds exactly
/// one JSON document. LARDER_KERNEL=scalar|avx2|avx512|neon
/// forces a CPU kernel path (default: the best verified one this CPU has); a
/// path this CPU lacks, or any other value, is an error.
///
/// Every count, size and thread flag has a range (shown in each command's
/// --help); a value outside it is refused with an error naming the flag.
#[derive(Parser)]
#[command(name = "larder", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a real-text mixture-of-experts model end to end: SmolLM2-135M-Instruct upcycled into a
    /// Mixtral-layout MoE, packed, and streamed through a RAM cache smaller than its experts.
    Demo(cmd::demo::Args),
    /// Print the logits of every position of a token sequence (no sampling, no cache reuse).
    Forward(cmd::forward::Args),
    /// Generate text or token ids from a prompt, streaming as it goes.
    Run(cmd::run::Args),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(cmd::serve::Args),
    /// Pack a checkpoint's routed experts into a store: contiguous aligned records over one or more drives.
    Pack(cmd::pack::Args),
    /// Pull a remote checkpoint (hub repo, URL or folder) straight into a store, resumable, no second copy.
    Pull(cmd::pull::Args),
    /// Prove a packed store is exactly the checkpoint it was packed from, and that it loads.
    Verify(cmd::verify::Args),
    /// Write a synthetic checkpoint (real layout, random weights, any size), or upcycle a dense one
    /// into an MoE (--from-dense).
    Synth(cmd::synth::Args),
    /// What this machine is and what it can run: CPU, RAM, drives, and a plan for --model.
    Doctor(cmd::doctor::Args),
    /// Measure speed against this machine's physical limits.
    #[command(subcommand)]
    Bench(cmd::bench::Bench),
    /// Forecast decode tok/s, time to first token, hit rate and the binding resource of a model on a
    /// machine (given RAM, drives, cores), from its shapes and a route trace or routing preset.
    Plan(cmd::plan::Args),
    /// Read a packed store's hottest experts (its saved heat) into the RAM cache and report the time.
    Warm(cmd::warm::Args),
    /// Copy a packed store's hottest experts onto its fastest drive; reads go to the copy that finishes first.
    Mirror(cmd::mirror::Args),
    /// Read route traces recorded with `--trace FILE`.
    #[command(subcommand)]
    Trace(cmd::trace::TraceCmd),
}

/// Crates whose trace level dumps what goes over the wire, headers and
/// all (ureq-proto hex-dumps every request it sends, `Authorization:
/// Bearer $HF_TOKEN` included; ureq prints redirect URLs, which may be
/// signed): whatever `LARDER_LOG` asks, they log at most at debug level,
/// where ureq leaves sensitive headers out.
const WIRE_DUMP_TARGETS: [&str; 3] = ["ureq", "ureq_proto", "rustls"];

/// Every target at any level, but [`WIRE_DUMP_TARGETS`] at most at debug.
fn no_wire_dumps() -> tracing_subscriber::filter::Targets {
    use tracing_subscriber::filter::LevelFilter;
    tracing_subscriber::filter::Targets::new()
        .with_default(LevelFilter::TRACE)
        .with_targets(WIRE_DUMP_TARGETS.map(|target| (target, LevelFilter::DEBUG)))
}

/// Logging to stderr as `LARDER_LOG` says (an `EnvFilter`; default
/// `warn`), with [`WIRE_DUMP_TARGETS`] capped at debug.
fn init_logging() {
    use tracing_subscriber::filter::FilterExt;
    use tracing_subscriber::prelude::*;
    let asked = tracing_subscriber::EnvFilter::try_from_env("LARDER_LOG").unwrap_or_else(|_| "warn".into());
    let filter = asked.and(no_wire_dumps());
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(filter))
        .init();
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", cmd::error_text(&e));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    // A LARDER_KERNEL this CPU cannot honour stops here, before any work.
    larder_tensor::kernels::kernel_from_env()?;
    match cli.command {
        Command::Demo(a) => cmd::demo::run(a),
        Command::Forward(a) => cmd::forward::run(a),
        Command::Run(a) => cmd::run::run(a),
        Command::Serve(a) => cmd::serve::run_cmd(a),
        Command::Pack(a) => cmd::pack::run(a),
        Command::Pull(a) => cmd::pull::run(a),
        Command::Verify(a) => cmd::verify::run(a),
        Command::Synth(a) => cmd::synth::run(a),
        Command::Doctor(a) => cmd::doctor::run(a),
        Command::Bench(b) => cmd::bench::run(b),
        Command::Trace(t) => cmd::trace::run(t),
        Command::Plan(a) => cmd::plan::run(a),
        Command::Warm(a) => cmd::warm::run(a),
        Command::Mirror(a) => cmd::mirror::run(a),
    }
}

#[cfg(test)]
mod tests {
    use tracing::Level;

    #[test]
    fn wire_dumps_are_capped_at_debug_and_everything_else_passes() {
        let filter = super::no_wire_dumps();
        for target in ["ureq_proto::util", "ureq::run", "rustls::client::hs"] {
            assert!(!filter.would_enable(target, &Level::TRACE), "{target}");
            assert!(filter.would_enable(target, &Level::DEBUG), "{target}");
        }
        for target in ["larder_store::remote::client", "larder_serve::http", "larder"] {
            assert!(filter.would_enable(target, &Level::TRACE), "{target}");
        }
    }
}
