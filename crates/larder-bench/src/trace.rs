//! Route traces recorded by a run ([`larder_model::RouteTrace`]) as trace
//! files (the format: `larder_router::Trace`), for `--trace FILE` on `run`,
//! `serve` and `bench decode`, and for synth's routing statistics.

use std::path::Path;

use larder_engine::{RouteLog, RowTag};
use larder_model::{ModelSpec, RouteTrace};
use larder_router::{Phase, Trace};

use crate::{BenchError, Result};

/// MoE layers ahead whose routers a recorded trace asks on each layer's input.
pub const LOOKAHEAD: usize = 3;

/// The trace file of one recorded turn: rows `0..prompt_len` are the prompt.
pub fn to_file(rt: &RouteTrace, spec: &ModelSpec, model: &Path, prompt_len: usize, expert_bytes: u64) -> Result<Trace> {
    let Some(mut log) = RouteLog::new(spec, &model.display().to_string(), expert_bytes, rt.lookahead) else {
        return Err(BenchError::Invalid(format!(
            "--trace: {} has no MoE layers, so there are no routes to record",
            model.display()
        )));
    };
    log.append(rt, |row| RowTag {
        seq: 0,
        pos: row,
        phase: if row < prompt_len { Phase::Prompt } else { Phase::Decode },
    });
    let trace = log.into_trace();
    trace
        .check()
        .map_err(|e| BenchError::Failed(format!("internal: the recorded trace is inconsistent: {e}")))?;
    Ok(trace)
}
