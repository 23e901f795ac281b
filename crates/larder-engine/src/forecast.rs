//! The decode and time-to-first-token forecast behind `larder plan`: from a
//! model's sizes, the cache hit rate a routing trace or preset reaches at the
//! planned budget (the store's simulator computes it), router lookahead
//! recall, and measured machine figures (drives, RAM, kernels), how fast
//! decoding will be and which resource binds.
//!
//! Per decode token, with `m` the routed-expert bytes that miss the cache:
//! - disk: `m / drives` seconds, all drives reading in parallel;
//! - RAM: the active weights (the spine but for the embedding table, of
//!   which a token reads one row, plus the token's experts) once, at the RAM
//!   bandwidth of all cores;
//! - compute: the spine's bytes at its format's measured one-row kernel speed
//!   and the token's experts' bytes at theirs, on all cores (the kernels
//!   stream weights; CPU time is the larger of RAM and compute).
//!
//! With prefetch, the reads of a layer's experts that the previous layer's
//! router predicted (`recall` of them) can overlap compute; the rest are
//! read on demand, and every prediction is read, so the unpredicted share
//! costs its bytes twice. Measured here, prefetch hides only part of what it
//! could (its reads go through two pread threads, not the I/O backend), so
//! `time = cpu + disk - overlap * recall * min(cpu, disk)` with
//! [`PREFETCH_OVERLAP`] unless measured otherwise. Without prefetch nothing
//! overlaps: `time = cpu + disk`. A prompt of `n` tokens
//! runs read-once (each expert it routes to read once) and its compute is
//! `n` rows of GEMM at the measured many-row speed; reads and compute are
//! summed (conservative: they overlap only within a layer).

use serde::Serialize;

use crate::plan::ModelSizes;

/// Share of the overlap prefetch could give that it gives: about 0.5 with
/// io_uring and less with pread on this project's VM
/// (bench/results/2026-12-03-plan.md, the uniform arms).
pub const PREFETCH_OVERLAP: f64 = 0.5;

/// What the forecast is made from.
#[derive(Debug, Clone, PartialEq)]
pub struct ForecastInput {
    pub sizes: ModelSizes,
    /// Bytes of the input embedding table (in the spine; one row is read per
    /// token, so it is not active; 0 when tied to the LM head).
    pub embedding_bytes: u64,
    /// Cache budget for routed experts, bytes.
    pub ram_budget: u64,
    /// Share of a decode token's expert requests the cache serves.
    pub hit_rate: f64,
    /// Share of a layer's experts its previous layer's router predicts.
    pub recall: f64,
    pub prefetch: bool,
    /// Share of the possible overlap prefetch achieves ([`PREFETCH_OVERLAP`]).
    pub prefetch_overlap: f64,
    /// Read GB/s of each drive (experts are striped over all of them).
    pub drives_gbps: Vec<f64>,
    /// RAM read GB/s of all cores together.
    pub ram_gbps: f64,
    /// Weight GB/s the spine's kernels process at one row, all cores together.
    pub spine_kernel_gbps: f64,
    /// Weight GB/s the routed experts' kernels process at one row, all cores.
    pub expert_kernel_gbps: f64,
    /// Weight GB/s the kernels process per row at many rows (prefill), all cores.
    pub prefill_kernel_gbps: f64,
    /// Prompt lengths and, per length, the share of the bank a prompt that
    /// long routes to (read once by the prefill).
    pub prompts: Vec<(usize, f64)>,
}

/// The forecast.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Forecast {
    pub decode_tok_per_s: f64,
    /// `disk`, `ram` or `compute`: the largest of the three times.
    pub binding: &'static str,
    pub hit_rate: f64,
    /// Routed-expert bytes read from the drives per decode token (prefetch
    /// reads that turn out unused included).
    pub bytes_per_token: f64,
    pub disk_s_per_token: f64,
    pub ram_s_per_token: f64,
    pub compute_s_per_token: f64,
    /// Time to first token per prompt length (cold cache).
    pub ttft_s: Vec<(usize, f64)>,
}

/// Forecasts decode and TTFT (see the module doc).
pub fn forecast(f: &ForecastInput) -> Forecast {
    let s = &f.sizes;
    let drives: f64 = f.drives_gbps.iter().sum::<f64>().max(1e-9) * 1e9;
    let requested = s.expert_bytes_per_token() as f64;
    let missed = requested * (1.0 - f.hit_rate.clamp(0.0, 1.0));
    let recall = f.recall.clamp(0.0, 1.0);
    let bytes_per_token = if f.prefetch { missed * (2.0 - recall) } else { missed };
    let spine = s.spine_bytes.saturating_sub(f.embedding_bytes) as f64;
    let active = spine + requested;
    let disk = missed / drives;
    let ram = active / (f.ram_gbps.max(1e-9) * 1e9);
    let compute = spine / (f.spine_kernel_gbps.max(1e-9) * 1e9) + requested / (f.expert_kernel_gbps.max(1e-9) * 1e9);
    let cpu = ram.max(compute);
    let per_token = if f.prefetch {
        cpu + disk - f.prefetch_overlap.clamp(0.0, 1.0) * recall * cpu.min(disk)
    } else {
        cpu + disk
    };
    let binding = if disk >= cpu {
        "disk"
    } else if ram >= compute {
        "ram"
    } else {
        "compute"
    };
    let ttft_s = f
        .prompts
        .iter()
        .map(|&(n, share)| {
            let read = s.bank_bytes as f64 * share.clamp(0.0, 1.0) / drives;
            let rows = n as f64 * active / (f.prefill_kernel_gbps.max(1e-9) * 1e9);
            (n, read + rows + per_token)
        })
        .collect();
    Forecast {
        decode_tok_per_s: if per_token > 0.0 { 1.0 / per_token } else { 0.0 },
        binding,
        hit_rate: f.hit_rate,
        bytes_per_token,
        disk_s_per_token: disk,
        ram_s_per_token: ram,
        compute_s_per_token: compute,
        ttft_s,
    }
}

/// Expected share of a layer's `experts` that `n` tokens, each routing to
/// `top_k` of them uniformly, touch at least once.
pub fn uniform_union_share(experts: usize, top_k: usize, n: usize) -> f64 {
    if experts == 0 {
        return 0.0;
    }
    1.0 - (1.0 - top_k as f64 / experts as f64).powf(n as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> ForecastInput {
        ForecastInput {
            sizes: ModelSizes {
                layers: 10,
                moe_layers: 10,
                experts_per_layer: 100,
                top_k: 10,
                spine_bytes: 1_000_000_000,
                expert_bytes: 10_000_000,
                bank_bytes: 10_000_000_000,
                exact: true,
            },
            embedding_bytes: 0,
            ram_budget: 5_000_000_000,
            hit_rate: 0.5,
            recall: 0.7,
            prefetch: true,
            prefetch_overlap: 1.0,
            drives_gbps: vec![1.0, 1.0],
            ram_gbps: 20.0,
            spine_kernel_gbps: 10.0,
            expert_kernel_gbps: 10.0,
            prefill_kernel_gbps: 100.0,
            prompts: vec![(100, 1.0)],
        }
    }

    #[test]
    fn disk_binds_and_prefetch_overlaps_what_it_predicts() {
        let f = forecast(&input());
        // 1 GB requested per token, half missed, over 2 GB/s: 0.25 s; CPU 2 GB / 10 GB/s: 0.2 s.
        assert!((f.disk_s_per_token - 0.25).abs() < 1e-9);
        assert!((f.compute_s_per_token - 0.2).abs() < 1e-9);
        assert_eq!(f.binding, "disk");
        // Full overlap of the predicted 70%: 0.2 + 0.25 - 0.7 * 0.2.
        assert!((1.0 / f.decode_tok_per_s - 0.31).abs() < 1e-9);
        let off = forecast(&ForecastInput {
            prefetch: false,
            ..input()
        });
        assert!((1.0 / off.decode_tok_per_s - 0.45).abs() < 1e-9);
        assert!(off.bytes_per_token < f.bytes_per_token);
        // The whole bank over 2 GB/s, then 100 rows of 2 GB at 100 GB/s, then a token.
        assert!((f.ttft_s[0].1 - (5.0 + 2.0 + 0.31)).abs() < 1e-9);
    }

    #[test]
    fn unions_grow_towards_the_whole_layer() {
        assert!((uniform_union_share(100, 10, 1) - 0.1).abs() < 1e-12);
        assert!(uniform_union_share(100, 10, 1000) > 0.999);
        assert_eq!(uniform_union_share(0, 1, 5), 0.0);
    }
}
