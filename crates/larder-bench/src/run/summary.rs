//! What a `bench run` reports besides its runs: the machine, the commit,
//! the date, and summary.md (one table per prompt length, medians per arm).

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

use super::manifest::mem_total;

/// The machine a run ran on: CPUs, RAM, kernel and kernel path.
pub fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|t| {
        t.lines()
            .find(|l| l.starts_with("model name"))
            .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
    });
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "cpu_model": cpu,
        "ram_bytes": mem_total(),
        "ram_available_bytes": larder_engine::mem_available(),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|s| s.trim().to_string()),
        "kernel_path": larder_tensor::kernels::active_path().name(),
    })
}

/// The source tree's commit, when run inside a git checkout.
pub fn git_commit() -> Option<String> {
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
pub fn utc_date() -> String {
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

/// The rows of summary.md and the charts, from results.json's runs.
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
pub fn summary(doc: &Value) -> String {
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
