//! This machine's facts, as `larder doctor` and the planner read them: CPU
//! model, cores and threads, the ISA features larder's kernels care about
//! and the kernel path its runtime dispatch chose, RAM total and available
//! (a cgroup limit counts when lower), and a one-thread streaming RAM read.

use larder_tensor::kernels::{active_path, KernelPath};
use serde_json::{json, Value};

/// Bytes the RAM read streams over (well past any one core's cache; ~0.2 s).
const RAM_PROBE_BYTES: usize = 128 << 20;

/// What this machine is.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Machine {
    pub arch: &'static str,
    pub cpu_model: String,
    /// Physical cores (the threads' count when /proc/cpuinfo does not say).
    pub cores: usize,
    /// Hardware threads this process may run on.
    pub threads: usize,
    /// (feature, present), in a fixed order.
    pub features: Vec<(&'static str, bool)>,
    /// The kernel path larder uses (`LARDER_KERNEL` or the best verified one).
    pub kernel_path: &'static str,
    pub kernel_paths: Vec<&'static str>,
    pub ram_total: u64,
    /// MemAvailable, or what the cgroup limit leaves when that is lower.
    pub ram_available: u64,
    pub cgroup_limit: Option<u64>,
    /// One-thread streaming read, GB/s (measured).
    pub ram_gbps: f64,
}

impl Machine {
    /// Reads /proc and measures the RAM read.
    pub fn inspect() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let ram_total = meminfo_bytes(&meminfo, "MemTotal:").unwrap_or(0);
        let mem_available = meminfo_bytes(&meminfo, "MemAvailable:").unwrap_or(ram_total);
        // The tightest cgroup v1 or v2 limit over this process's cgroup and its ancestors.
        let cgroup = crate::memory_limit::cgroup_limit();
        let ram_available = match &cgroup {
            Some(limit) => mem_available.min(limit.room()),
            None => mem_available,
        };
        Machine {
            arch: std::env::consts::ARCH,
            cpu_model: cpu_model(&cpuinfo),
            cores: physical_cores(&cpuinfo).unwrap_or(threads),
            threads,
            features: features(&cpuinfo),
            kernel_path: active_path().name(),
            kernel_paths: KernelPath::available().into_iter().map(|p| p.name()).collect(),
            ram_total,
            ram_available,
            cgroup_limit: cgroup.map(|c| c.limit),
            ram_gbps: larder_tensor::bench::ram_read_gbps(RAM_PROBE_BYTES),
        }
    }

    /// The `machine` object of `--json`.
    pub fn to_json(&self) -> Value {
        let features: serde_json::Map<String, Value> = self.features.iter().map(|(n, on)| (n.to_string(), Value::Bool(*on))).collect();
        json!({
            "arch": self.arch,
            "cpu_model": self.cpu_model,
            "cores": self.cores,
            "threads": self.threads,
            "features": features,
            "kernel_path": self.kernel_path,
            "kernel_paths_available": self.kernel_paths,
            "ram_total_bytes": self.ram_total,
            "ram_available_bytes": self.ram_available,
            "cgroup_memory_limit_bytes": self.cgroup_limit,
            "ram_read_gbps": self.ram_gbps,
            "ram_probe_bytes": RAM_PROBE_BYTES,
        })
    }
}

/// `MemTotal:  16318412 kB` -> bytes.
fn meminfo_bytes(meminfo: &str, key: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line[key.len()..].split_whitespace().next()?.parse().ok()?;
    Some(kb.saturating_mul(1024))
}

/// The value of the first `key : value` line of /proc/cpuinfo.
fn cpuinfo_field<'a>(cpuinfo: &'a str, key: &str) -> Option<&'a str> {
    cpuinfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim())
    })
}

fn cpu_model(cpuinfo: &str) -> String {
    ["model name", "Model", "Hardware", "cpu model"]
        .iter()
        .find_map(|k| cpuinfo_field(cpuinfo, k).filter(|v| !v.is_empty()))
        .map_or_else(|| format!("unknown {} CPU", std::env::consts::ARCH), str::to_string)
}

/// Distinct (physical id, core id) pairs, when /proc/cpuinfo lists them.
fn physical_cores(cpuinfo: &str) -> Option<usize> {
    let mut cores = std::collections::BTreeSet::new();
    for block in cpuinfo.split("\n\n") {
        let package = cpuinfo_field(block, "physical id").unwrap_or("0");
        if let Some(core) = cpuinfo_field(block, "core id") {
            cores.insert((package.to_string(), core.to_string()));
        }
    }
    (!cores.is_empty()).then_some(cores.len())
}

/// The ISA features larder's kernels use, from /proc/cpuinfo's flag list.
fn features(cpuinfo: &str) -> Vec<(&'static str, bool)> {
    let flags: Vec<&str> = cpuinfo_field(cpuinfo, "flags")
        .or_else(|| cpuinfo_field(cpuinfo, "Features"))
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let has = |f: &str| flags.contains(&f);
    if cfg!(target_arch = "aarch64") {
        return vec![("neon", has("asimd") || KernelPath::Neon.is_supported()), ("sve", has("sve"))];
    }
    vec![
        ("avx2", has("avx2")),
        ("fma", has("fma")),
        ("f16c", has("f16c")),
        ("avx512f", has("avx512f")),
        ("avx512bw", has("avx512bw")),
        ("avx512_bf16", has("avx512_bf16")),
        ("amx", has("amx_tile")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    const CPUINFO: &str = "processor\t: 0\nmodel name\t: Test CPU @ 3GHz\nphysical id\t: 0\ncore id\t\t: 0\n\
        flags\t\t: fpu avx2 fma f16c avx512f amx_tile\n\nprocessor\t: 1\nmodel name\t: Test CPU @ 3GHz\n\
        physical id\t: 0\ncore id\t\t: 0\n\nprocessor\t: 2\nphysical id\t: 0\ncore id\t\t: 1\n";

    #[test]
    fn reads_cpuinfo() {
        assert_eq!(cpu_model(CPUINFO), "Test CPU @ 3GHz");
        assert_eq!(physical_cores(CPUINFO), Some(2));
        assert_eq!(physical_cores("processor : 0\n"), None);
        if cfg!(target_arch = "x86_64") {
            let f = features(CPUINFO);
            assert!(f.contains(&("avx2", true)) && f.contains(&("amx", true)) && f.contains(&("avx512bw", false)));
        }
    }

    #[test]
    fn reads_meminfo() {
        let m = "MemTotal:       16318412 kB\nMemAvailable:    8000000 kB\n";
        assert_eq!(meminfo_bytes(m, "MemTotal:"), Some(16318412 * 1024));
        assert_eq!(meminfo_bytes(m, "MemAvailable:"), Some(8000000 * 1024));
        assert_eq!(meminfo_bytes(m, "SwapTotal:"), None);
    }
}
