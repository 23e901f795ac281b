//! `--ram-budget auto` under a real cgroup v1 memory limit (issue 37,
//! finding 5): a child memory cgroup of this process's v1 memory cgroup gets
//! a limit well under the spine plus the routed experts of a synthetic model,
//! and `larder run --ram-budget auto` started inside it (moved in before it
//! execs) must complete with the ids of an unlimited run and without an OOM
//! kill, its cache sized from the v1 limit (which only cgroup v2's was read
//! before, so the cache grew to all the experts and the kernel killed it).
//! Under a limit below the spine alone, the run must say so on stderr before
//! it loads: an error with `auto`, a warning with an explicit --ram-budget.
//!
//! Needs root and a mounted v1 memory controller; elsewhere it skips, saying
//! why. Nothing here depends on timing.

use std::fs::File;
use std::io::Write;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

mod common;

const MIB: u64 = 1 << 20;
/// The limit of the streamed run: over the spine (~267 MiB) with one layer
/// step's experts and the process itself, well under spine plus experts
/// (~787 MiB, what the cache held when `auto` ignored v1).
const LIMIT: u64 = 640 * MIB;
/// A limit under the spine alone.
const SPINE_OVER_LIMIT: u64 = 192 * MIB;
/// Prompt and length of every run: 20 tokens of top-4 of 16 experts touch
/// nearly every expert, so a cache sized from MemAvailable holds them all.
const IDS: &str = "1,2,3,4,5,6,7,8";
const NEW: &str = "12";

/// A child memory cgroup of this process's v1 memory cgroup, removed when dropped.
struct ChildCgroup {
    dir: PathBuf,
}

impl ChildCgroup {
    /// A new child cgroup named `name` with `limit` bytes, or why it cannot be made here.
    fn create(name: &str, limit: u64) -> Result<ChildCgroup, String> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        let parent = own_v1_memory_cgroup().ok_or("no cgroup v1 memory controller is mounted for this process")?;
        let dir = parent.join(format!("larder-test-{}-{name}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let cgroup = ChildCgroup { dir };
        std::fs::write(cgroup.dir.join("memory.limit_in_bytes"), limit.to_string())
            .map_err(|e| format!("cannot set {}/memory.limit_in_bytes: {e}", cgroup.dir.display()))?;
        Ok(cgroup)
    }

    /// Runs larder with `args` inside this cgroup: the child moves itself in
    /// (writing 0 to cgroup.procs) after fork, before exec and any allocation.
    fn run(&self, args: &[&str]) -> Output {
        let procs = File::options().write(true).open(self.dir.join("cgroup.procs")).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_larder"));
        command.args(args);
        // SAFETY: the closure only writes two bytes to an open file (no
        // allocation, no lock), which is async-signal-safe.
        unsafe {
            command.pre_exec(move || (&procs).write_all(b"0"));
        }
        command.output().unwrap()
    }

    /// A number from one of the cgroup's files (`memory.max_usage_in_bytes`).
    fn number(&self, file: &str) -> u64 {
        let text = std::fs::read_to_string(self.dir.join(file)).unwrap();
        text.trim().parse().unwrap_or_else(|e| panic!("{file}: {text:?}: {e}"))
    }

    /// OOM kills in the cgroup (`oom_kill` of memory.oom_control; 0 on kernels without it).
    fn oom_kills(&self) -> u64 {
        let text = std::fs::read_to_string(self.dir.join("memory.oom_control")).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .map_or(0, |n| n.trim().parse().unwrap())
    }
}

impl Drop for ChildCgroup {
    fn drop(&mut self) {
        // Its processes have exited; their page cache moves to the parent.
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            eprintln!("cannot remove {}: {e}", self.dir.display());
        }
    }
}

/// This process's directory in the v1 memory hierarchy, from /proc/self/cgroup
/// (`4:memory:/a/b`) and the mount of that hierarchy in /proc/self/mountinfo.
fn own_v1_memory_cgroup() -> Option<PathBuf> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        controllers.split(',').any(|c| c == "memory").then(|| path.to_string())
    })?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let (root, mount) = mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut r = right.split(' ');
        let (fstype, _, options) = (r.next()?, r.next()?, r.next()?);
        let left: Vec<&str> = left.split(' ').collect();
        (fstype == "cgroup" && options.split(',').any(|o| o == "memory")).then(|| (left[3].to_string(), left[4].to_string()))
    })?;
    let relative = Path::new(&path).strip_prefix(&root).ok()?;
    Some(Path::new(&mount).join(relative))
}

/// The ids of a greedy `run` output.
fn ids(out: &Output, what: &str) -> Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what} failed ({:?}): {stderr}", out.status);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{what}: {e}: {stderr}"));
    doc["ids"].clone()
}

#[test]
fn ram_budget_auto_runs_within_a_cgroup_v1_limit_and_a_spine_over_it_is_named_first() {
    let limited = match ChildCgroup::create("limited", LIMIT) {
        Ok(c) => c,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("k3mini-int4");
    let m = model.to_str().unwrap();
    // deepseek_v3 k3-mini with 4-bit experts: 7 MoE layers of 16 experts of 4.6 MiB.
    let synth = common::ok_json(&[
        "synth",
        "--arch",
        "deepseek_v3",
        "--preset",
        "k3-mini",
        "--experts-format",
        "int4",
        "--experts",
        "16",
        "--top-k",
        "4",
        "--layers",
        "8",
        "--vocab",
        "1000",
        "--measure-tokens",
        "0",
        "--out",
        m,
        "--json",
    ]);
    let (bytes, experts) = (synth["bytes"].as_u64().unwrap(), synth["expert_bytes"].as_u64().unwrap());
    let spine = bytes - experts;
    assert!(spine + experts > LIMIT + 128 * MIB, "all of it must be far over the limit: {synth}");
    assert!(
        spine < LIMIT / 2,
        "the spine must leave room for the experts of a step and the process: {synth}"
    );
    assert!(
        spine > SPINE_OVER_LIMIT + 64 * MIB,
        "the spine must be over the small limit: {synth}"
    );

    let run = ["run", "--model", m, "--ids", IDS, "--max-new", NEW, "--ignore-eos", "--json"];
    let unlimited = ids(&common::larder(&run), "the unlimited run");

    let auto = [&run[..], &["--ram-budget", "auto"]].concat();
    let out = limited.run(&auto);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.signal(), None, "killed under the {} MiB v1 limit: {stderr}", LIMIT / MIB);
    assert_eq!(ids(&out, "the v1-limited run"), unlimited, "same ids under the limit");
    assert!(!stderr.contains("warning:"), "a run that fits says nothing: {stderr}");
    assert_eq!(limited.oom_kills(), 0, "no OOM kill in the cgroup");
    assert!(limited.number("memory.max_usage_in_bytes") <= LIMIT);
    drop(limited);

    let small = ChildCgroup::create("spine-over-limit", SPINE_OVER_LIMIT).unwrap();
    let limit_file = small.dir.join("memory.limit_in_bytes").display().to_string();
    let out = small.run(&auto);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "auto refuses before loading: {stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    for part in [
        "needs at least",
        "cgroup v1 memory limit 192.00 MiB",
        &limit_file,
        "raise the limit",
    ] {
        assert!(stderr.contains(part), "{part:?} missing: {stderr}");
    }
    assert_eq!(small.oom_kills(), 0, "it stopped before the kernel killed it");

    let explicit = [&run[..], &["--ram-budget", "16MiB"]].concat();
    let out = small.run(&explicit);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "a spine over the limit cannot run: {stderr}");
    assert!(
        stderr.starts_with("warning: ") && stderr.contains(&limit_file) && stderr.contains("the kernel will kill it"),
        "an explicit budget warns first: {stderr}"
    );
}
