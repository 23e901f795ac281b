//! `larder bench cache`: replays a route trace (from `--trace FILE`) against
//! every eviction policy the expert cache has and against Belady's optimum,
//! at a range of RAM budgets: hit rate and bytes read per token, and which
//! policy is the default. The replay requests what the engine requests: per
//! forward pass and MoE layer, the union of the pass's experts, in layer
//! order (`larder_store::cache::sim`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context};
use larder_router::Trace;
use larder_store::cache::online_bound::simulate_online_bound;
use larder_store::cache::sim::{simulate, simulate_belady, simulate_belady_shares, SimResult, Step};
use larder_store::cache::PolicyKind;
use serde::Serialize;
use serde_json::json;

/// Budgets as shares of the expert bank when none are given: 10% to 60%.
pub const DEFAULT_SHARES: [f64; 6] = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6];
/// The name of the optimum in results.
pub const BELADY: &str = "belady";
/// The optimum held to fixed per-layer shares of the budget (as the fair
/// policies hold theirs): what a policy with those shares could reach at best.
pub const BELADY_SHARES: &str = "belady_fair_shares";
/// What an online policy could reach at best on a trace whose routes depend
/// on the previous token only (`larder_store::cache::online_bound`).
pub const ONLINE_BOUND: &str = "online_bound";

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

/// Every policy at one budget.
#[derive(Debug, Clone, Serialize)]
pub struct Curve {
    pub budget_bytes: u64,
    /// `budget_bytes` over the bank's bytes.
    pub share: f64,
    pub policies: BTreeMap<String, SimResult>,
}

impl Curve {
    /// The hit rate of `policy` (0 when it was not replayed).
    pub fn hit(&self, policy: &str) -> f64 {
        self.policies.get(policy).map_or(0.0, |r| r.hit_rate)
    }
}

/// The engine's requests, pass by pass: what the simulator replays.
pub fn steps(trace: &Trace) -> Vec<Step> {
    let h = &trace.header;
    trace
        .passes()
        .into_iter()
        .map(|p| Step {
            tokens: p.tokens,
            accesses: p
                .layers
                .iter()
                .enumerate()
                .flat_map(|(i, experts)| experts.iter().map(move |&e| ((h.moe_layers[i], e), h.expert_bytes[i])))
                .collect(),
        })
        .collect()
}

/// Replays `trace` at each budget (bytes) against `policies` (names of
/// [`PolicyKind`], [`BELADY`], [`BELADY_SHARES`] or [`ONLINE_BOUND`]).
pub fn replay(trace: &Trace, budgets: &[u64], policies: &[&str]) -> anyhow::Result<Vec<Curve>> {
    let steps = steps(trace);
    let heat = trace
        .heat()
        .into_iter()
        .map(|((i, e), n)| ((trace.header.moe_layers[i], e), n))
        .collect();
    let bank = trace.bank_bytes();
    let layers = trace.header.moe_layers.len();
    let mut curves = Vec::new();
    for &budget in budgets {
        let mut results = BTreeMap::new();
        for &name in policies {
            let result = if name == BELADY {
                simulate_belady(&steps, budget)
            } else if name == BELADY_SHARES {
                simulate_belady_shares(&steps, budget, layers)
            } else if name == ONLINE_BOUND {
                simulate_online_bound(&steps, budget)
            } else {
                let kind: PolicyKind = name.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
                simulate(&steps, budget, kind.build(budget, layers, &heat).as_mut())
            };
            results.insert(name.to_string(), result);
        }
        curves.push(Curve {
            budget_bytes: budget,
            share: if bank == 0 { 0.0 } else { budget as f64 / bank as f64 },
            policies: results,
        });
    }
    Ok(curves)
}

/// [`replay`] at shares of the bank.
pub fn hit_curves(trace: &Trace, shares: &[f64], policies: &[&str]) -> anyhow::Result<Vec<Curve>> {
    let bank = trace.bank_bytes();
    let budgets: Vec<u64> = shares.iter().map(|s| (bank as f64 * s) as u64).collect();
    replay(trace, &budgets, policies)
}

/// `25%` (of `bank`) or a size (`512MiB`).
fn parse_budget(s: &str, bank: u64) -> anyhow::Result<u64> {
    let s = s.trim();
    if let Some(p) = s.strip_suffix('%') {
        let p: f64 = p
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("--budgets {s:?}: not a percentage (say 25%)"))?;
        if !(p > 0.0 && p <= 100.0) {
            bail!("--budgets {s:?}: a share of the bank must be above 0% and at most 100%");
        }
        return Ok((bank as f64 * p / 100.0) as u64);
    }
    larder_store::parse_size(s).map_err(|e| anyhow::anyhow!("--budgets {s:?}: {e} (give a size like 512MiB or a share like 25%)"))
}

pub fn run(a: CacheArgs) -> anyhow::Result<()> {
    let trace = Trace::read(&a.trace)?;
    let bank = trace.bank_bytes();
    let budgets: Vec<u64> = if a.budgets.is_empty() {
        DEFAULT_SHARES.iter().map(|s| (bank as f64 * s) as u64).collect()
    } else {
        a.budgets.iter().map(|b| parse_budget(b, bank)).collect::<anyhow::Result<_>>()?
    };
    let mut names: Vec<&str> = PolicyKind::ALL.iter().map(|k| k.name()).collect();
    names.extend([BELADY, BELADY_SHARES, ONLINE_BOUND]);
    let curves = replay(&trace, &budgets, &names).with_context(|| format!("replaying {}", a.trace.display()))?;
    let default = PolicyKind::default().name();
    if a.json {
        let budgets: Vec<_> = curves
            .iter()
            .map(|c| json!({"budget_bytes": c.budget_bytes, "share": c.share, "default_policy": default, "policies": c.policies}))
            .collect();
        return super::print_json(&json!({
            "trace": a.trace,
            "bank_bytes": bank,
            "tokens": trace.tokens.len(),
            "default_policy": default,
            "budgets": budgets,
        }));
    }
    println!(
        "{}: {} tokens, bank {}; hit rate (bytes read per token), default policy {default}",
        a.trace.display(),
        trace.tokens.len(),
        larder_engine::format_size(bank)
    );
    print!("{:>10} {:>6}", "budget", "share");
    for n in &names {
        print!(" {n:>20}");
    }
    println!();
    for c in &curves {
        print!("{:>10} {:>5.0}%", larder_engine::format_size(c.budget_bytes), 100.0 * c.share);
        for n in &names {
            let r = &c.policies[*n];
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
    Ok(())
}
