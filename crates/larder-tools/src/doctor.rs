//! `larder doctor`'s work beyond measuring: the drive folders it probes
//! (each once, a `--drive` that fails an error, others reported), the check
//! of a `--ram-budget` against the model, each drive's JSON entry, and the
//! readable report (Machine / Drives / Model / Recommendation) built from
//! larder-engine's `Machine`, `drive_probe`, `sizing` and `recommend`.

use std::path::PathBuf;

use larder_bench::{Observer, Unit};
use larder_engine::drive_probe::DriveReport;
use larder_engine::plan::{Bound, Fit};
use larder_engine::recommend::{budget_flag, Recommendation};
use larder_engine::sizing::{Kind, ModelReport};
use larder_engine::Machine;
use larder_store::format_size;
use serde_json::{json, Value};

use crate::error::{Result, ToolsError};

/// A drive folder and what probing it gave (a folder probed only because the
/// model or the default named it reports its error instead of failing).
pub struct Drive {
    pub path: PathBuf,
    pub result: std::result::Result<DriveReport, String>,
}

/// A budget below one layer step's experts cannot stream (0, no cache, can).
pub fn check_budget(budget: u64, model: Option<&ModelReport>) -> Result<()> {
    let Some(m) = model else {
        return Err(ToolsError::Invalid(
            "--ram-budget needs --model: it sets the expert cache the estimate is for".into(),
        ));
    };
    let one = m.sizes.expert_bytes;
    if budget != 0 && budget < one {
        return Err(ToolsError::Invalid(format!(
            "--ram-budget {}: below one expert record of {} ({}); use at least that, or 0 for no cache",
            format_size(budget),
            m.path.display(),
            format_size(one)
        )));
    }
    Ok(())
}

/// The folders to probe: `drives` (the `--drive`s; default: the current
/// folder) and the model's folder, each once, with files of `probe_mib` MiB.
/// A `--drive` that fails is an error.
pub fn probe_drives(drives: &[PathBuf], model: Option<&ModelReport>, probe_mib: usize, observer: &dyn Observer) -> Result<Vec<Drive>> {
    let explicit = !drives.is_empty();
    let mut folders: Vec<(PathBuf, bool)> = if explicit {
        drives.iter().map(|d| (d.clone(), true)).collect()
    } else {
        vec![(PathBuf::from("."), false)]
    };
    // A remote model has no folder here to probe.
    if let Some(m) = model.filter(|m| m.kind != Kind::Remote) {
        folders.push((m.folder.clone(), false));
    }
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for (path, required) in folders {
        let key = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let progress = observer.task("doctor: drive probe", 2 * probe_mib as u64 * (1 << 20), Unit::Bytes);
        progress.set_message(&path.display().to_string());
        let result = larder_engine::drive_probe::probe(&path, probe_mib, &|n| progress.inc(n));
        progress.finish();
        let result = match result {
            Err(e) if required => return Err(e.into()),
            r => r.map_err(|e| e.to_string()),
        };
        out.push(Drive { path, result });
    }
    Ok(out)
}

impl Drive {
    /// The drive's entry of `larder doctor --json`'s "drives".
    pub fn to_json(&self) -> Value {
        let d = self;
        match &d.result {
            Err(e) => json!({"path": d.path, "error": e}),
            Ok(r) => json!({
                "path": r.path,
                "filesystem": r.filesystem,
                "free_bytes": r.free_bytes,
                "total_bytes": r.total_bytes,
                "o_direct": r.o_direct,
                "io_uring": r.io_uring,
                "backend": r.backend,
                "probe_bytes": r.probe_bytes,
                "record_bytes": r.record_bytes,
                "read_gbps": r.read_gbps,
                "page_cache_only": r.page_cache_only,
            }),
        }
    }
}

/// The readable report: Machine / Drives / Model / Recommendation.
pub fn report(machine: &Machine, drives: &[Drive], model: Option<&ModelReport>, rec: Option<&Recommendation>) -> String {
    let mut out = machine_text(machine);
    out.push_str("\nDrives\n");
    for d in drives {
        out.push_str(&drive_text(d));
    }
    if let (Some(m), Some(r)) = (model, rec) {
        out.push_str(&model_text(m));
        out.push_str(&recommendation_text(m, r));
    }
    out
}

fn machine_text(m: &Machine) -> String {
    let on: Vec<&str> = m.features.iter().filter(|f| f.1).map(|f| f.0).collect();
    let off: Vec<&str> = m.features.iter().filter(|f| !f.1).map(|f| f.0).collect();
    let cgroup = m.cgroup_limit.map_or("none".to_string(), format_size);
    format!(
        "Machine\n  CPU          {} ({} cores, {} threads, {})\n  ISA          {} (absent: {})\n  \
         kernel path  {} (this CPU can run: {})\n  RAM          {} total, {} available (cgroup limit: {})\n  \
         RAM read     {:.1} GB/s, one thread (measured)\n",
        m.cpu_model,
        m.cores,
        m.threads,
        m.arch,
        if on.is_empty() { "none".to_string() } else { on.join(" ") },
        if off.is_empty() { "none".to_string() } else { off.join(" ") },
        m.kernel_path,
        m.kernel_paths.join(", "),
        format_size(m.ram_total),
        format_size(m.ram_available),
        cgroup,
        m.ram_gbps
    )
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn drive_text(d: &Drive) -> String {
    let r = match &d.result {
        Ok(r) => r,
        Err(e) => return format!("  {}\n    not probed: {e}\n", d.path.display()),
    };
    let mut s = format!(
        "  {}\n    {}, {} free of {}; O_DIRECT {}, io_uring {}\n    read {:.2} GB/s (measured: {} in {} reads, {}{})\n",
        r.path.display(),
        r.filesystem,
        format_size(r.free_bytes),
        format_size(r.total_bytes),
        yes(r.o_direct),
        yes(r.io_uring),
        r.read_gbps,
        format_size(r.probe_bytes),
        format_size(r.record_bytes),
        r.backend,
        if r.o_direct { ", O_DIRECT" } else { ", page cache" }
    );
    if r.page_cache_only {
        s.push_str("    note: this is page-cache (RAM) speed, not a disk's\n");
    }
    s
}

fn model_text(m: &ModelReport) -> String {
    let s = &m.sizes;
    let how = if s.exact {
        match m.kind {
            Kind::Store => "exact, from the store manifest",
            Kind::Remote => "exact, from the safetensors headers, read by range",
            _ => "exact, from the safetensors headers",
        }
    } else {
        "estimated from config.json shapes and dtype"
    };
    format!(
        "\nModel  {} ({})\n  architecture  {}, {} layers ({} MoE), {} experts per layer, top-{}\n  \
         spine         {} ({how})\n  expert bank   {}, {} per expert\n  \
         per token     {} of routed experts (top-{} x {} MoE layers), {} of weights in all\n  \
         KV cache      {} per token of context{}\n{}",
        m.path.display(),
        m.kind.name(),
        m.model_type,
        s.layers,
        s.moe_layers,
        s.experts_per_layer,
        s.top_k,
        format_size(s.spine_bytes),
        format_size(s.bank_bytes),
        format_size(s.expert_bytes),
        format_size(s.expert_bytes_per_token()),
        s.top_k,
        s.moe_layers,
        format_size(s.active_bytes_per_token()),
        format_size(m.kv_bytes_per_token as u64),
        match m.kv_bytes_per_token_expanded == m.kv_bytes_per_token {
            true => String::new(),
            false => format!(
                " (MLA compact latent; {} expanded)",
                format_size(m.kv_bytes_per_token_expanded as u64)
            ),
        },
        extra_model_lines(m)
    )
}

/// The recurrent state and the bytes never read, where the model has them.
fn extra_model_lines(m: &ModelReport) -> String {
    let mut s = String::new();
    if m.recurrent_state_bytes > 0 {
        s += &format!(
            "  KDA state     {} per sequence, whatever its length\n",
            format_size(m.recurrent_state_bytes)
        );
    }
    if m.skipped_bytes > 0 {
        s += &format!(
            "  skipped       {} never read (a wrapper's vision tower; not fetched, not packed)\n",
            format_size(m.skipped_bytes)
        );
    }
    s
}

fn recommendation_text(m: &ModelReport, r: &Recommendation) -> String {
    let p = &r.plan;
    let mut s = format!("\nRecommendation\n  fit           {}\n", r.fit_text());
    if matches!(p.fit, Fit::DoesNotFit { .. }) {
        return s;
    }
    s.push_str(&format!(
        "  --ram-budget  {} (RAM available - spine - {} headroom, capped at the bank)\n  --io          {} ({})\n",
        budget_flag(p.recommended_ram_budget),
        format_size(p.headroom_bytes),
        r.io,
        if r.io == "uring" {
            "io_uring and O_DIRECT work on the model's drive"
        } else {
            "io_uring or O_DIRECT does not work on the model's drive"
        }
    ));
    s.push_str(&speed_text(r));
    let flags = match (m.kind, p.fit) {
        (Kind::Checkpoint, Fit::InRam) => String::new(),
        _ => format!(" --ram-budget {} --io {}", budget_flag(p.recommended_ram_budget), r.io),
    };
    let model = match m.kind {
        Kind::Config => "CHECKPOINT".to_string(),
        _ => m.folder.display().to_string(),
    };
    s.push_str(&format!("  command       larder run --model {model}{flags} --prompt \"...\"\n"));
    s
}

/// A tok/s figure with three significant digits below 100.
fn rate(x: f64) -> String {
    match x {
        x if x >= 100.0 => format!("{x:.0}"),
        x if x >= 10.0 => format!("{x:.1}"),
        x if x >= 1.0 => format!("{x:.2}"),
        x => format!("{x:.3}"),
    }
}

fn speed_text(r: &Recommendation) -> String {
    let p = &r.plan;
    let disk = match (p.disk_tok_per_s, r.disk_gbps()) {
        (Some(t), Some(g)) => format!("{} tok/s ({g:.2} GB/s over {:.0}% misses)", rate(t), p.miss_rate * 100.0),
        (None, Some(_)) => "none (every expert cached)".into(),
        (_, None) => "unknown (the model's drive was not probed)".into(),
    };
    format!(
        "  expected      {} tok/s decode, {}-bound (estimated at a {} expert cache)\n  \
         compute bound {} tok/s (RAM {:.1} GB/s, one thread, over the active weights)\n  disk bound    {disk}\n",
        rate(p.expected_tok_per_s),
        match p.bound {
            Bound::Compute => "compute",
            Bound::Disk => "disk",
        },
        format_size(p.ram_budget),
        rate(p.compute_tok_per_s),
        r.ram_gbps
    )
}
