//! The work of `larder synth`: a synthetic checkpoint (real layout, random
//! weights, any size) planned from a preset and the caller's overrides,
//! written with `larder_model::synth`, and its routing measured by a short
//! greedy decode ([`routing`]); or a dense checkpoint upcycled into an MoE of
//! copied experts ([`upcycle`]).

pub mod routing;
pub mod upcycle;

use std::path::{Path, PathBuf};
use std::time::Instant;

use larder_model::synth::{write, ExpertsFormat, Routing, SynthSpec};
use serde_json::{json, Value};

use crate::{Result, ToolsError};

/// What to write (the CLI's flags; `None`: the preset's).
#[derive(Debug, Clone, Default)]
pub struct SynthOptions {
    pub arch: String,
    pub preset: String,
    pub experts_format: Option<String>,
    pub experts_gib: Option<f64>,
    pub layers: Option<usize>,
    pub experts: Option<usize>,
    pub top_k: Option<usize>,
    /// Latent experts of this width (K3's `routed_expert_hidden_size`; kimi_linear, kimi_k3).
    pub routed_expert_hidden_size: Option<usize>,
    /// `latent_moe_use_norm` (default: true with latent experts, as K3 ships).
    pub latent_moe_use_norm: Option<bool>,
    pub vocab: Option<usize>,
    pub seed: u64,
    pub routing: String,
    pub routing_skew: Option<f64>,
    pub routing_locality: Option<f64>,
    pub routing_drift: Option<f64>,
    /// Tokens of greedy decoding used to measure routing (below 2: none).
    pub measure_tokens: usize,
    /// Output folder.
    pub out: PathBuf,
}

fn invalid(message: String) -> ToolsError {
    ToolsError::Invalid(message)
}

/// The spec `opts` asks for, checked before anything is written.
pub fn plan(opts: &SynthOptions) -> Result<SynthSpec> {
    let mut spec = SynthSpec::preset(&opts.arch, &opts.preset, opts.experts_gib).map_err(invalid)?;
    if let Some(n) = opts.routed_expert_hidden_size {
        if spec.kda.is_none() {
            return Err(invalid(format!(
                "--routed-expert-hidden-size: latent experts are a Kimi K3 extension, written for --arch kimi_linear \
                 and kimi_k3, not {}",
                spec.arch
            )));
        }
        spec.routed_expert_hidden_size = Some(n);
        spec.latent_moe_use_norm = true;
    }
    if let Some(norm) = opts.latent_moe_use_norm {
        if norm && spec.routed_expert_hidden_size.is_none() {
            return Err(invalid(
                "--latent-moe-use-norm true: there are no latent experts to normalise (give --routed-expert-hidden-size)".into(),
            ));
        }
        spec.latent_moe_use_norm = norm;
    }
    spec.check_latent().map_err(invalid)?;
    if let Some(f) = &opts.experts_format {
        let format = ExpertsFormat::parse(f).map_err(invalid)?;
        spec.set_experts_format(format).map_err(invalid)?;
    }
    spec.check_packable().map_err(invalid)?;
    if let Some(gib) = opts.experts_gib {
        // Latent or 4-bit experts are smaller: size the bank at their stored size.
        spec.size_experts(gib).map_err(invalid)?;
    }
    spec.layers = opts.layers.unwrap_or(spec.layers);
    spec.experts = opts.experts.unwrap_or(spec.experts);
    spec.top_k = opts.top_k.unwrap_or(spec.top_k);
    spec.vocab = opts.vocab.unwrap_or(spec.vocab);
    if spec.top_k < 1 || spec.top_k > spec.experts {
        return Err(invalid(format!(
            "--top-k must be between 1 and the number of experts ({})",
            spec.experts
        )));
    }
    check_groups(&spec)?;
    spec.seed = opts.seed;
    spec.routing = Routing::parse(&opts.routing).map_err(invalid)?;
    if opts.routing_skew.is_some() || opts.routing_locality.is_some() || opts.routing_drift.is_some() {
        let mut k = spec.routing.knobs();
        k.skew = opts.routing_skew.unwrap_or(k.skew);
        k.locality = opts.routing_locality.unwrap_or(k.locality);
        k.drift = opts.routing_drift.unwrap_or(k.drift);
        k.check().map_err(invalid)?;
        spec.routing_knobs = Some(k);
    }
    Ok(spec)
}

/// Grouped routing (deepseek_v3, kimi_linear) needs `--experts` in whole groups of at
/// least 2 and enough experts in the eligible groups for `--top-k`: refused before
/// anything is written rather than when the written checkpoint is loaded.
fn check_groups(spec: &SynthSpec) -> Result<()> {
    let Some(d) = &spec.deepseek else {
        return Ok(());
    };
    if !(spec.experts.is_multiple_of(d.n_group) && spec.experts / d.n_group >= 2) {
        return Err(invalid(format!(
            "--experts {} must be a multiple of the preset's {} expert groups with at least 2 experts per group",
            spec.experts, d.n_group
        )));
    }
    let eligible = spec.experts / d.n_group * d.topk_group;
    if spec.top_k > eligible {
        return Err(invalid(format!(
            "--top-k {} is more than the {eligible} experts of the {} groups routing may choose (--experts {})",
            spec.top_k, d.topk_group, spec.experts
        )));
    }
    Ok(())
}

/// Readies `out` for `spec`: refuses a folder holding a checkpoint or a file
/// system without room, removes what an interrupted synth left; the bytes to write.
pub fn prepare_out(spec: &SynthSpec, out: &Path) -> Result<u64> {
    if out.join("config.json").exists() {
        return Err(invalid(format!(
            "{} already holds a checkpoint (config.json); choose another --out",
            out.display()
        )));
    }
    let bytes = spec
        .total_bytes()
        .map_err(|e| ToolsError::from(e).during("cannot plan the synthetic tensors"))?;
    let removed = larder_model::synth::remove_leftovers(out)?;
    if !removed.is_empty() {
        tracing::info!("removed {} files an interrupted synth left in {}", removed.len(), out.display());
    }
    check_free_space(out, bytes)?;
    Ok(bytes)
}

/// Refuses before writing when the file system `out` is on has less free
/// space than the checkpoint's `bytes` (plus its small files).
fn check_free_space(out: &Path, bytes: u64) -> Result<()> {
    let Some(dir) = out.ancestors().find(|d| d.is_dir()) else {
        return Ok(());
    };
    let Ok(space) = larder_store::drive::fs_space(dir) else {
        return Ok(());
    };
    let need = bytes + (1 << 20);
    if space.free < need {
        return Err(invalid(format!(
            "--out {}: the checkpoint needs {}, but only {} is free there; free space, choose another --out, or \
             lower --experts-gib",
            out.display(),
            larder_store::format_size(need),
            larder_store::format_size(space.free)
        )));
    }
    Ok(())
}

/// What `larder synth` wrote and measured.
pub struct SynthReport {
    pub out: PathBuf,
    pub spec: SynthSpec,
    /// Files written, and their bytes.
    pub files: usize,
    pub bytes: u64,
    /// Seconds writing.
    pub seconds: f64,
    /// The routing measured after writing (None: `measure_tokens` below 2).
    pub measured: Option<routing::Measured>,
    pub measure_tokens: usize,
}

impl SynthReport {
    /// The share of experts uniform routing makes consecutive tokens share (top_k / experts).
    pub fn expected_overlap(&self) -> f64 {
        self.spec.top_k as f64 / self.spec.experts as f64
    }

    /// `larder synth --json`'s document.
    pub fn to_json(&self) -> Value {
        let spec = &self.spec;
        let measured = self.measured.as_ref();
        json!({
            "out": self.out,
            "spec": spec,
            "routing_knobs": spec.knobs(),
            "files": self.files,
            "bytes": self.bytes,
            "expert_bytes": spec.total_expert_bytes(),
            "expert_record_bytes": spec.expert_bytes(),
            "seconds": self.seconds,
            "routing_overlap": measured.map(|m| json!({
                "mean": m.overlap,
                "expected_uniform": self.expected_overlap(),
                "tokens": self.measure_tokens,
                "per_layer": m.per_layer.iter().map(|(l, v)| json!({"layer": l, "overlap": v})).collect::<Vec<_>>(),
            })),
            "routing_stats": measured.map(|m| &m.stats),
        })
    }
}

/// Writes `spec` into `opts.out` (readied by [`prepare_out`]), `progress`
/// following the bytes written; routing is not measured yet ([`measure`]).
pub fn write_checkpoint(spec: SynthSpec, opts: &SynthOptions, progress: &mut dyn FnMut(u64)) -> Result<SynthReport> {
    let started = Instant::now();
    let files =
        write(&spec, &opts.out, progress).map_err(|e| ToolsError::from(e).during(format!("cannot write {}", opts.out.display())))?;
    let bytes: u64 = files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
    Ok(SynthReport {
        out: opts.out.clone(),
        spec,
        files: files.len(),
        bytes,
        seconds: started.elapsed().as_secs_f64(),
        measured: None,
        measure_tokens: opts.measure_tokens,
    })
}

/// Measures the written checkpoint's routing when `measure_tokens` asks for it (2 tokens or more).
pub fn measure(report: &mut SynthReport) -> Result<()> {
    if report.measure_tokens > 1 {
        report.measured = Some(routing::measure_routing(&report.out, report.measure_tokens, &report.spec)?);
    }
    Ok(())
}
