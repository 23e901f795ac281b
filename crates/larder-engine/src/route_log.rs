//! [`RouteLog`]: the routes forward passes took, kept as the tokens of a
//! route trace file (`larder_router::Trace`), each tagged with its sequence,
//! position and phase. It is what `--trace FILE` writes on `larder run`,
//! `larder bench decode` and `larder serve` (where one pass batches rows of
//! many requests).
//!
//! A pass records into a fresh [`RouteTrace`] ([`RouteLog::recorder`]); once
//! it has succeeded its rows are appended with their tags
//! ([`RouteLog::append`]). A pass that failed part-way is never appended, so
//! every token in the log has a route at every MoE layer and the log always
//! makes a valid trace.

use larder_model::config::FfnSpec;
use larder_model::{ModelSpec, RouteTrace};
use larder_router::{Phase, Trace, TraceHeader, TraceToken, TRACE_VERSION};

use crate::output::{OutputError, OutputFile};

/// Where one row of a pass came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowTag {
    /// The sequence (request) it belongs to.
    pub seq: usize,
    /// Its position in that sequence.
    pub pos: usize,
    pub phase: Phase,
}

/// Routes of every appended pass, as trace tokens; see the module doc.
#[derive(Debug, Clone)]
pub struct RouteLog {
    trace: Trace,
    /// Passes appended so far (the next one's number).
    passes: usize,
}

impl RouteLog {
    /// An empty log for `spec`'s MoE layers, recording router lookahead up
    /// to `lookahead` MoE layers (capped at the layers there are);
    /// `model` names where it was loaded from, `expert_bytes` what one
    /// expert's record holds (one cache miss). `None` for a model without
    /// MoE layers (there are no routes to record).
    pub fn new(spec: &ModelSpec, model: &str, expert_bytes: u64, lookahead: usize) -> Option<RouteLog> {
        let moes: Vec<(usize, usize, usize)> = spec
            .layers
            .iter()
            .enumerate()
            .filter_map(|(i, l)| match &l.ffn {
                FfnSpec::Moe(m) => Some((i, m.num_experts, m.top_k)),
                FfnSpec::Dense { .. } => None,
            })
            .collect();
        if moes.is_empty() {
            return None;
        }
        let header = TraceHeader {
            larder_trace: TRACE_VERSION,
            model: model.to_string(),
            experts: moes.iter().map(|m| m.1).max().unwrap_or(0),
            top_k: moes.iter().map(|m| m.2).max().unwrap_or(0),
            moe_layers: moes.iter().map(|m| m.0).collect(),
            expert_bytes: vec![expert_bytes; moes.len()],
            lookahead: lookahead.min(moes.len() - 1),
        };
        Some(RouteLog {
            trace: Trace {
                header,
                tokens: Vec::new(),
            },
            passes: 0,
        })
    }

    /// A fresh recording for the next pass(es), with this log's lookahead.
    pub fn recorder(&self) -> RouteTrace {
        RouteTrace::with_lookahead(self.trace.header.lookahead)
    }

    /// Appends the rows `rt` recorded, pass by pass, row `i` (counting over
    /// all of `rt`'s passes) tagged `tag(i)`; stops at the first row not
    /// recorded at every MoE layer (a pass that failed part-way). Returns the
    /// rows appended.
    pub fn append(&mut self, rt: &RouteTrace, tag: impl Fn(usize) -> RowTag) -> usize {
        let moe_layers = &self.trace.header.moe_layers;
        let route = |layer: usize, row: usize| rt.layers.get(&layer).and_then(|r| r.get(row)).map(|r| r.experts.clone());
        let predicted_at = |layer: usize, depth: usize, row: usize| {
            rt.predicted
                .get(&(layer, depth))
                .and_then(|p| p.get(row))
                .cloned()
                .unwrap_or_default()
        };
        let mut row = 0;
        for &n in &rt.passes {
            for _ in 0..n {
                let Some(routes) = moe_layers.iter().map(|&l| route(l, row)).collect::<Option<Vec<_>>>() else {
                    return row;
                };
                let predicted = (1..=self.trace.header.lookahead)
                    .map(|d| moe_layers.iter().map(|&l| predicted_at(l, d, row)).collect())
                    .collect();
                let t = tag(row);
                self.trace.tokens.push(TraceToken {
                    seq: t.seq,
                    pos: t.pos,
                    phase: t.phase,
                    pass: self.passes,
                    routes,
                    predicted,
                });
                row += 1;
            }
            self.passes += 1;
        }
        row
    }

    /// Tokens appended so far.
    pub fn tokens(&self) -> usize {
        self.trace.tokens.len()
    }

    /// The log as a trace.
    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    /// The log as a trace, taken.
    pub fn into_trace(self) -> Trace {
        self.trace
    }

    /// Writes the log as a trace file, atomically, to an output checked
    /// before the run ([`OutputFile::write_with`]).
    pub fn write(&self, out: &mut OutputFile) -> Result<(), OutputError> {
        out.write_with(|w| self.trace.write_lines(w))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use larder_router::Route;

    fn log() -> RouteLog {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen3_moe_tiny");
        let spec = larder_model::arch::read_spec(&dir).expect("the fixture's config");
        RouteLog::new(&spec, "tiny", 100, 3).expect("a MoE spec")
    }

    fn route(experts: &[usize]) -> Route {
        Route {
            experts: experts.to_vec(),
            weights: vec![1.0 / experts.len() as f32; experts.len()],
        }
    }

    #[test]
    fn appended_passes_make_a_valid_trace() {
        let mut log = log();
        let layers = log.trace().header.moe_layers.clone();
        let mut rt = log.recorder();
        rt.passes = vec![2, 1];
        for &l in &layers {
            rt.layers.insert(l, vec![route(&[0, 1]), route(&[1, 2]), route(&[2, 3])]);
        }
        let tag = |row: usize| RowTag {
            seq: row % 2,
            pos: row,
            phase: if row < 2 { Phase::Prompt } else { Phase::Decode },
        };
        assert_eq!(log.append(&rt, tag), 3);
        assert_eq!(log.append(&rt, tag), 3);
        let t = log.trace();
        assert_eq!(t.tokens.len(), 6);
        assert_eq!(t.tokens.iter().map(|t| t.pass).collect::<Vec<_>>(), [0, 0, 1, 2, 2, 3]);
        assert_eq!(t.tokens[2].phase, Phase::Decode);
        assert_eq!(t.tokens[1].seq, 1);
        t.check().expect("a valid trace");
    }

    #[test]
    fn a_pass_that_failed_part_way_is_left_out() {
        let mut log = log();
        let layers = log.trace().header.moe_layers.clone();
        let mut rt = log.recorder();
        rt.passes = vec![2];
        // Only the first MoE layer ran.
        rt.layers.insert(layers[0], vec![route(&[0]), route(&[1])]);
        let tag = |row: usize| RowTag {
            seq: 0,
            pos: row,
            phase: Phase::Prompt,
        };
        let appended = log.append(&rt, tag);
        assert_eq!(appended, if layers.len() == 1 { 2 } else { 0 });
        log.trace().check().expect("still a valid trace");
    }
}
