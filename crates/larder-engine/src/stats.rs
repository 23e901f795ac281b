//! The statistics every generation reports (`stats` in `larder run --json`).

use serde::Serialize;

/// Timing and throughput of one generation.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Stats {
    pub prompt_tokens: usize,
    /// Prompt tokens whose state was reused instead of prefilled (by
    /// rollback, or for a recurrent model by restoring a snapshot).
    pub cached_tokens: usize,
    pub new_tokens: usize,
    /// Time to run the prompt through the model (to the first token's logits).
    pub prefill_s: f64,
    /// Time of every later forward pass (one per token after the first).
    pub decode_s: f64,
    /// Prefilled (not reused) prompt tokens per second of prefill.
    pub prefill_tok_per_s: f64,
    /// Steady decode rate: forward passes after the first token per second.
    pub decode_tok_per_s: f64,
    /// From the start of the request to the first new token.
    pub time_to_first_token_s: f64,
    /// The process's peak resident memory so far (`VmHWM`, Linux; 0 where
    /// unknown): model, RAM cache, buffers, everything.
    pub peak_rss_bytes: u64,
    /// Bytes of the sequence's model state at the end of the request:
    /// `state_fixed_bytes + positions x state_bytes_per_position`.
    pub state_bytes: usize,
    /// Bytes a sequence holds whatever its length (recurrent layers' states,
    /// both buffers; 0 for a KV-only model).
    pub state_fixed_bytes: usize,
    /// Bytes each position adds, the KV bytes per token (every attention
    /// layer's cache, f32: keys and values for GQA; the compressed latent
    /// and rope key for MLA's compact cache).
    pub state_bytes_per_position: usize,
    /// Bytes of the snapshots kept at the end of the request to return to
    /// (`crate::return_points`; 0 for a KV-only model).
    pub snapshot_bytes: usize,
    /// Expert streaming counters (absent when every expert is in RAM).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub experts: Option<ExpertStats>,
    /// Speculative decoding counters (absent without a drafter).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculative: Option<SpeculativeStats>,
}

/// What speculative decoding did during one request.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct SpeculativeStats {
    pub drafter: String,
    pub drafted: u64,
    pub accepted: u64,
    pub acceptance_rate: f64,
    /// Drafted tokens kept per verification pass.
    pub mean_accepted: f64,
    pub verify_steps: u64,
    /// Target forwards during decode (verification passes and plain steps).
    pub target_steps: u64,
    pub draft_s: f64,
    /// Drafting was switched off mid-request (it stopped paying).
    pub disabled: bool,
}

impl From<&larder_spec::SpecStats> for SpeculativeStats {
    fn from(s: &larder_spec::SpecStats) -> Self {
        SpeculativeStats {
            drafter: s.drafter.clone(),
            drafted: s.drafted,
            accepted: s.accepted,
            acceptance_rate: s.acceptance_rate(),
            mean_accepted: s.mean_accepted(),
            verify_steps: s.verify_steps,
            target_steps: s.target_steps,
            draft_s: s.draft_s,
            disabled: s.disabled,
        }
    }
}

/// What streaming experts cost during one request.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ExpertStats {
    /// I/O backend (`pread`, `uring`, `mmap`).
    pub io_backend: String,
    pub expert_bytes_read: u64,
    pub expert_reads: u64,
    /// Demands served without a read of their own (cache, or a prefetch).
    pub cache_hits: u64,
    /// Demands read on the spot.
    pub cache_misses: u64,
    pub hit_rate: f64,
    /// Records read in the background on a prediction of the next layer's experts.
    pub prefetch_reads: u64,
    /// Demands a prefetch had read (or was reading).
    pub prefetch_hits: u64,
    /// Time the compute thread waited for expert reads.
    pub io_wait_s: f64,
    /// Time spent checking record digests.
    pub verify_s: f64,
    /// Bytes read per second of I/O wait.
    pub effective_gbps: f64,
    /// Per MoE layer.
    pub layers: Vec<LayerHits>,
    /// Expert bytes read from each drive, as fetched (index: the store's
    /// drive; a mirror drive that is not one of them comes last).
    pub drive_bytes: Vec<u64>,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct LayerHits {
    pub layer: usize,
    pub hits: u64,
    pub misses: u64,
    pub hit_rate: f64,
    /// Records of the layer prefetched, and the share of them a demand used
    /// (precision) and of its uncached demands prefetch supplied (recall).
    pub prefetch_reads: u64,
    pub prefetch_precision: f64,
    pub prefetch_recall: f64,
}

impl ExpertStats {
    /// From the store's counters over one request.
    pub(crate) fn from_store(backend: &str, s: &larder_store::StoreStats) -> ExpertStats {
        ExpertStats {
            io_backend: backend.to_string(),
            expert_bytes_read: s.bytes_read,
            expert_reads: s.reads,
            cache_hits: s.hits,
            cache_misses: s.misses,
            hit_rate: s.hit_rate(),
            prefetch_reads: s.prefetch_reads,
            prefetch_hits: s.prefetch_hits,
            io_wait_s: s.io_wait_s,
            verify_s: s.verify_s,
            effective_gbps: s.effective_gbps(),
            layers: s
                .layers
                .iter()
                .enumerate()
                .filter(|(_, c)| c.hits + c.misses > 0)
                .map(|(layer, c)| LayerHits {
                    layer,
                    hits: c.hits,
                    misses: c.misses,
                    hit_rate: c.hits as f64 / (c.hits + c.misses) as f64,
                    prefetch_reads: c.prefetch_reads,
                    prefetch_precision: c.prefetch_precision(),
                    prefetch_recall: c.prefetch_recall(),
                })
                .collect(),
            drive_bytes: s.drive_bytes.clone(),
        }
    }
}

impl Stats {
    /// Records the size of a sequence's state (and its kept snapshots) at
    /// the end of a request.
    pub(crate) fn record_state(&mut self, state: &larder_model::SequenceState, snapshot_bytes: usize) {
        self.state_bytes = state.bytes();
        self.state_bytes_per_position = (0..state.num_layers())
            .filter_map(|l| state.layer(l))
            .map(larder_model::LayerState::bytes_per_position)
            .sum();
        self.state_fixed_bytes = self.state_bytes.saturating_sub(state.len() * self.state_bytes_per_position);
        self.snapshot_bytes = snapshot_bytes;
    }

    /// Fills the derived rates.
    pub fn finish(&mut self, decode_steps: usize) {
        self.prefill_tok_per_s = rate(self.prompt_tokens - self.cached_tokens, self.prefill_s);
        self.decode_tok_per_s = rate(decode_steps, self.decode_s);
        self.peak_rss_bytes = peak_rss_bytes();
    }
}

/// The process's peak resident set size (`VmHWM` in /proc/self/status), or
/// 0 where the system does not say.
pub(crate) fn peak_rss_bytes() -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn rate(n: usize, s: f64) -> f64 {
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}
