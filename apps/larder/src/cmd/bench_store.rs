//! `larder bench io` and `larder bench decode`: streaming speed against the
//! drive limit measured in the same run (docs/design.md §5); the measuring is
//! `larder_bench::store` and `larder_bench::decode`.

use std::path::{Path, PathBuf};

use larder_bench::decode::{DecodeOptions, DECODE_REPORT};
use larder_bench::store::{IoBenchOptions, IO_REPORT};
use larder_store::io::IoKind;

use super::progress::Shown;

/// Arguments of `larder bench io`.
#[derive(clap::Args)]
#[command(
    after_help = "Reads random expert records (never the same one twice, page cache dropped first) in \
batches of --batch, like one layer step of decoding, through each backend.\n\nExample:\n  larder bench io --store ./k3mini.store --json"
)]
pub struct IoArgs {
    /// Packed store or checkpoint folder.
    #[arg(long, value_name = "DIR")]
    store: PathBuf,
    /// Backends to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "uring,pread,mmap")]
    io: Vec<String>,
    /// Records per arm, 1 to 1048576 (at most every record of the store is read).
    #[arg(long, default_value_t = 96, value_parser = super::range(1, super::MAX_COUNT))]
    records: usize,
    /// Records requested together (one layer step: top-k), 1 to 1024.
    #[arg(long, default_value_t = 8, value_parser = super::range(1, super::MAX_BATCH))]
    batch: usize,
    /// Reads in flight, 1 to 256 (pread threads; io_uring uses 4 reads per unit).
    #[arg(long, default_value_t = 8, value_parser = super::range(1, larder_store::io::MAX_IO_DEPTH))]
    depth: usize,
    /// Read through the page cache instead of O_DIRECT.
    #[arg(long)]
    no_direct: bool,
    /// Print one JSON document on stdout.
    #[arg(long)]
    json: bool,
    /// Also write the JSON document to this file (not a file of --store; an existing report of `bench io`
    /// only with --overwrite).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    #[command(flatten)]
    output: super::OverwriteArg,
}

/// Arguments of `larder bench decode`.
#[derive(clap::Args)]
#[command(
    after_help = "Measures the drive limit with the same backend first (random expert records in batches \
of top-k), then decodes a fixed seeded prompt from a cold cache and reports prefill tok/s, time to first \
token, steady decode tok/s, expert bytes per token, hit rate, I/O-wait share and the ratio of decode speed to \
the I/O bound (limit_gbps / miss bytes per token).\n\nExample:\n  larder bench decode --model ./k3mini.store --ram-budget 2GiB --json"
)]
pub struct DecodeArgs {
    /// Packed store or checkpoint folder.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    #[command(flatten)]
    experts: super::ExpertArgs,
    /// Prompt length (seeded random ids), 1 to 1048576 (and within the model's context).
    #[arg(long, default_value_t = 16, value_parser = super::range(1, super::MAX_COUNT))]
    prompt_tokens: usize,
    /// New tokens to decode (greedy, EOS ignored), 2 to 1048576.
    #[arg(long, default_value_t = 32, value_parser = super::range(2, super::MAX_COUNT))]
    new: usize,
    /// Seed of the prompt.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Records read to measure the drive limit, 1 to 1048576.
    #[arg(long, default_value_t = 96, value_parser = super::range(1, super::MAX_COUNT))]
    limit_records: usize,
    /// Print one JSON document on stdout.
    #[arg(long)]
    json: bool,
    /// Also write the JSON document to this file (not a file of --model; an existing report of `bench decode`
    /// only with --overwrite).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Record the run's route trace (as `larder run --trace`) to FILE, for `larder bench cache` and `larder plan`
    /// (not a file of --model; an existing trace only with --overwrite).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    #[command(flatten)]
    output: super::OverwriteArg,
}

pub fn io(args: IoArgs) -> anyhow::Result<()> {
    let inputs = larder_engine::RunInputs::new().model("--store", &args.store);
    let mut out = super::check_report_out(args.out.as_deref(), IO_REPORT, args.output, &inputs)?;
    let index = super::about(
        larder_engine::sizing::expert_index(&args.store),
        "cannot open the store",
        &args.store,
    )?;
    let opts = IoBenchOptions {
        store: args.store.clone(),
        backends: args.io,
        records: args.records,
        batch: args.batch,
        depth: args.depth,
        no_direct: args.no_direct,
    };
    let doc = larder_bench::store::io(&index, &opts, &Shown { json: args.json })?.to_json();
    super::save_json(out.as_mut(), &doc)?;
    if args.json {
        super::print_json(&doc)?;
    }
    Ok(())
}

pub fn decode(args: DecodeArgs) -> anyhow::Result<()> {
    let mut inputs = super::model_inputs(&args.model, &args.experts);
    let mut trace_out = match &args.trace {
        Some(path) => {
            let out = super::trace::check_output(path, args.output.overwrite, &inputs)?;
            inputs = inputs.other_output("--trace", path);
            Some(out)
        }
        None => None,
    };
    let mut out = super::check_report_out(args.out.as_deref(), DECODE_REPORT, args.output, &inputs)?;
    let mut experts = args.experts.clone();
    if experts.ram_budget.is_none() && experts.io.is_none() {
        // bench decode always streams.
        experts.io = Some(IoKind::best());
    }
    let load = experts.load_options(&args.model);
    super::check_budget(&args.model, &load)?;
    let opts = DecodeOptions {
        model: args.model.clone(),
        load,
        prefill: experts.prefill(),
        prompt_tokens: args.prompt_tokens,
        new: args.new,
        seed: args.seed,
        limit_records: args.limit_records,
        trace: trace_out.is_some(),
    };
    let loader = |model: &Path, load: &larder_engine::LoadOptions| super::load_with_options(model, load, args.json).map_err(Into::into);
    let report = larder_bench::decode::decode(&opts, &loader, &Shown { json: args.json })?;
    if let (Some(trace_out), Some(trace)) = (&mut trace_out, &report.trace) {
        trace_out.write_with(|w| trace.write_lines(w))?;
    }
    let doc = report.doc;
    super::save_json(out.as_mut(), &doc)?;
    if args.json {
        return super::print_json(&doc);
    }
    eprint!("{}", larder_tools::text::decode_lines(&doc));
    Ok(())
}
