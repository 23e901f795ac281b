//! One arm of a `bench run`: `larder bench decode` in a fresh process,
//! inside the arm's cgroup v2 memory limit when one is set and permitted,
//! after the page cache is dropped when permitted.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use super::manifest::{Arm, Workload};
use crate::{BenchError, Observer, Result};

/// What one run decodes: the model, the arm's budget in bytes, the prompt length and where its trace goes.
pub struct Decode<'a> {
    pub model: &'a Path,
    pub budget: u64,
    pub prompt: usize,
    pub trace: &'a Path,
}

/// The `larder bench decode` command of one run of `arm`.
fn decode_command(exe: &Path, arm: &Arm, d: &Decode, w: &Workload) -> Command {
    let mut cmd = Command::new(exe);
    cmd.args(["bench", "decode", "--model"])
        .arg(d.model)
        .arg("--ram-budget")
        .arg(d.budget.to_string())
        .args(["--io", &arm.io, "--prefetch", &arm.prefetch.to_string()])
        .args(["--prompt-tokens", &d.prompt.to_string(), "--new", &w.new_tokens.to_string()])
        .args(["--seed", &w.seed.to_string()])
        .args(["--limit-records", &w.limit_records.to_string(), "--json", "--trace"])
        .arg(d.trace)
        // The trace is in this command's output folder: a rerun into it replaces it.
        .arg("--overwrite")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// The arm's cgroup, when it sets a memory limit and one can be made.
fn arm_cgroup(arm: &Arm, observer: &dyn Observer) -> Result<Option<Cgroup>> {
    let Some(limit) = &arm.memory_limit else {
        return Ok(None);
    };
    let bytes = larder_store::parse_size(limit).map_err(BenchError::Invalid)?;
    let c = Cgroup::create(&arm.name, bytes);
    if c.is_none() {
        observer.note(&format!(
            "[larder] warning: arm {}: cannot create a cgroup v2 with memory.max (needs root and /sys/fs/cgroup); \
             running without the memory limit",
            arm.name
        ));
    }
    Ok(c)
}

/// One `larder bench decode` run of `arm`; returns its JSON report and
/// whether the arm's memory limit was applied.
pub fn run_arm(exe: &Path, arm: &Arm, d: &Decode, w: &Workload, observer: &dyn Observer) -> Result<(Value, bool)> {
    let mut cmd = decode_command(exe, arm, d, w);
    let cgroup = arm_cgroup(arm, observer)?;
    let child = cmd.spawn().map_err(|e| BenchError::io("cannot start larder bench decode", e))?;
    let applied = match &cgroup {
        Some(c) => c.join(child.id()),
        None => false,
    };
    let out = child.wait_with_output().map_err(|e| BenchError::io("larder bench decode", e))?;
    drop(cgroup);
    if !out.status.success() {
        return Err(BenchError::Failed(format!(
            "larder bench decode failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let doc: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| BenchError::Failed(format!("larder bench decode printed no JSON document: {e}")))?;
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
pub fn drop_caches() -> bool {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}
