//! `larder bench cache`: replays a route trace (from `--trace FILE`) against
//! every eviction policy the expert cache has and against Belady's optimum,
//! at a range of RAM budgets: hit rate and bytes read per token, and which
//! policy is the default. The replay requests what the engine requests: per
//! forward pass and MoE layer, the union of the pass's experts, in layer
//! order (`larder_engine::planner::trace_steps`, `larder_store::cache::sim`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use larder_router::Trace;
use larder_store::cache::online_bound::simulate_online_bound;
use larder_store::cache::sim::{simulate, simulate_belady, simulate_belady_shares, SimResult};
use larder_store::cache::PolicyKind;
use serde::Serialize;
use serde_json::{json, Value};

use crate::{BenchError, Result};

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

/// Replays `trace` at each budget (bytes) against `policies` (names of
/// [`PolicyKind`], [`BELADY`], [`BELADY_SHARES`] or [`ONLINE_BOUND`]).
pub fn replay(trace: &Trace, budgets: &[u64], policies: &[&str]) -> Result<Vec<Curve>> {
    let steps = larder_engine::planner::trace_steps(trace);
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
                let kind: PolicyKind = name.parse().map_err(|e| BenchError::Invalid(format!("{e}")))?;
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
pub fn hit_curves(trace: &Trace, shares: &[f64], policies: &[&str]) -> Result<Vec<Curve>> {
    let bank = trace.bank_bytes();
    let budgets: Vec<u64> = shares.iter().map(|s| (bank as f64 * s) as u64).collect();
    replay(trace, &budgets, policies)
}

/// `25%` (of `bank`) or a size (`512MiB`).
fn parse_budget(s: &str, bank: u64) -> Result<u64> {
    let s = s.trim();
    if let Some(p) = s.strip_suffix('%') {
        let p: f64 = p
            .trim()
            .parse()
            .map_err(|_| BenchError::Invalid(format!("--budgets {s:?}: not a percentage (say 25%)")))?;
        if !(p > 0.0 && p <= 100.0) {
            return Err(BenchError::Invalid(format!(
                "--budgets {s:?}: a share of the bank must be above 0% and at most 100%"
            )));
        }
        return Ok((bank as f64 * p / 100.0) as u64);
    }
    larder_store::parse_size(s)
        .map_err(|e| BenchError::Invalid(format!("--budgets {s:?}: {e} (give a size like 512MiB or a share like 25%)")))
}

/// What `bench cache` replays.
#[derive(Debug, Clone)]
pub struct CacheOptions {
    /// The trace to replay.
    pub trace: PathBuf,
    /// Budgets as written (`25%`, `512MiB`); empty: [`DEFAULT_SHARES`].
    pub budgets: Vec<String>,
}

/// What `bench cache` found: every policy's curve over the budgets.
#[derive(Debug, Clone)]
pub struct CacheReport {
    pub trace: PathBuf,
    pub bank_bytes: u64,
    pub tokens: usize,
    /// The cache's default policy.
    pub default_policy: &'static str,
    /// The policies and bounds replayed, in the order to show them.
    pub policies: Vec<&'static str>,
    pub curves: Vec<Curve>,
}

impl CacheReport {
    /// `{"trace", "bank_bytes", "tokens", "default_policy", "budgets": [...]}`.
    pub fn to_json(&self) -> Value {
        let default = self.default_policy;
        let budgets: Vec<_> = self
            .curves
            .iter()
            .map(|c| json!({"budget_bytes": c.budget_bytes, "share": c.share, "default_policy": default, "policies": c.policies}))
            .collect();
        json!({
            "trace": self.trace,
            "bank_bytes": self.bank_bytes,
            "tokens": self.tokens,
            "default_policy": default,
            "budgets": budgets,
        })
    }
}

/// Runs `bench cache`.
pub fn run(opts: &CacheOptions) -> Result<CacheReport> {
    let trace = Trace::read(&opts.trace)?;
    let bank = trace.bank_bytes();
    let budgets: Vec<u64> = if opts.budgets.is_empty() {
        DEFAULT_SHARES.iter().map(|s| (bank as f64 * s) as u64).collect()
    } else {
        opts.budgets.iter().map(|b| parse_budget(b, bank)).collect::<Result<_>>()?
    };
    let mut policies: Vec<&'static str> = PolicyKind::ALL.iter().map(|k| k.name()).collect();
    policies.extend([BELADY, BELADY_SHARES, ONLINE_BOUND]);
    let curves = replay(&trace, &budgets, &policies).map_err(|e| e.during(replaying(&opts.trace)))?;
    Ok(CacheReport {
        trace: opts.trace.clone(),
        bank_bytes: bank,
        tokens: trace.tokens.len(),
        default_policy: PolicyKind::default().name(),
        policies,
        curves,
    })
}

fn replaying(trace: &Path) -> String {
    format!("replaying {}", trace.display())
}
