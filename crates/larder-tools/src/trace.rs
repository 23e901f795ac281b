//! Route-trace tooling: `larder trace synth` (a decode trace drawn from a
//! routing preset for a model's MoE shape, `larder_router::RoutingModel`) and
//! `larder trace stats` (popularity, reuse distances, lookahead recall, and
//! the hit rates LRU and Belady's optimum reach at a range of cache budgets).

use std::path::{Path, PathBuf};

use larder_bench::cache::{hit_curves, Curve, BELADY, DEFAULT_SHARES};
use larder_router::{Phase, RouteStats, Trace, TraceHeader, TRACE_VERSION};
use serde_json::{json, Value};

use crate::{Result, ToolsError};

/// A model's MoE shape, as a trace records it.
#[derive(Debug, Clone, Copy)]
pub struct MoeShape {
    pub experts_per_layer: usize,
    pub top_k: usize,
    pub moe_layers: usize,
    /// Bytes of one routed expert (what one miss reads).
    pub expert_bytes: u64,
}

/// What `trace synth` draws.
#[derive(Debug, Clone)]
pub struct TraceSynthOptions {
    /// The model the shape is from (named in the trace and in errors).
    pub model: PathBuf,
    pub shape: MoeShape,
    /// Routing preset: uniform, local, skewed, mixed.
    pub routing: String,
    /// Decode tokens to draw, and the seed of the draw.
    pub tokens: usize,
    pub seed: u64,
}

/// A decode trace drawn from `opts.routing` for `opts.shape`.
pub fn synth(opts: &TraceSynthOptions) -> Result<Trace> {
    let s = opts.shape;
    if s.moe_layers == 0 || s.expert_bytes == 0 {
        return Err(ToolsError::Invalid(format!(
            "--model {}: has no routed experts",
            opts.model.display()
        )));
    }
    let model = larder_router::RoutingModel::preset(&opts.routing, s.experts_per_layer)
        .map_err(|e| ToolsError::Invalid(format!("--routing: {e}")))?;
    let header = TraceHeader {
        larder_trace: TRACE_VERSION,
        model: format!("{} (preset {})", opts.model.display(), opts.routing),
        experts: s.experts_per_layer,
        top_k: s.top_k,
        moe_layers: (0..s.moe_layers).collect(),
        expert_bytes: vec![s.expert_bytes; s.moe_layers],
        lookahead: 0,
    };
    model
        .trace(header, opts.tokens, opts.seed)
        .map_err(|e| ToolsError::Invalid(format!("--model {} (--tokens {}): {e}", opts.model.display(), opts.tokens)))
}

/// What `trace stats` found.
pub struct TraceStats {
    pub path: PathBuf,
    pub trace: Trace,
    /// Over every token, and over decode tokens only.
    pub all: RouteStats,
    pub decode: RouteStats,
    /// LRU and Belady's hit rates at [`DEFAULT_SHARES`] of the bank.
    pub curves: Vec<Curve>,
}

impl TraceStats {
    /// `larder trace stats --json`'s document.
    pub fn to_json(&self) -> Value {
        json!({
            "trace": self.path,
            "header": self.trace.header,
            "passes": self.trace.passes().len(),
            "all": self.all,
            "decode": self.decode,
            "hit_curves": self.curves,
        })
    }
}

/// Reads the trace at `path` and computes its statistics.
pub fn stats(path: &Path) -> Result<TraceStats> {
    let trace = Trace::read(path).map_err(larder_bench::BenchError::from)?;
    let all = trace.route_stats(None);
    let decode = trace.route_stats(Some(Phase::Decode));
    let curves = hit_curves(&trace, &DEFAULT_SHARES, &["lru", BELADY])
        .map_err(|e| ToolsError::from(e).during(format!("{}: replaying it", path.display())))?;
    Ok(TraceStats {
        path: path.to_path_buf(),
        trace,
        all,
        decode,
        curves,
    })
}
