//! Benchmark manifests (`bench/manifests/*.toml`) for `larder bench run`:
//! a named scenario, a model (a folder or a synthetic spec), arms, and a
//! workload. Unknown keys and impossible values are refused with an error
//! naming the key and the file.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::{BenchError, Result};

/// One manifest file, as written.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub scenario: Scenario,
    pub model: ModelSpec,
    #[serde(rename = "arm", default)]
    pub arms: Vec<Arm>,
    pub workload: Workload,
}

/// `[scenario]`.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Times every (prompt, arm) pair runs, interleaved: A B C A B C.
    #[serde(default = "one")]
    pub rounds: usize,
}

/// `[model]`: `path = "DIR"` or a `[model.synth]` table.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    pub path: Option<PathBuf>,
    pub synth: Option<SynthModel>,
    /// Pack the model into `<path>.store` (kept and reused) and run from the store.
    #[serde(default)]
    pub pack: bool,
}

/// `[model.synth]`: the arguments of `larder synth`.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct SynthModel {
    pub arch: String,
    pub preset: String,
    pub experts_format: Option<String>,
    pub experts_gib: Option<f64>,
    #[serde(default = "uniform")]
    pub routing: String,
    #[serde(default)]
    pub seed: u64,
    pub out: PathBuf,
}

/// `[[arm]]`.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct Arm {
    pub name: String,
    /// "25%" of the expert bank, or a size ("512MiB", "0").
    pub ram_budget: String,
    #[serde(default = "uring")]
    pub io: String,
    /// Prefetch threads (0: off).
    #[serde(default = "two")]
    pub prefetch: usize,
    /// A cgroup v2 memory limit for the run (a size), when permitted.
    pub memory_limit: Option<String>,
    /// The arm whose output ids every other arm must equal (default: the first).
    #[serde(default)]
    pub oracle: bool,
}

/// `[workload]`.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    pub prompt_tokens: Vec<usize>,
    pub new_tokens: usize,
    #[serde(default = "seven")]
    pub seed: u64,
    /// Records read to measure the drive limit before and after each run.
    #[serde(default = "ninety_six")]
    pub limit_records: usize,
}

fn one() -> usize {
    1
}
fn two() -> usize {
    2
}
fn seven() -> u64 {
    7
}
fn ninety_six() -> usize {
    96
}
fn uniform() -> String {
    "uniform".into()
}
fn uring() -> String {
    "uring".into()
}

/// Most rounds, prompt lengths or tokens a manifest may ask for.
const MAX_COUNT: usize = 1 << 20;

/// A RAM budget as written: a share of the expert bank or bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    Share(f64),
    Bytes(u64),
}

impl Budget {
    pub fn parse(text: &str) -> Result<Budget, String> {
        let t = text.trim();
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p.trim().parse().map_err(|_| format!("{text:?} is not a percentage"))?;
            if !(v.is_finite() && v > 0.0 && v <= 100.0) {
                return Err(format!("{text:?}: a share must be above 0% and at most 100%"));
            }
            return Ok(Budget::Share(v / 100.0));
        }
        larder_store::parse_size(t).map(Budget::Bytes)
    }

    /// Bytes for an expert bank of `bank` bytes.
    pub fn bytes(self, bank: u64) -> u64 {
        match self {
            Budget::Share(s) => (bank as f64 * s).round() as u64,
            Budget::Bytes(b) => b,
        }
    }
}

impl Manifest {
    /// Reads and checks `path`; relative model paths are resolved against the manifest's folder.
    pub fn load(path: &Path) -> Result<Manifest> {
        let text = std::fs::read_to_string(path).map_err(|e| BenchError::io(format!("cannot read manifest {}", path.display()), e))?;
        let mut m: Manifest = toml::from_str(&text).map_err(|e| BenchError::Invalid(format!("manifest {}: {e}", path.display())))?;
        let base = path.parent().unwrap_or(Path::new("."));
        let resolve = |p: &Path| if p.is_absolute() { p.to_path_buf() } else { base.join(p) };
        if let Some(p) = &m.model.path {
            m.model.path = Some(resolve(p));
        }
        if let Some(s) = &mut m.model.synth {
            s.out = resolve(&s.out);
        }
        m.check()
            .map_err(|e| BenchError::Invalid(format!("manifest {}: {e}", path.display())))?;
        Ok(m)
    }

    /// Value checks that need no model: each error names its key.
    fn check(&self) -> Result<(), String> {
        let s = &self.scenario;
        if s.name.is_empty() || !s.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(format!("scenario.name {:?}: use letters, digits, '-' and '_'", s.name));
        }
        if s.rounds == 0 || s.rounds > MAX_COUNT {
            return Err(format!("scenario.rounds = {}: use 1 to {MAX_COUNT}", s.rounds));
        }
        self.model.check()?;
        if self.arms.is_empty() {
            return Err("no [[arm]]: give at least one arm".into());
        }
        let mem_total = mem_total();
        let mem_available = larder_engine::mem_available();
        for (i, a) in self.arms.iter().enumerate() {
            let key = format!("arm[{i}]");
            if a.name.is_empty() || !a.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                return Err(format!("{key}.name {:?}: use letters, digits, '-' and '_'", a.name));
            }
            if self.arms[..i].iter().any(|b| b.name == a.name) {
                return Err(format!("{key}.name {:?}: two arms have this name", a.name));
            }
            a.check(mem_total, mem_available)?;
        }
        let oracles: Vec<&str> = self.arms.iter().filter(|a| a.oracle).map(|a| a.name.as_str()).collect();
        if oracles.len() > 1 {
            return Err(format!(
                "oracle: only one arm may set oracle = true (set in {})",
                oracles.join(", ")
            ));
        }
        self.workload.check()
    }

    /// Index of the oracle arm.
    pub fn oracle(&self) -> usize {
        self.arms.iter().position(|a| a.oracle).unwrap_or(0)
    }
}

impl ModelSpec {
    /// `[model]`: a model folder that exists, or a synthetic spec synth can write.
    fn check(&self) -> Result<(), String> {
        match (&self.path, &self.synth) {
            (Some(_), Some(_)) => Err("[model]: give either model.path or [model.synth], not both".into()),
            (None, None) => Err("[model]: give model.path or a [model.synth] table".into()),
            (Some(p), None) => {
                if !p.join("config.json").is_file() && !larder_store::Manifest::is_store(p) {
                    return Err(format!(
                        "model.path {}: no such model (no config.json or packed store there)",
                        p.display()
                    ));
                }
                Ok(())
            }
            (None, Some(syn)) => syn.check(),
        }
    }
}

impl SynthModel {
    /// `[model.synth]`: values `larder synth` accepts.
    fn check(&self) -> Result<(), String> {
        if !larder_model::synth::ARCHITECTURES.contains(&self.arch.as_str()) {
            return Err(format!(
                "model.synth.arch {:?}: use one of {}",
                self.arch,
                larder_model::synth::ARCHITECTURES.join(", ")
            ));
        }
        if !larder_model::synth::ROUTINGS.contains(&self.routing.as_str()) {
            return Err(format!(
                "model.synth.routing {:?}: use one of {}",
                self.routing,
                larder_model::synth::ROUTINGS.join(", ")
            ));
        }
        if let Some(f) = &self.experts_format {
            if !["bf16", "int4", "mxfp4"].contains(&f.as_str()) {
                return Err(format!("model.synth.experts_format {f:?}: use bf16, int4 or mxfp4"));
            }
        }
        if let Some(g) = self.experts_gib {
            if !(g.is_finite() && g > 0.0 && g <= 65536.0) {
                return Err(format!("model.synth.experts_gib = {g}: use a size above 0 and at most 65536"));
            }
        }
        Ok(())
    }
}

impl Arm {
    /// One arm's budget, backend, prefetch and memory limit (its name is checked by the manifest).
    fn check(&self, mem_total: Option<u64>, mem_available: Option<u64>) -> Result<(), String> {
        let budget = Budget::parse(&self.ram_budget).map_err(|e| format!("arm {:?} ram_budget: {e}", self.name))?;
        if let (Budget::Bytes(b), Some(avail)) = (budget, mem_available) {
            if b > avail {
                return Err(format!(
                    "arm {:?} ram_budget = {:?} is larger than the RAM available ({})",
                    self.name,
                    self.ram_budget,
                    larder_store::format_size(avail)
                ));
            }
        }
        if larder_store::io::IoKind::parse(&self.io).is_none() {
            return Err(format!("arm {:?} io = {:?}: use uring, pread or mmap", self.name, self.io));
        }
        if self.prefetch > 64 {
            return Err(format!(
                "arm {:?} prefetch = {}: use 0 (off) to 64 threads",
                self.name, self.prefetch
            ));
        }
        let Some(l) = &self.memory_limit else {
            return Ok(());
        };
        let bytes = larder_store::parse_size(l).map_err(|e| format!("arm {:?} memory_limit: {e}", self.name))?;
        if bytes == 0 {
            return Err(format!("arm {:?} memory_limit = {l:?}: must be above 0", self.name));
        }
        match mem_total {
            Some(total) if bytes > total => Err(format!(
                "arm {:?} memory_limit = {l:?} is larger than the machine's RAM ({})",
                self.name,
                larder_store::format_size(total)
            )),
            _ => Ok(()),
        }
    }
}

impl Workload {
    /// `[workload]`: prompt lengths, new tokens and drive-limit records in range.
    fn check(&self) -> Result<(), String> {
        if self.prompt_tokens.is_empty() {
            return Err("workload.prompt_tokens: give at least one prompt length".into());
        }
        if let Some(p) = self.prompt_tokens.iter().find(|&&p| p == 0 || p > MAX_COUNT) {
            return Err(format!("workload.prompt_tokens: {p} is out of range (1 to {MAX_COUNT})"));
        }
        if self.new_tokens < 2 || self.new_tokens > MAX_COUNT {
            return Err(format!("workload.new_tokens = {}: use 2 to {MAX_COUNT}", self.new_tokens));
        }
        if self.limit_records == 0 || self.limit_records > MAX_COUNT {
            return Err(format!("workload.limit_records = {}: use 1 to {MAX_COUNT}", self.limit_records));
        }
        Ok(())
    }
}

/// MemTotal from /proc/meminfo.
pub fn mem_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse() {
        assert_eq!(Budget::parse("25%"), Ok(Budget::Share(0.25)));
        assert_eq!(Budget::parse("1KiB"), Ok(Budget::Bytes(1024)));
        assert!(Budget::parse("0%").is_err());
        assert!(Budget::parse("120%").is_err());
        assert_eq!(Budget::Share(0.5).bytes(1000), 500);
    }

    #[test]
    fn shipped_manifests_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/manifests");
        for name in ["smoke.toml", "k3mini-routing.toml", "store-backends.toml"] {
            let text = std::fs::read_to_string(dir.join(name)).unwrap();
            let m: Manifest = toml::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(!m.arms.is_empty(), "{name}");
            for a in &m.arms {
                Budget::parse(&a.ram_budget).unwrap();
            }
        }
    }

    #[test]
    fn unknown_keys_are_named() {
        let e =
            toml::from_str::<Manifest>("[scenario]\nname='a'\nbogus=1\n[model]\npath='x'\n[workload]\nprompt_tokens=[1]\nnew_tokens=2\n")
                .unwrap_err()
                .to_string();
        assert!(e.contains("bogus"), "{e}");
    }
}
