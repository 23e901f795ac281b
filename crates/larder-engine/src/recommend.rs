//! `larder doctor`'s recommendation: from this machine's figures
//! ([`crate::machine`]), the model drive's probe ([`crate::drive_probe`]) and
//! the model's sizes ([`crate::sizing`]), the first planner's verdict
//! ([`crate::plan::plan`]): whether it fits, the `--ram-budget` and `--io`
//! to use, and the decode speed to expect.

use larder_store::format_size;
use serde_json::{json, Value};

use crate::drive_probe::DriveReport;
use crate::machine::Machine;
use crate::plan::{plan, Fit, MachineFigures, Plan, PlanError};
use crate::sizing::ModelReport;

/// The plan for the model, and how to run it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Recommendation {
    pub plan: Plan,
    pub ram_gbps: f64,
    /// The model drive's figure (None: its probe failed).
    pub drive: Option<DriveReport>,
    pub io: &'static str,
    pub spine_bytes: u64,
    pub ram_available: u64,
}

/// The recommendation for model `m` on `machine`, the model's drive found
/// among the `drives` probed (`budget`: plan for this cache instead).
pub fn recommend(machine: &Machine, drives: &[&DriveReport], m: &ModelReport, budget: Option<u64>) -> Result<Recommendation, PlanError> {
    let key = std::fs::canonicalize(&m.folder).unwrap_or_else(|_| m.folder.clone());
    let drive = drives
        .iter()
        .find(|r| std::fs::canonicalize(&r.path).unwrap_or_else(|_| r.path.clone()) == key)
        .map(|r| (*r).clone());
    let figures = MachineFigures {
        ram_available: machine.ram_available,
        ram_gbps: machine.ram_gbps,
        drive_gbps: drive.as_ref().map(|d| d.read_gbps),
    };
    let plan = plan(&m.sizes, &figures, budget)?;
    let io = match &drive {
        Some(d) if d.io_uring && d.o_direct => "uring",
        _ => "pread",
    };
    Ok(Recommendation {
        plan,
        ram_gbps: machine.ram_gbps,
        drive,
        io,
        spine_bytes: m.sizes.spine_bytes,
        ram_available: machine.ram_available,
    })
}

/// A `--ram-budget` value no larger than `bytes`: whole GiB from 10 GiB,
/// whole MiB from 10 MiB, else bytes.
pub fn budget_flag(bytes: u64) -> String {
    if bytes >= 10 << 30 {
        format!("{}GiB", bytes >> 30)
    } else if bytes >= 10 << 20 {
        format!("{}MiB", bytes >> 20)
    } else {
        bytes.to_string()
    }
}

impl Recommendation {
    /// Whether it fits, in words.
    pub fn fit_text(&self) -> String {
        let usable = self.ram_available.saturating_sub(self.plan.headroom_bytes);
        match self.plan.fit {
            Fit::InRam => "runs in RAM".into(),
            Fit::Streamed => "runs streamed".into(),
            Fit::DoesNotFit { .. } if self.spine_bytes > usable => format!(
                "does not fit: the spine alone needs {}; {} available after {} headroom",
                format_size(self.spine_bytes),
                format_size(usable),
                format_size(self.plan.headroom_bytes)
            ),
            Fit::DoesNotFit { needs } => format!(
                "does not fit: the spine ({}), one layer step's experts and {} headroom need {}; {} available",
                format_size(self.spine_bytes),
                format_size(self.plan.headroom_bytes),
                format_size(needs),
                format_size(self.ram_available)
            ),
        }
    }

    /// The model drive's read GB/s, when it was probed.
    pub fn disk_gbps(&self) -> Option<f64> {
        self.drive.as_ref().map(|d| d.read_gbps)
    }

    /// The `recommendation` object of `larder doctor --json`.
    pub fn to_json(&self) -> Value {
        let p = &self.plan;
        let fits = !matches!(p.fit, Fit::DoesNotFit { .. });
        json!({
            "fit": p.fit.key(),
            "fit_text": self.fit_text(),
            "headroom_bytes": p.headroom_bytes,
            "ram_budget_bytes": p.recommended_ram_budget,
            "ram_budget": fits.then(|| budget_flag(p.recommended_ram_budget)),
            "planned_ram_budget_bytes": p.ram_budget,
            "io": self.io,
            "miss_rate": p.miss_rate,
            "ram_gbps": self.ram_gbps,
            "drive_gbps": self.disk_gbps(),
            "disk_bound_tok_per_s": p.disk_tok_per_s,
            "compute_bound_tok_per_s": p.compute_tok_per_s,
            "expected_tok_per_s": p.expected_tok_per_s,
            "bound": fits.then(|| p.bound.key()),
            "estimate": "uniform routing, reads and compute not overlapped",
        })
    }
}
