//! `larder pull`: a packed store straight from a Hugging Face repo, a base
//! URL in the hub layout or a folder, streaming each shard once into the
//! store (no copy of the checkpoint on disk), with a progress bar.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use larder_store::pack::DriveSpec;
use larder_store::pull::{pull, PullOptions};
use larder_store::remote::{open_source, CheckpointSource, HubEnv, RemoteOptions};
use serde_json::json;

use super::progress::{Progress, Unit};

/// Folder in --out holding the fetched config, tokenizer and index files
/// until the store is complete.
const STAGING: &str = larder_engine::pull::STAGING;

/// Arguments of `larder pull`.
#[derive(clap::Args)]
#[command(after_help = "SOURCE is a Hugging Face repo id (`org/name` or `org/name@revision`; the endpoint \
comes from HF_ENDPOINT, default https://huggingface.co, and a token from HF_TOKEN), an http(s):// base URL \
serving the hub's `resolve` layout (`BASE/resolve/main/config.json`, \
`BASE/resolve/main/model.safetensors.index.json`, ...; `BASE@REV` for another revision), or a local or mounted \
folder.\n\n\
The config and tokenizer files are fetched first, then every shard's safetensors header by range; the \
checkpoint is checked as `larder run` would load it before any weights move. Each shard then streams once, in \
order (in 8 MiB ranges, --ranges in flight and the next ones requested while these are written), straight into the store (expert records into the layer files, everything else into the spine): there \
is never a second copy of the checkpoint on disk. Each shard is hashed as it streams and checked against the \
sha256 the hub publishes for it (its LFS id). The store is the one `larder pack` makes of the same checkpoint, \
record for record; `larder verify` checks it.\n\n\
Resumable: progress is saved in STORE/pull-state.json every 2 s (after syncing what it counts) and on any failure; run the \
same command again and only what is missing is fetched. manifest.json is written last, so an unfinished pull \
is never mistaken for a store.\n\n\
Examples:\n  larder pull moonshotai/Kimi-Linear-48B-A3B-Instruct --out /fast/kimi-linear\n  \
larder pull org/model@v1.0 --out /fast/m --drive /mnt/ssd0 --drive /mnt/ssd1:3.5 --jobs 8\n  \
larder pull https://mirror.example/models/k3mini --out ./k3mini.store --json")]
pub struct Args {
    /// Where the checkpoint is: `org/name[@revision]`, an http(s):// base URL, or a folder.
    #[arg(value_name = "SOURCE")]
    source: String,
    /// Store folder to create (manifest, spine, config and tokenizer files; layer files unless --drive is given).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// A drive directory for layer files, optionally with its read bandwidth (DIR:GBps). Repeat for several drives.
    #[arg(long = "drive", value_name = "DIR[:GBps]", value_parser = DriveSpec::parse)]
    drives: Vec<DriveSpec>,
    /// Shards streamed at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    jobs: u64,
    /// Range requests (8 MiB each) in flight per shard; each shard is still hashed and written in order.
    /// --jobs x --ranges is at most 64.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    ranges: u64,
    /// Seconds to wait for a response or for the next bytes of one before retrying.
    #[arg(long, default_value_t = 30, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    timeout: u64,
    /// Print progress as JSON lines on stderr and one JSON report on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let env = HubEnv::from_process();
    let source = CheckpointSource::parse(&args.source, &env)?;
    let options = RemoteOptions {
        read_timeout: Duration::from_secs(args.timeout),
        ..RemoteOptions::default()
    };
    let remote = open_source(&source, &env, &options)?;
    let staging = args.out.join(STAGING);
    let progress = Progress::new("pull", 0, Unit::Bytes, args.json);
    progress.set_message("headers");
    let described =
        larder_engine::pull::describe_remote(remote.as_ref(), &staging).with_context(|| format!("cannot pull {}", args.source))?;
    let opts = PullOptions {
        jobs: args.jobs as usize,
        ranges: args.ranges as usize,
        ..PullOptions::default()
    };
    let report = pull(
        remote.as_ref(),
        &described.files,
        &described.source,
        &args.out,
        &args.drives,
        opts,
        &larder_tools::progress::pull_events(&progress),
    )
    .with_context(|| format!("pull into {} failed", args.out.display()))?;
    progress.finish();
    std::fs::remove_dir_all(&staging).with_context(|| format!("removing {}", staging.display()))?;
    let moved = remote.transferred();
    if args.json {
        return super::print_json(&json!({
            "report": report,
            "skipped_bytes": described.skipped_bytes(),
            "skipped": described.skipped.iter().map(|(n, b)| json!({"name": n, "bytes": b})).collect::<Vec<_>>(),
            "requests": moved.requests,
            "retries": moved.retries,
            "bytes_received": moved.bytes,
        }));
    }
    eprintln!(
        "[larder] pulled {} experts of {} layers and the spine ({} from {} files, {} fetched by this run, \
         {} files sha256-checked) into {} in {:.1}s",
        report.experts,
        report.layers,
        larder_store::format_size(report.total_bytes),
        report.files,
        larder_store::format_size(report.fetched_bytes),
        report.verified_files,
        report.out.display(),
        report.seconds
    );
    if !described.skipped.is_empty() {
        eprintln!(
            "[larder] skipped {} never read by the text model ({} vision tensors or vision-only shards; those shards were not fetched)",
            larder_store::format_size(described.skipped_bytes()),
            described.skipped.len()
        );
    }
    Ok(())
}
