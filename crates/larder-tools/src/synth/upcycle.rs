//! `larder synth --from-dense`: a dense checkpoint upcycled into an MoE whose
//! experts are copies of its MLP (`larder_model::upcycle`), in the layout its
//! `model_type` calls for unless one is given.

use std::path::{Path, PathBuf};
use std::time::Instant;

use larder_model::{upcycle, UpcycleLayout, UpcycleReport, UpcycleSpec};
use serde_json::{json, Value};

use crate::{Result, ToolsError};

/// What to upcycle (the CLI's flags).
#[derive(Debug, Clone)]
pub struct UpcycleOptions {
    /// The dense checkpoint.
    pub source: PathBuf,
    pub out: PathBuf,
    /// Routed experts per layer (default 8) and experts per token (default 2).
    pub experts: Option<usize>,
    pub top_k: Option<usize>,
    /// `mixtral` or `qwen3_moe` (None: from the source's model_type).
    pub layout: Option<String>,
    /// Seed of the random routers.
    pub seed: u64,
}

/// What an upcycle wrote.
pub struct Upcycled {
    pub spec: UpcycleSpec,
    pub report: UpcycleReport,
    pub seconds: f64,
}

impl Upcycled {
    /// `larder synth --from-dense --json`'s document: the report with `out`, `spec` and `seconds`.
    pub fn to_json(&self) -> Result<Value> {
        let mut doc = serde_json::to_value(&self.report)?;
        doc["out"] = json!(self.spec.out);
        doc["spec"] = serde_json::to_value(&self.spec)?;
        doc["seconds"] = json!(self.seconds);
        Ok(doc)
    }
}

/// The spec `opts` asks for, checked.
pub fn plan(opts: &UpcycleOptions) -> Result<UpcycleSpec> {
    let layout = match &opts.layout {
        Some(l) => UpcycleLayout::parse(l).ok_or_else(|| ToolsError::Invalid("--layout: use mixtral or qwen3_moe".into()))?,
        None => default_layout(&opts.source)?,
    };
    let spec = UpcycleSpec {
        source: opts.source.clone(),
        out: opts.out.clone(),
        experts: opts.experts.unwrap_or(8),
        top_k: opts.top_k.unwrap_or(2),
        layout,
        seed: opts.seed,
    };
    if spec.top_k > spec.experts {
        return Err(ToolsError::Invalid(format!(
            "--top-k {} must be between 1 and the number of experts ({}, --experts)",
            spec.top_k, spec.experts
        )));
    }
    Ok(spec)
}

/// Upcycles `spec`, `progress(done, total)` following the bytes written.
pub fn run(spec: UpcycleSpec, progress: &mut dyn FnMut(u64, u64)) -> Result<Upcycled> {
    let started = Instant::now();
    let report = upcycle(&spec, progress)?;
    Ok(Upcycled {
        spec,
        report,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The layout a source's `model_type` upcycles to (mixtral when unknown: the upcycle names the problem).
fn default_layout(source: &Path) -> Result<UpcycleLayout> {
    let path = source.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| ToolsError::io(format!("--from-dense: cannot read {}", path.display()), e))?;
    let cfg: Value =
        serde_json::from_str(&text).map_err(|e| ToolsError::Invalid(format!("--from-dense: {} is not valid JSON: {e}", path.display())))?;
    let model_type = cfg["model_type"].as_str().unwrap_or_default();
    Ok(UpcycleLayout::for_source(model_type).unwrap_or(UpcycleLayout::Mixtral))
}
