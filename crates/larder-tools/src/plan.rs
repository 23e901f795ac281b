//! `larder plan`'s inputs and outputs around larder-engine's planner:
//! drive figures (`7x4`), kernel speeds from `larder bench kernels` JSON, the
//! `--json` document and the readable plan.

use std::path::Path;

use larder_engine::planner::{PlanInput, PlanOutput};
use larder_engine::sizing::ModelReport;
use larder_store::cache::PolicyKind;
use larder_store::format_size;
use serde_json::{json, Value};

use crate::error::{Result, ToolsError};

/// `larder plan --json`'s document: the forecast `p` of `input` for `model`
/// under `routing` (a preset's name, or `trace`).
pub fn plan_json(model: &Path, input: &PlanInput, p: &PlanOutput, routing: &str) -> Value {
    let (m, f, sizes) = (&input.machine, &p.forecast, &input.model.sizes);
    let ttft: serde_json::Map<String, serde_json::Value> = f.ttft_s.iter().map(|(n, s)| (n.to_string(), json!(s))).collect();
    json!({
        "model": model,
        "model_report": input.model.to_json(),
        "decode_tok_per_s": f.decode_tok_per_s,
        "ttft_s": ttft,
        "hit_rate": f.hit_rate,
        "bytes_per_token": f.bytes_per_token,
        "binding": f.binding,
        "ram_budget": p.ram_budget,
        "bank_bytes": sizes.bank_bytes,
        "spine_bytes": sizes.spine_bytes,
        "policy": PolicyKind::default().name(),
        "routing": routing,
        "recall": p.recall,
        "prefetch": input.prefetch,
        "io": if input.uring { "uring" } else { "pread" },
        "demand_bytes_per_token": p.demand_bytes_per_token,
        "prefetch_bytes_per_token": p.prefetch_bytes_per_token,
        "prefetch_used_per_token": p.prefetch_used_per_token,
        "bytes_per_token_simulated": p.bytes_per_token_simulated,
        "cpu_overhead": input.cpu_overhead,
        "seconds_per_token": {"disk": f.disk_s_per_token, "ram": f.ram_s_per_token, "compute": f.compute_s_per_token,
                              "digest": f.digest_s_per_token, "wait": f.wait_s_per_token},
        "machine": {"ram": m.ram, "drives_gbps": m.drives_gbps, "cores": m.cores, "ram_gbps_per_core": m.ram_gbps,
                    "spine_kernel_gbps_per_core": m.spine_kernel_gbps,
                    "expert_kernel_gbps_per_core": m.expert_kernel_gbps,
                    "expert_format": p.expert_format, "prefill_kernel_gbps_per_core": m.prefill_kernel_gbps,
                    "digest_gbps_per_core": m.digest_gbps},
    })
}

/// The readable plan.
pub fn plan_text(model: &Path, report: &ModelReport, p: &PlanOutput, routing: &str, prefetch: bool) -> String {
    let mut out = String::new();
    let (f, sizes) = (&p.forecast, &report.sizes);
    out += &format!(
        "{}: spine {}, bank {} ({} MoE layers x {} experts, top-{}, {} each)",
        model.display(),
        format_size(sizes.spine_bytes),
        format_size(sizes.bank_bytes),
        sizes.moe_layers,
        sizes.experts_per_layer,
        sizes.top_k,
        format_size(sizes.expert_bytes)
    );
    out.push('\n');
    out += &format!(
        "per token: {} of routed experts, {} of weights in all; context: {} of KV cache per token{}",
        format_size(sizes.expert_bytes_per_token()),
        format_size(sizes.active_bytes_per_token()),
        format_size(report.kv_bytes_per_token as u64),
        match report.recurrent_state_bytes {
            0 => String::new(),
            b => format!(", {} of KDA state per sequence", format_size(b)),
        }
    );
    out.push('\n');
    if report.skipped_bytes > 0 {
        out += &format!(
            "skipped: {} never read (a wrapper's vision tower)\n",
            format_size(report.skipped_bytes)
        );
    }
    out += &format!(
        "cache {} ({:.0}% of the bank), policy {}: hit rate {:.1}% ({routing}); reads {} per token",
        format_size(p.ram_budget),
        100.0 * p.ram_budget as f64 / sizes.bank_bytes as f64,
        PolicyKind::default().name(),
        100.0 * f.hit_rate,
        format_size(f.bytes_per_token as u64)
    );
    out.push('\n');
    out += &format!(
        "decode: {:.2} tok/s, bound by {} (per token: disk {:.3} s, RAM {:.3} s, compute {:.3} s, digests {:.3} s, \
         waiting for reads {:.3} s; prefetch {}, recall {:.0}%)",
        f.decode_tok_per_s,
        f.binding,
        f.disk_s_per_token,
        f.ram_s_per_token,
        f.compute_s_per_token,
        f.digest_s_per_token,
        f.wait_s_per_token,
        if prefetch { "on" } else { "off" },
        100.0 * p.recall
    );
    out.push('\n');
    for (n, s) in &f.ttft_s {
        out += &format!("time to first token, {n}-token prompt: {s:.1} s\n");
    }
    out
}

/// `1.8` or `7x4` (four drives of 7 GB/s).
pub fn parse_drive(s: &str) -> Result<Vec<f64>> {
    let (gbps, n) = match s.split_once(['x', 'X']) {
        Some((g, n)) => (g, n.trim().parse::<usize>().ok().filter(|n| (1..=64).contains(n))),
        None => (s, Some(1)),
    };
    let n = n.ok_or_else(|| invalid(format!("--drive {s:?}: the count after x must be 1 to 64")))?;
    let g: f64 = gbps
        .trim()
        .parse()
        .map_err(|_| invalid(format!("--drive {s:?}: not a GB/s figure (say 7 or 7x4)")))?;
    Ok(vec![positive("--drive", g)?; n])
}

/// `v` for `flag` when it is a finite number above 0.
pub fn positive(flag: &str, v: f64) -> Result<f64> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(invalid(format!("{flag} {v}: must be a number above 0")))
    }
}

fn invalid(message: String) -> ToolsError {
    ToolsError::Invalid(message)
}

/// One-core kernel weight GB/s: the spine's (bf16) and the experts' at one
/// row, and the experts' per row at many rows (prefill): `--kernel-gbps`,
/// else read from `--kernels FILE` (`larder bench kernels` JSON), else the
/// RAM speed (and 8x it at many rows).
pub fn kernel_speeds(kernel_gbps: Option<f64>, kernels: Option<&Path>, ram_gbps: f64, experts: &str) -> Result<(f64, f64, f64)> {
    if let Some(g) = kernel_gbps {
        let g = positive("--kernel-gbps", g)?;
        return Ok((g, g, g * 8.0));
    }
    let Some(path) = kernels else {
        return Ok((ram_gbps, ram_gbps, ram_gbps * 8.0));
    };
    let text = std::fs::read_to_string(path).map_err(|e| ToolsError::io(format!("--kernels {}", path.display()), e))?;
    let doc: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| invalid(format!("--kernels {}: not `larder bench kernels` JSON: {e}", path.display())))?;
    let results = doc["results"]
        .as_array()
        .ok_or_else(|| invalid(format!("--kernels {}: no \"results\"", path.display())))?;
    let threads = doc["threads"].as_f64().unwrap_or(1.0).max(1.0);
    let of = |dtype: &str| {
        let cold = results
            .iter()
            .filter(|r| r["cold"].as_bool() == Some(true) && r["dtype"].as_str() == Some(dtype));
        let rows = |r: &serde_json::Value| r["rows"].as_f64().unwrap_or(0.0);
        let one = cold
            .clone()
            .filter(|r| rows(r) == 1.0)
            .filter_map(|r| r["gbps"].as_f64())
            .fold(f64::NAN, f64::min);
        let many = cold.filter_map(|r| Some(r["gbps"].as_f64()? * rows(r))).fold(f64::NAN, f64::max);
        (one, many)
    };
    let ((spine, _), (expert, prefill)) = (of("bf16"), of(experts));
    if !spine.is_finite() || !expert.is_finite() || !prefill.is_finite() {
        return Err(invalid(format!(
            "--kernels {}: needs cold one-row results for bf16 (the spine) and {experts} (the experts); run \
             `larder bench kernels --formats bf16,{experts} --rows 1,256 --out FILE`",
            path.display()
        )));
    }
    Ok((spine / threads, expert / threads, prefill / threads))
}
