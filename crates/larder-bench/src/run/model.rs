//! The model a `bench run` runs: the manifest's folder, or the synthetic
//! model `larder synth` writes (reused when the folder holds the same spec),
//! packed with `larder pack` into `<dir>.store` when the manifest asks.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

use super::manifest::{Manifest, SynthModel};
use super::write_atomic;
use crate::{BenchError, Observer, Result};

/// The model folder to run: the manifest's path, or the synthetic model
/// (written with `larder synth` unless the folder holds the same spec),
/// packed into `<dir>.store` with `pack = true`.
pub fn prepare_model(m: &Manifest, exe: &Path, manifest: &str, observer: &dyn Observer) -> Result<PathBuf> {
    let dir = match (&m.model.path, &m.model.synth) {
        (Some(p), _) => p.clone(),
        (None, Some(s)) => {
            build_synth(s, exe, manifest, observer)?;
            s.out.clone()
        }
        (None, None) => {
            return Err(BenchError::Invalid(format!(
                "manifest {manifest}: [model]: give model.path or a [model.synth] table"
            )))
        }
    };
    if !m.model.pack || larder_store::Manifest::is_store(&dir) {
        return Ok(dir);
    }
    let mut store = dir.clone().into_os_string();
    store.push(".store");
    let store = PathBuf::from(store);
    if larder_store::Manifest::is_store(&store) {
        observer.note(&format!("[larder] reusing the packed store {}", store.display()));
        return Ok(store);
    }
    observer.note(&format!("[larder] packing {} into {} ...", dir.display(), store.display()));
    let out = Command::new(exe)
        .args(["pack", "--model"])
        .arg(&dir)
        .arg("--out")
        .arg(&store)
        .arg("--json")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| BenchError::io("cannot run larder pack", e))?;
    if !out.status.success() {
        return Err(BenchError::Failed(format!(
            "manifest {manifest}: model.pack: larder pack failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(store)
}

/// `[model.synth]` as results.json and bench-synth.json record it.
pub fn synth_json(s: &SynthModel) -> Value {
    json!({"arch": s.arch, "preset": s.preset, "experts_format": s.experts_format, "experts_gib": s.experts_gib,
           "routing": s.routing, "seed": s.seed, "out": s.out})
}

/// Writes the synthetic model unless `s.out` already holds one of the same
/// spec (config.json's larder_synth and bench-synth.json say so).
fn build_synth(s: &SynthModel, exe: &Path, manifest: &str, observer: &dyn Observer) -> Result<()> {
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
            observer.note(&format!("[larder] reusing the synthetic model {}", s.out.display()));
            return Ok(());
        }
        return Err(BenchError::Invalid(format!(
            "manifest {manifest}: model.synth.out {} holds a different model (not this [model.synth] spec); \
             remove it or choose another out",
            s.out.display()
        )));
    }
    observer.note(&format!("[larder] writing the synthetic model {} ...", s.out.display()));
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
        .map_err(|e| BenchError::io("cannot run larder synth", e))?;
    if !out.status.success() {
        return Err(BenchError::Failed(format!(
            "manifest {manifest}: model.synth: larder synth failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    write_atomic(&stamp, &serde_json::to_vec_pretty(&want)?)
}
