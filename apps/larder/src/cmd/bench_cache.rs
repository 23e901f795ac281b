//! `larder bench cache`: replays a route trace against every eviction policy
//! of the expert cache and against Belady's optimum at a range of RAM budgets
//! (`larder_bench::cache`); here its flags and its table.

use std::path::PathBuf;

use larder_bench::cache::{CacheOptions, CacheReport, BELADY, BELADY_SHARES, ONLINE_BOUND};

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
    print_table(&report);
    Ok(())
}

/// Hit rate and bytes per token of every policy at every budget, and how close the default comes to the bounds.
fn print_table(report: &CacheReport) {
    let (curves, names, default) = (&report.curves, &report.policies, report.default_policy);
    println!(
        "{}: {} tokens, bank {}; hit rate (bytes read per token), default policy {default}",
        report.trace.display(),
        report.tokens,
        larder_engine::format_size(report.bank_bytes)
    );
    print!("{:>10} {:>6}", "budget", "share");
    for n in names.iter() {
        print!(" {n:>20}");
    }
    println!();
    for c in curves {
        print!("{:>10} {:>5.0}%", larder_engine::format_size(c.budget_bytes), 100.0 * c.share);
        for n in names.iter() {
            let Some(r) = c.policies.get(*n) else { continue };
            let cell = format!(
                "{:.1}% ({})",
                100.0 * r.hit_rate,
                larder_engine::format_size(r.bytes_read_per_token as u64)
            );
            print!(" {cell:>20}");
        }
        println!();
    }
    for (bound, what) in [
        (BELADY, "Belady's hit rate"),
        (BELADY_SHARES, "Belady's in fixed per-layer shares"),
        (ONLINE_BOUND, "the online bound's"),
    ] {
        let worst = curves
            .iter()
            .filter(|c| c.hit(bound) > 0.0)
            .map(|c| c.hit(default) / c.hit(bound))
            .fold(f64::INFINITY, f64::min);
        if worst.is_finite() {
            println!("{default} reaches at least {:.0}% of {what} at every budget here", 100.0 * worst);
        }
    }
}
