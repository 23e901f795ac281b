//! `larder bench run MANIFEST`: a named scenario from `bench/manifests/`.
//!
//! Builds or reuses the model, measures the RAM limit before and after,
//! runs `larder bench decode` for every (round, prompt length, arm),
//! interleaved (A B C A B C), each in a fresh process after the page cache
//! is dropped (when permitted) and inside its arm's cgroup memory limit
//! (when set and permitted), checks every arm's output ids against the
//! oracle arm's, and writes results.json, summary.md and SVG charts.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use super::bench_manifest::{mem_total, Arm, Budget, Manifest, SynthModel};

/// Version of results.json's layout.
pub const SCHEMA: u64 = 1;

/// Arguments of `larder bench run`.
#[derive(clap::Args)]
#[command(after_help = "Manifest keys and outputs: docs/bench.md.\n\nExample:\n  \
larder bench run bench/manifests/k3mini-routing.toml")]
pub struct RunArgs {
    /// Scenario manifest (TOML), e.g. bench/manifests/smoke.toml.
    manifest: PathBuf,
    /// Output folder (default: bench/results/DATE-SCENARIO).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Print results.json on stdout as well.
    #[arg(long)]
    json: bool,
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let m = Manifest::load(&args.manifest)?;
    let exe = std::env::current_exe().context("cannot find the larder executable")?;
    let manifest_name = args.manifest.display().to_string();
    let model = prepare_model(&m, &exe, &manifest_name)?;
    let bank = super::bench_store::index_of(&model)
        .with_context(|| format!("manifest {manifest_name}: cannot read the experts of {}", model.display()))?
        .total_bytes();
    let available = larder_engine::prefill::mem_available();
    let mut budgets = Vec::new();
    for a in &m.arms {
        let b = Budget::parse(&a.ram_budget).map_err(anyhow::Error::msg)?.bytes(bank);
        if let Some(avail) = available {
            if b > avail {
                bail!(
                    "manifest {manifest_name}: arm {:?} ram_budget = {:?} ({}) is larger than the RAM available ({})",
                    a.name,
                    a.ram_budget,
                    larder_store::format_size(b),
                    larder_store::format_size(avail)
                );
            }
        }
        budgets.push(b);
    }
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("bench/results").join(format!("{}-{}", utc_date(), m.scenario.name)));
    let traces = out.join("traces");
    std::fs::create_dir_all(&traces).with_context(|| format!("cannot create {}", traces.display()))?;

    eprintln!("[larder] bench run {}: measuring RAM read bandwidth ...", m.scenario.name);
    let ram_before = larder_tensor::bench::ram_read_gbps(256 << 20);
    let oracle = m.oracle();
    let mut runs: Vec<Value> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    let total = m.scenario.rounds * m.workload.prompt_tokens.len() * m.arms.len();
    for round in 1..=m.scenario.rounds {
        for &prompt in &m.workload.prompt_tokens {
            let mut oracle_hash: Option<String> = None;
            // The oracle arm first within each group would change the interleave; compare afterwards instead.
            let first = runs.len();
            for (i, arm) in m.arms.iter().enumerate() {
                eprintln!(
                    "[larder] run {}/{total}: round {round}, prompt {prompt}, arm {}",
                    runs.len() + 1,
                    arm.name
                );
                let caches_dropped = drop_caches();
                let trace = traces.join(format!("{}-p{prompt}-r{round}.trace.json", arm.name));
                let r = run_arm(&exe, &model, arm, budgets[i], prompt, &m, &trace);
                let mut rec = json!({
                    "arm": arm.name, "round": round, "prompt_tokens": prompt, "io": arm.io,
                    "prefetch": arm.prefetch, "ram_budget": arm.ram_budget, "ram_budget_bytes": budgets[i],
                    "budget_share": if bank > 0 { budgets[i] as f64 / bank as f64 } else { 0.0 },
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
                        let msg = format!("arm {} round {round} prompt {prompt}: {}", arm.name, super::error_text(&e));
                        eprintln!("[larder] {msg}");
                        failures.push(msg.clone());
                        rec["error"] = json!(msg);
                    }
                }
                runs.push(rec);
            }
            for rec in &mut runs[first..] {
                let hash = rec["decode"]["ids_hash"].as_str().map(str::to_string);
                let ok = hash.is_some() && hash == oracle_hash;
                rec["ids_match"] = json!(ok);
                if !ok && rec.get("error").is_none() {
                    failures.push(format!(
                        "arm {} round {round} prompt {prompt}: output ids differ from the oracle arm {:?}",
                        rec["arm"].as_str().unwrap_or(""),
                        m.arms[oracle].name
                    ));
                }
            }
        }
    }
    let ram_after = larder_tensor::bench::ram_read_gbps(256 << 20);
    let drive = |key: &str, pick_last: bool| {
        let mut it = runs.iter().filter_map(|r| r["decode"][key]["gbps"].as_f64());
        if pick_last {
            it.next_back()
        } else {
            it.next()
        }
    };
    let doc = json!({
        "schema": SCHEMA,
        "scenario": {"name": m.scenario.name, "description": m.scenario.description, "rounds": m.scenario.rounds,
                     "manifest": args.manifest, "manifest_text": std::fs::read_to_string(&args.manifest).unwrap_or_default()},
        "machine": machine(),
        "commit": git_commit(),
        "model": {"dir": model, "expert_bank_bytes": bank, "synth": m.model.synth.as_ref().map(synth_json)},
        "workload": {"prompt_tokens": m.workload.prompt_tokens, "new_tokens": m.workload.new_tokens,
                     "seed": m.workload.seed, "limit_records": m.workload.limit_records},
        "oracle_arm": m.arms[oracle].name,
        "limits": {
            "ram_gbps_before": ram_before, "ram_gbps_after": ram_after,
            "drive_gbps_before": drive("limit_before", false), "drive_gbps_after": drive("limit_after", true),
        },
        "all_ids_match": runs.iter().all(|r| r["ids_match"] == true),
        "failures": failures.clone(),
        "runs": runs,
    });
    write_atomic(&out.join("results.json"), &serde_json::to_vec_pretty(&doc)?)?;
    write_atomic(&out.join("summary.md"), summary(&doc).as_bytes())?;
    super::bench_charts::write_all(&doc, &out)?;
    eprintln!(
        "[larder] bench run {}: {} runs, results in {}",
        m.scenario.name,
        doc["runs"].as_array().map_or(0, Vec::len),
        out.display()
    );
    if args.json {
        super::print_json(&doc)?;
    }
    if !failures.is_empty() {
        bail!(
            "bench run {}: {} failure(s) (results written to {}): {}",
            m.scenario.name,
            failures.len(),
            out.display(),
            failures.join("; ")
        );
    }
    Ok(())
}

/// The model folder to run: the manifest's path, or the synthetic model
/// (written with `larder synth` unless the folder holds the same spec),
/// packed into `<dir>.store` with `pack = true`.
fn prepare_model(m: &Manifest, exe: &Path, manifest: &str) -> anyhow::Result<PathBuf> {
    let dir = match (&m.model.path, &m.model.synth) {
        (Some(p), _) => p.clone(),
        (None, Some(s)) => {
            build_synth(s, exe, manifest)?;
            s.out.clone()
        }
        (None, None) => bail!("manifest {manifest}: [model]: give model.path or a [model.synth] table"),
    };
    if !m.model.pack || larder_store::Manifest::is_store(&dir) {
        return Ok(dir);
    }
    let mut store = dir.clone().into_os_string();
    store.push(".store");
    let store = PathBuf::from(store);
    if larder_store::Manifest::is_store(&store) {
        eprintln!("[larder] reusing the packed store {}", store.display());
        return Ok(store);
    }
    eprintln!("[larder] packing {} into {} ...", dir.display(), store.display());
    let out = Command::new(exe)
        .args(["pack", "--model"])
        .arg(&dir)
        .arg("--out")
        .arg(&store)
        .arg("--json")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .context("cannot run larder pack")?;
    if !out.status.success() {
        bail!(
            "manifest {manifest}: model.pack: larder pack failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(store)
}

fn synth_json(s: &SynthModel) -> Value {
    json!({"arch": s.arch, "preset": s.preset, "experts_format": s.experts_format, "experts_gib": s.experts_gib,
           "routing": s.routing, "seed": s.seed, "out": s.out})
}

/// Writes the synthetic model unless `s.out` already holds one of the same
/// spec (config.json's larder_synth and bench-synth.json say so).
fn build_synth(s: &SynthModel, exe: &Path, manifest: &str) -> anyhow::Result<()> {
    let stamp = s.out.join("bench-synth.json");
    let want = synth_json(s);
    if s.out.join("config.json").is_file() {
        let cfg: Value = std::fs::read(s.out.join("config.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null);
        let have: Value = std::fs::read(&stamp)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null);
        let ls = &cfg["larder_synth"];
        if have == want && ls["preset"] == s.preset && ls["seed"] == s.seed && ls["routing"] == s.routing {
            eprintln!("[larder] reusing the synthetic model {}", s.out.display());
            return Ok(());
        }
        bail!(
            "manifest {manifest}: model.synth.out {} holds a different model (not this [model.synth] spec); \
             remove it or choose another out",
            s.out.display()
        );
    }
    eprintln!("[larder] writing the synthetic model {} ...", s.out.display());
    let mut cmd = Command::new(exe);
    cmd.args(["synth", "--arch", &s.arch, "--preset", &s.preset, "--routing", &s.routing, "--seed"])
        .arg(s.seed.to_string())
        .arg("--out")
        .arg(&s.out)
        .arg("--json");
    if let Some(f) = &s.experts_format {
        cmd.args(["--experts-format", f]);
    }
    if let Some(g) = s.experts_gib {
        cmd.arg("--experts-gib").arg(g.to_string());
    }
    let out = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .context("cannot run larder synth")?;
    if !out.status.success() {
        bail!(
            "manifest {manifest}: model.synth: larder synth failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    write_atomic(&stamp, &serde_json::to_vec_pretty(&want)?)
}

/// One `larder bench decode` run of `arm`; returns its JSON report and
/// whether the arm's memory limit was applied.
fn run_arm(exe: &Path, model: &Path, arm: &Arm, budget: u64, prompt: usize, m: &Manifest, trace: &Path) -> anyhow::Result<(Value, bool)> {
    let mut cmd = Command::new(exe);
    cmd.args(["bench", "decode", "--model"])
        .arg(model)
        .arg("--ram-budget")
        .arg(budget.to_string())
        .args(["--io", &arm.io, "--prefetch", &arm.prefetch.to_string()])
        .args(["--prompt-tokens", &prompt.to_string(), "--new", &m.workload.new_tokens.to_string()])
        .args(["--seed", &m.workload.seed.to_string()])
        .args(["--limit-records", &m.workload.limit_records.to_string(), "--json", "--trace"])
        .arg(trace)
        // The trace is in this command's output folder: a rerun into it replaces it.
        .arg("--overwrite")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let cgroup = match &arm.memory_limit {
        Some(limit) => {
            let bytes = larder_store::parse_size(limit).map_err(anyhow::Error::msg)?;
            let c = Cgroup::create(&arm.name, bytes);
            if c.is_none() {
                eprintln!(
                    "[larder] warning: arm {}: cannot create a cgroup v2 with memory.max (needs root and /sys/fs/cgroup); \
                     running without the memory limit",
                    arm.name
                );
            }
            c
        }
        None => None,
    };
    let child = cmd.spawn().context("cannot start larder bench decode")?;
    let applied = match &cgroup {
        Some(c) => c.join(child.id()),
        None => false,
    };
    let out = child.wait_with_output().context("larder bench decode")?;
    drop(cgroup);
    if !out.status.success() {
        bail!(
            "larder bench decode failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let doc: Value = serde_json::from_slice(&out.stdout).context("larder bench decode printed no JSON document")?;
    Ok((doc, applied))
}

/// A child cgroup v2 with a memory limit, removed when dropped.
struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    fn create(arm: &str, bytes: u64) -> Option<Cgroup> {
        let root = Path::new("/sys/fs/cgroup");
        if !root.join("cgroup.controllers").is_file() {
            return None;
        }
        let dir = root.join(format!("larder-bench-{}-{arm}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        let c = Cgroup { dir };
        std::fs::write(c.dir.join("memory.max"), bytes.to_string()).ok()?;
        Some(c)
    }

    /// Moves `pid` into the cgroup (right after spawn: the model loads later).
    fn join(&self, pid: u32) -> bool {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).is_ok()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// `sync; echo 3 > /proc/sys/vm/drop_caches` when permitted; whether it was.
fn drop_caches() -> bool {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|t| {
        t.lines()
            .find(|l| l.starts_with("model name"))
            .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
    });
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "cpu_model": cpu,
        "ram_bytes": mem_total(),
        "ram_available_bytes": larder_engine::prefill::mem_available(),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|s| s.trim().to_string()),
        "kernel_path": larder_tensor::kernels::active_path().name(),
    })
}

fn git_commit() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Today's date (UTC) as YYYY-MM-DD.
fn utc_date() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // Civil from days (Howard Hinnant's algorithm).
    let z = (secs / 86400) as i64 + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y:04}-{mo:02}-{d:02}")
}

/// Writes `path`, a file in the output folder this command owns, through a
/// new temporary file and a rename; anything there but a regular file is
/// refused (`larder_engine::output`).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut out = larder_engine::OutputFile::in_owned_folder("--out", path)?;
    Ok(out.write_with(|w| w.write_all(bytes))?)
}

/// The median of `v` (0 when empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Per (prompt length, arm, in manifest order): the medians of the runs' figures.
pub struct Row {
    pub arm: String,
    pub prompt: u64,
    pub io: String,
    pub prefetch: u64,
    pub budget_share: f64,
    pub tok_per_s: f64,
    pub io_bound: f64,
    pub ratio: f64,
    pub hit_rate: f64,
    pub ttft: f64,
    pub runs: usize,
    pub ids_match: bool,
}

pub fn rows(doc: &Value) -> Vec<Row> {
    let runs = doc["runs"].as_array().cloned().unwrap_or_default();
    let mut order: Vec<(u64, String)> = Vec::new();
    let mut groups: BTreeMap<(u64, String), Vec<&Value>> = BTreeMap::new();
    for r in &runs {
        let key = (
            r["prompt_tokens"].as_u64().unwrap_or(0),
            r["arm"].as_str().unwrap_or("").to_string(),
        );
        if !order.contains(&key) {
            order.push(key.clone());
        }
        groups.entry(key).or_default().push(r);
    }
    order.sort_by_key(|k| k.0);
    order
        .into_iter()
        .map(|key| {
            let g = &groups[&key];
            let med = |f: &str| median(g.iter().filter_map(|r| r["decode"][f].as_f64()).filter(|v| v.is_finite()).collect());
            Row {
                arm: key.1.clone(),
                prompt: key.0,
                io: g[0]["io"].as_str().unwrap_or("").to_string(),
                prefetch: g[0]["prefetch"].as_u64().unwrap_or(0),
                budget_share: g[0]["budget_share"].as_f64().unwrap_or(0.0),
                tok_per_s: med("decode_tok_per_s"),
                io_bound: med("io_bound_tok_per_s"),
                ratio: med("ratio_to_io_bound"),
                hit_rate: med("hit_rate"),
                ttft: med("time_to_first_token_s"),
                runs: g.len(),
                ids_match: g.iter().all(|r| r["ids_match"] == true),
            }
        })
        .collect()
}

/// summary.md: one table per prompt length.
fn summary(doc: &Value) -> String {
    let mut s = format!(
        "# bench run: {}\n\n{}\n\n",
        doc["scenario"]["name"].as_str().unwrap_or(""),
        doc["scenario"]["description"].as_str().unwrap_or("")
    );
    let l = &doc["limits"];
    let f = |v: &Value| v.as_f64().map_or("-".to_string(), |x| format!("{x:.2}"));
    s += &format!(
        "Machine: {} CPUs, {} RAM, kernel {}; commit {}.\n\nLimits: RAM read (1 thread) {} / {} GB/s before / after; \
         drive {} / {} GB/s (first run before, last run after).\n\nModel: {} ({} expert bank). Oracle arm: {}. \
         All ids match: {}.\n\n",
        doc["machine"]["cpus"],
        doc["machine"]["ram_bytes"].as_u64().map_or("?".into(), larder_store::format_size),
        doc["machine"]["kernel"].as_str().unwrap_or("?"),
        doc["commit"].as_str().unwrap_or("?"),
        f(&l["ram_gbps_before"]),
        f(&l["ram_gbps_after"]),
        f(&l["drive_gbps_before"]),
        f(&l["drive_gbps_after"]),
        doc["model"]["dir"].as_str().unwrap_or(""),
        larder_store::format_size(doc["model"]["expert_bank_bytes"].as_u64().unwrap_or(0)),
        doc["oracle_arm"].as_str().unwrap_or(""),
        doc["all_ids_match"],
    );
    let rows = rows(doc);
    let mut prompts: Vec<u64> = rows.iter().map(|r| r.prompt).collect();
    prompts.dedup();
    for p in prompts {
        s += &format!("## Prompt {p} tokens\n\n");
        s += "| arm | io | prefetch | budget (share of bank) | runs | median tok/s | I/O bound tok/s | ratio | hit rate | TTFT s | ids match |\n";
        s += "|---|---|---|---|---|---|---|---|---|---|---|\n";
        for r in rows.iter().filter(|r| r.prompt == p) {
            s += &format!(
                "| {} | {} | {} | {:.0}% | {} | {:.3} | {:.3} | {:.0}% | {:.1}% | {:.3} | {} |\n",
                r.arm,
                r.io,
                r.prefetch,
                100.0 * r.budget_share,
                r.runs,
                r.tok_per_s,
                r.io_bound,
                100.0 * r.ratio,
                100.0 * r.hit_rate,
                r.ttft,
                if r.ids_match { "yes" } else { "NO" }
            );
        }
        s += "\n";
    }
    if let Some(f) = doc["failures"].as_array().filter(|f| !f.is_empty()) {
        s += "## Failures\n\n";
        for x in f {
            s += &format!("- {}\n", x.as_str().unwrap_or(""));
        }
        s += "\n";
    }
    s += "Charts: tok_per_s.svg (decode tok/s per arm, I/O bound drawn), hit_rate.svg (hit rate vs budget share), \
          ttft.svg (time to first token vs prompt length).\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn date_shape() {
        let d = utc_date();
        assert_eq!(d.len(), 10);
        assert!(d.starts_with("20"), "{d}");
    }
}
