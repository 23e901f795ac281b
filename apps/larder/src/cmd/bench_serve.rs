//! `larder bench serve`: the real server, in-process on a loopback port,
//! driven over HTTP by concurrent streaming clients (`larder_bench::serve`:
//! what is measured and how; its table's text: `larder_tools::text`); here its flags.

use std::path::PathBuf;

use larder_bench::serve::ServeOptions;

use super::progress::Shown;

/// Arguments of `larder bench serve`.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Checkpoint folder or packed store.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    #[command(flatten)]
    experts: super::ExpertArgs,
    /// Concurrent client counts to measure, comma-separated, each 1..=256 (e.g. 1,2,4,8).
    #[arg(long, default_value = "1,2,4,8", value_name = "N,N,..")]
    clients: String,
    /// Tokens each client asks for (greedy), 1..=4096.
    #[arg(long, default_value_t = 64, value_parser = super::range(1, 4096))]
    max_new: usize,
    /// The server's --max-batch, 1..=256.
    #[arg(long, default_value_t = 8, value_parser = super::range(1, 256))]
    max_batch: usize,
    /// Rounds over the client counts, 1..=20, in alternating order; rows report medians.
    #[arg(long, default_value_t = 1, value_parser = super::range(1, 20))]
    repeats: usize,
    /// Print one JSON document: {"model", "max_new", "max_batch", "repeats", "runs": [{"clients",
    /// "aggregate_tok_s", "aggregate_tok_s_min", "aggregate_tok_s_max", "per_client_tok_s_median",
    /// "ttft_ms_median", "ttft_ms_max", "tokens", "wall_s" (both summed over rounds), "expert_bytes_per_token",
    /// "uniform_reads_per_route", "rounds": [...]}], "second_client": {"ttft_alone_ms", "ttft_beside_ms"}}.
    #[arg(long)]
    json: bool,
}

pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let opts = ServeOptions {
        model: args.model.display().to_string(),
        clients: args.clients.clone(),
        max_new: args.max_new,
        max_batch: args.max_batch,
        repeats: args.repeats,
    };
    let load = || super::load_engine_with(&args.model, &args.experts, args.json).map_err(Into::into);
    let doc = larder_bench::serve::run(&opts, &load, &Shown { json: args.json })?;
    if args.json {
        println!("{doc}");
    } else {
        print!("{}", larder_tools::text::serve_table(&doc));
    }
    Ok(())
}
