//! `larder bench run MANIFEST`: a named scenario from `bench/manifests/`.
//!
//! Builds or reuses the model ([`model`]), measures the RAM limit before and
//! after, runs `larder bench decode` for every (round, prompt length, arm),
//! interleaved (A B C A B C), each in a fresh process after the page cache
//! is dropped (when permitted) and inside its arm's cgroup memory limit
//! (when set and permitted; [`arm`]), checks every arm's output ids against
//! the oracle arm's, and writes results.json, summary.md ([`summary`]) and
//! SVG charts ([`charts`]).

pub mod arm;
pub mod charts;
pub mod manifest;
pub mod model;
pub mod summary;

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use self::manifest::{Budget, Manifest};
use self::summary::{git_commit, machine, utc_date};
use crate::{BenchError, Observer, Result};

/// Version of results.json's layout.
pub const SCHEMA: u64 = 1;

/// What `bench run` runs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The scenario manifest (TOML).
    pub manifest: PathBuf,
    /// Output folder (None: bench/results/DATE-SCENARIO).
    pub out: Option<PathBuf>,
    /// The `larder` executable each arm runs as (`bench decode`), and that writes and packs models.
    pub exe: PathBuf,
}

/// What a `bench run` wrote.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// The scenario's name.
    pub scenario: String,
    /// The output folder.
    pub out: PathBuf,
    /// results.json's document.
    pub doc: Value,
    /// Runs that failed or whose ids differ from the oracle arm's, one line each.
    pub failures: Vec<String>,
}

impl RunReport {
    /// Why the run as a whole failed (None: every run matched the oracle).
    pub fn failure(&self) -> Option<String> {
        (!self.failures.is_empty()).then(|| {
            format!(
                "bench run {}: {} failure(s) (results written to {}): {}",
                self.scenario,
                self.failures.len(),
                self.out.display(),
                self.failures.join("; ")
            )
        })
    }
}

/// The model, its expert bank and each arm's budget in bytes.
struct Prepared {
    model: PathBuf,
    bank: u64,
    budgets: Vec<u64>,
}

/// Runs every (round, prompt, arm) of the manifest and writes the results.
pub fn run(opts: &RunOptions, observer: &dyn Observer) -> Result<RunReport> {
    let m = Manifest::load(&opts.manifest)?;
    let manifest_name = opts.manifest.display().to_string();
    let prepared = prepare(&m, &opts.exe, &manifest_name, observer)?;
    let out = opts
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("bench/results").join(format!("{}-{}", utc_date(), m.scenario.name)));
    let traces = out.join("traces");
    std::fs::create_dir_all(&traces).map_err(|e| BenchError::io(format!("cannot create {}", traces.display()), e))?;

    observer.note(&format!("[larder] bench run {}: measuring RAM read bandwidth ...", m.scenario.name));
    let ram_before = larder_tensor::bench::ram_read_gbps(256 << 20);
    let mut record = Record::default();
    let total = m.scenario.rounds * m.workload.prompt_tokens.len() * m.arms.len();
    for round in 1..=m.scenario.rounds {
        for &prompt in &m.workload.prompt_tokens {
            let group = Group { round, prompt, total };
            record.run_group(&m, &opts.exe, &prepared, &group, &traces, observer);
        }
    }
    let ram_after = larder_tensor::bench::ram_read_gbps(256 << 20);
    let doc = results(opts, &m, &prepared, &record, [ram_before, ram_after]);
    write_atomic(&out.join("results.json"), &serde_json::to_vec_pretty(&doc)?)?;
    write_atomic(&out.join("summary.md"), summary::summary(&doc).as_bytes())?;
    charts::write_all(&doc, &out)?;
    observer.note(&format!(
        "[larder] bench run {}: {} runs, results in {}",
        m.scenario.name,
        doc["runs"].as_array().map_or(0, Vec::len),
        out.display()
    ));
    Ok(RunReport {
        scenario: m.scenario.name.clone(),
        out,
        doc,
        failures: record.failures,
    })
}

/// The model to run, its expert bank, and every arm's budget (each within the RAM available).
fn prepare(m: &Manifest, exe: &Path, manifest_name: &str, observer: &dyn Observer) -> Result<Prepared> {
    let model = model::prepare_model(m, exe, manifest_name, observer)?;
    let bank = larder_engine::sizing::expert_index(&model)
        .map_err(|e| BenchError::from(e).during(format!("manifest {manifest_name}: cannot read the experts of {}", model.display())))?
        .total_bytes();
    let available = larder_engine::mem_available();
    let mut budgets = Vec::new();
    for a in &m.arms {
        let b = Budget::parse(&a.ram_budget).map_err(BenchError::Invalid)?.bytes(bank);
        if let Some(avail) = available {
            if b > avail {
                return Err(BenchError::Invalid(format!(
                    "manifest {manifest_name}: arm {:?} ram_budget = {:?} ({}) is larger than the RAM available ({})",
                    a.name,
                    a.ram_budget,
                    larder_store::format_size(b),
                    larder_store::format_size(avail)
                )));
            }
        }
        budgets.push(b);
    }
    Ok(Prepared { model, bank, budgets })
}

/// One (round, prompt length) group of runs, one per arm; `total` runs in all.
struct Group {
    round: usize,
    prompt: usize,
    total: usize,
}

/// The runs so far and what failed.
#[derive(Default)]
struct Record {
    runs: Vec<Value>,
    failures: Vec<String>,
}

impl Record {
    /// Runs every arm once for `g`, then checks each one's ids against the oracle arm's.
    fn run_group(&mut self, m: &Manifest, exe: &Path, p: &Prepared, g: &Group, traces: &Path, observer: &dyn Observer) {
        let oracle = m.oracle();
        let (round, prompt) = (g.round, g.prompt);
        let mut oracle_hash: Option<String> = None;
        // The oracle arm first within each group would change the interleave; compare afterwards instead.
        let first = self.runs.len();
        for (i, arm) in m.arms.iter().enumerate() {
            observer.note(&format!(
                "[larder] run {}/{}: round {round}, prompt {prompt}, arm {}",
                self.runs.len() + 1,
                g.total,
                arm.name
            ));
            let caches_dropped = arm::drop_caches();
            let trace = traces.join(format!("{}-p{prompt}-r{round}.trace.json", arm.name));
            let decode = arm::Decode {
                model: &p.model,
                budget: p.budgets[i],
                prompt,
                trace: &trace,
            };
            let r = arm::run_arm(exe, arm, &decode, &m.workload, observer);
            let mut rec = json!({
                "arm": arm.name, "round": round, "prompt_tokens": prompt, "io": arm.io,
                "prefetch": arm.prefetch, "ram_budget": arm.ram_budget, "ram_budget_bytes": p.budgets[i],
                "budget_share": if p.bank > 0 { p.budgets[i] as f64 / p.bank as f64 } else { 0.0 },
                "memory_limit": arm.memory_limit, "caches_dropped": caches_dropped, "oracle": i == oracle,
            });
            match r {
                Ok((decode, applied)) => {
                    if i == oracle {
                        oracle_hash = decode["ids_hash"].as_str().map(str::to_string);
                    }
                    rec["memory_limit_applied"] = json!(applied);
                    rec["decode"] = decode;
                }
                Err(e) => {
                    let msg = format!("arm {} round {round} prompt {prompt}: {e}", arm.name);
                    observer.note(&format!("[larder] {msg}"));
                    self.failures.push(msg.clone());
                    rec["error"] = json!(msg);
                }
            }
            self.runs.push(rec);
        }
        for rec in &mut self.runs[first..] {
            let hash = rec["decode"]["ids_hash"].as_str().map(str::to_string);
            let ok = hash.is_some() && hash == oracle_hash;
            rec["ids_match"] = json!(ok);
            if !ok && rec.get("error").is_none() {
                self.failures.push(format!(
                    "arm {} round {round} prompt {prompt}: output ids differ from the oracle arm {:?}",
                    rec["arm"].as_str().unwrap_or(""),
                    m.arms[oracle].name
                ));
            }
        }
    }
}

/// results.json's document.
fn results(opts: &RunOptions, m: &Manifest, p: &Prepared, record: &Record, [ram_before, ram_after]: [f64; 2]) -> Value {
    let runs = &record.runs;
    let drive = |key: &str, pick_last: bool| {
        let mut it = runs.iter().filter_map(|r| r["decode"][key]["gbps"].as_f64());
        if pick_last {
            it.next_back()
        } else {
            it.next()
        }
    };
    json!({
        "schema": SCHEMA,
        "scenario": {"name": m.scenario.name, "description": m.scenario.description, "rounds": m.scenario.rounds,
                     "manifest": opts.manifest, "manifest_text": std::fs::read_to_string(&opts.manifest).unwrap_or_default()},
        "machine": machine(),
        "commit": git_commit(),
        "model": {"dir": p.model, "expert_bank_bytes": p.bank, "synth": m.model.synth.as_ref().map(model::synth_json)},
        "workload": {"prompt_tokens": m.workload.prompt_tokens, "new_tokens": m.workload.new_tokens,
                     "seed": m.workload.seed, "limit_records": m.workload.limit_records},
        "oracle_arm": m.arms[m.oracle()].name,
        "limits": {
            "ram_gbps_before": ram_before, "ram_gbps_after": ram_after,
            "drive_gbps_before": drive("limit_before", false), "drive_gbps_after": drive("limit_after", true),
        },
        "all_ids_match": runs.iter().all(|r| r["ids_match"] == true),
        "failures": record.failures.clone(),
        "runs": runs,
    })
}

/// Writes `path`, a file in the output folder this command owns, through a
/// new temporary file and a rename; anything there but a regular file is
/// refused (`larder_engine::OutputFile`).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut out = larder_engine::OutputFile::in_owned_folder("--out", path)?;
    Ok(out.write_with(|w| w.write_all(bytes))?)
}
