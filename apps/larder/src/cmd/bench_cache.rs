//! `larder bench cache`: replays a route trace against every eviction policy
//! of the expert cache and against Belady's optimum at a range of RAM budgets
//! (`larder_bench::cache`; its table's text: `larder_tools::text`); here its flags.

use std::path::PathBuf;

use larder_bench::cache::CacheOptions;

/// Arguments of `larder bench cache`.
#[derive(clap::Args)]
pub struct CacheArgs {
    /// The trace to replay (JSON Lines from `larder run --trace FILE`).
    #[arg(long, value_name = "FILE")]
    trace: PathBuf,
    /// RAM budgets, comma-separated: shares of the expert bank (`25%`) or sizes (`512MiB`, `2GB`).
    /// Default: 10%,20%,30%,40%,50%,60%.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    budgets: Vec<String>,
    /// Print {"bank_bytes", "default_policy", "budgets": [{"budget_bytes", "share", "default_policy",
    /// "policies": {"NAME": {"hit_rate", "bytes_read_per_token", ...}, ..., "belady": {...}, "belady_fair_shares": {...}}}]}
    /// (`belady_fair_shares`: Belady's optimum with the budget split evenly over the MoE layers, as the default
    /// splits it: the best any policy with fixed fair shares can reach).
    #[arg(long)]
    json: bool,
}

pub fn run(a: CacheArgs) -> anyhow::Result<()> {
    let opts = CacheOptions {
        trace: a.trace,
        budgets: a.budgets,
    };
    let report = larder_bench::cache::run(&opts)?;
    if a.json {
        return super::print_json(&report.to_json());
    }
    print!("{}", larder_tools::text::cache_table(&report));
    Ok(())
}
