//! The decode and time-to-first-token forecast behind `larder plan`: from a
//! model's sizes, the cache hit rate a routing trace or preset reaches at the
//! planned budget (the store's simulator computes it), router lookahead
//! recall, and measured machine figures (drives, RAM, kernels), how fast
//! decoding will be and which resource binds.
//!
//! Per decode token, with the reads a replay of the trace through the cache
//! simulator counts (`larder_store::cache::prefetch_sim`: per MoE layer the
//! records read on demand and those read in the background on the previous
//! layer's predictions):
//! - compute: the spine's bytes at its format's measured one-row kernel
//!   speed and the token's experts' bytes at theirs, on all cores, plus
//!   `cpu_overhead` of that for the work between the matrix products
//!   (routing, norms, recurrent state, attention, thread hand-offs;
//!   [`CPU_OVERHEAD`] measured here unless given);
//! - RAM: the active weights (the spine but for the embedding table, of
//!   which a token reads one row, plus the token's experts) once, at the RAM
//!   bandwidth of all cores; CPU time is the larger of RAM and compute;
//! - checking digests, at one core's measured digest speed: the store checks
//!   a layer's records on all cores as their reads complete
//!   (`larder_store`'s demand reads), so the model waits for the check of
//!   each layer's last demand read alone and for the rest spread over the
//!   cores, background reads included;
//! - waiting: each layer's demand reads, at `demand_share` of the drives'
//!   summed speed while the next layer's background reads (issued beside
//!   them) are under way, at the full speed once those are done. Background
//!   reads are issued one layer ahead, so one decoder layer's CPU time hides
//!   those that fit in it; of the rest, the reads already under way when the
//!   layer's demand comes (one per prefetch thread) are waited for, and the
//!   others are cancelled as stale, their useful share then read on demand
//!   (as the store does);
//! - the drives: every read at their summed speed, a floor.
//!
//! `time = max(cpu + wait, reads / drives)`; the binding resource is the
//! drives when all reads take longer than the CPU time, else RAM or compute.
//! A prompt of `n` tokens runs read-once (each expert it routes to read once)
//! and its compute is `n` rows of GEMM at the measured many-row speed; reads
//! and compute are summed (conservative: they overlap only within a layer).

use serde::Serialize;

use crate::plan::ModelSizes;

/// CPU time of a decode step beyond its matrix products, as a share of
/// theirs: measured on this project's VM (2-vCPU EPYC Zen 3) as in-RAM decode
/// of kimi_linear k3-mini against the kernel figures (bench/results/
/// 2026-12-05-plan.md); `larder plan --cpu-overhead` takes a figure measured
/// on the machine planned for.
pub const CPU_OVERHEAD: f64 = 0.15;

/// io_uring: a demand batch is split into 1 MiB reads, 32 in flight at the
/// default depth, against one whole-record read per prefetch thread (2):
/// demand gets about 32 / 34 of the drive.
pub(crate) const URING_DEMAND_SHARE: f64 = 32.0 / 34.0;
/// pread: demand reads wait about as long as if they shared the drive evenly
/// with the background reads beside them (measured: waits 1.5-2x io_uring's
/// at the same bytes; bench/results/2026-12-05-plan.md).
pub(crate) const PREAD_DEMAND_SHARE: f64 = 0.5;

/// What one MoE layer reads per decode token.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct LayerReads {
    /// Bytes read on demand (the model waits for them).
    pub demand_bytes: f64,
    /// Bytes read in the background on predictions (0 without prefetch).
    pub prefetch_bytes: f64,
    /// Share of those a demand then used.
    pub prefetch_used: f64,
}

/// What the forecast is made from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ForecastInput {
    pub sizes: ModelSizes,
    /// Bytes of the input embedding table (in the spine; one row is read per
    /// token, so it is not active; 0 when tied to the LM head).
    pub embedding_bytes: u64,
    /// Cache budget for routed experts, bytes.
    pub ram_budget: u64,
    /// Share of a decode token's expert requests the cache serves.
    pub hit_rate: f64,
    /// Per MoE layer, what a decode token reads (from the cache simulator).
    pub reads: Vec<LayerReads>,
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
    /// CPU work between the matrix products, as a share of theirs ([`CPU_OVERHEAD`]).
    pub cpu_overhead: f64,
    /// GB/s one core checks digests at (`None`: reads are not checked).
    pub digest_gbps: Option<f64>,
    pub cores: usize,
    /// Background read threads (each has at most one read under way).
    pub prefetch_threads: usize,
    /// Share of the drives' speed demand reads get while background reads
    /// are under way ([`URING_DEMAND_SHARE`], [`PREAD_DEMAND_SHARE`]).
    pub demand_share: f64,
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
    /// All of a token's reads at the drives' summed speed.
    pub disk_s_per_token: f64,
    pub ram_s_per_token: f64,
    /// Matrix products plus the overhead share.
    pub compute_s_per_token: f64,
    /// Checking the digests of what a token reads.
    pub digest_s_per_token: f64,
    /// Time the model waits for reads per token.
    pub wait_s_per_token: f64,
    /// Time to first token per prompt length (cold cache).
    pub ttft_s: Vec<(usize, f64)>,
}

/// RAM and compute seconds per decode token, and one decoder layer's share
/// of the larger (the window a layer's background reads have).
fn cpu_times(f: &ForecastInput) -> (f64, f64, f64) {
    let s = &f.sizes;
    let spine = s.spine_bytes.saturating_sub(f.embedding_bytes) as f64;
    let active = spine + s.expert_bytes_per_token() as f64;
    let ram = active / (f.ram_gbps.max(1e-9) * 1e9);
    let gemm = spine / (f.spine_kernel_gbps.max(1e-9) * 1e9) + s.expert_bytes_per_token() as f64 / (f.expert_kernel_gbps.max(1e-9) * 1e9);
    let compute = gemm * (1.0 + f.cpu_overhead.max(0.0));
    (ram, compute, ram.max(compute) / s.layers.max(1) as f64)
}

/// How many background reads a MoE layer completes per decode token before
/// its demand cancels the rest: those that fit in one decoder layer's CPU
/// time at the drives' speed, plus one under way per prefetch thread (the
/// cache simulator's prefetch limit).
pub(crate) fn background_reads_per_layer(f: &ForecastInput) -> usize {
    let drives: f64 = f.drives_gbps.iter().sum::<f64>() * 1e9;
    let (_, _, window) = cpu_times(f);
    let fit = (window * drives / f.sizes.expert_bytes.max(1) as f64).floor();
    (fit as usize).saturating_add(f.prefetch_threads)
}

/// Forecasts decode and TTFT (see the module doc).
pub(crate) fn forecast(f: &ForecastInput) -> Forecast {
    let s = &f.sizes;
    let drives: f64 = f.drives_gbps.iter().sum::<f64>().max(1e-9) * 1e9;
    let active = s.spine_bytes.saturating_sub(f.embedding_bytes) as f64 + s.expert_bytes_per_token() as f64;
    let (ram, compute, window) = cpu_times(f);
    let in_flight = (f.prefetch_threads as u64).saturating_mul(s.expert_bytes) as f64;
    let layers: Vec<(f64, f64, f64)> = f
        .reads
        .iter()
        .map(|r| {
            let done = r.prefetch_bytes.min(window * drives);
            let late = (r.prefetch_bytes - done).min(in_flight);
            let cancelled = r.prefetch_bytes - done - late;
            (r.demand_bytes + cancelled * r.prefetch_used.clamp(0.0, 1.0), done, late)
        })
        .collect();
    let share = f.demand_share.clamp(0.01, 1.0);
    let cores = f.cores.max(1) as f64;
    let (mut demand, mut background, mut wait, mut checked) = (0.0, 0.0, 0.0, 0.0);
    for (i, &(on_demand, done, late)) in layers.iter().enumerate() {
        let beside = layers.get(i + 1).map_or(0.0, |n| n.1 + n.2);
        demand += on_demand;
        background += done + late;
        wait += ((on_demand / share).min(on_demand + beside) + late) / drives;
        // The last record a layer reads is checked alone; the others and
        // the background reads are checked on all cores.
        let last = on_demand.min(s.expert_bytes as f64);
        checked += last + (on_demand - last + done + late) / cores;
    }
    let bytes_per_token = demand + background;
    let disk = bytes_per_token / drives;
    let digest = f.digest_gbps.map_or(0.0, |g| checked / (g.max(1e-9) * 1e9));
    let cpu = ram.max(compute) + digest;
    let per_token = (cpu + wait).max(disk);
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
        digest_s_per_token: digest,
        wait_s_per_token: wait,
        ttft_s,
    }
}

/// Expected share of a layer's `experts` that `n` tokens, each routing to
/// `top_k` of them uniformly, touch at least once.
pub(crate) fn uniform_union_share(experts: usize, top_k: usize, n: usize) -> f64 {
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
            // Per layer 50 MB missed: 20 MB on demand, 30 MB (and 10 MB wasted) in the background.
            reads: vec![
                LayerReads {
                    demand_bytes: 20e6,
                    prefetch_bytes: 40e6,
                    prefetch_used: 0.75,
                };
                10
            ],
            drives_gbps: vec![1.0, 1.0],
            ram_gbps: 20.0,
            spine_kernel_gbps: 10.0,
            expert_kernel_gbps: 10.0,
            prefill_kernel_gbps: 100.0,
            cpu_overhead: 0.0,
            digest_gbps: None,
            cores: 2,
            prefetch_threads: 1,
            demand_share: 1.0,
            prompts: vec![(100, 1.0)],
        }
    }

    #[test]
    fn demand_reads_stall_and_background_reads_hide_in_a_layer() {
        let f = forecast(&input());
        // 600 MB read per token over 2 GB/s: 0.3 s; CPU 2 GB / 10 GB/s: 0.2 s.
        assert!((f.disk_s_per_token - 0.3).abs() < 1e-9);
        assert!((f.compute_s_per_token - 0.2).abs() < 1e-9);
        assert_eq!(f.binding, "disk");
        // Each layer: 20 MB on demand (10 ms) + 40 MB in the background (20 ms)
        // of which a layer's 20 ms of CPU hides all: 0.2 + 0.1 = 0.3 s, the drives' floor.
        assert!((f.wait_s_per_token - 0.1).abs() < 1e-9);
        assert!((1.0 / f.decode_tok_per_s - 0.3).abs() < 1e-9);
        // Slower drives: a layer's 20 ms of CPU hides 20 MB of its background reads; the one
        // record under way (10 MB) is waited for; the other 10 MB are cancelled and their used
        // share (7.5 MB) read on demand: per layer 37.5 ms waited, 57.5 MB read.
        let slow = forecast(&ForecastInput {
            drives_gbps: vec![0.5, 0.5],
            ..input()
        });
        assert!((slow.wait_s_per_token - 0.375).abs() < 1e-9);
        assert!((slow.bytes_per_token - 575e6).abs() < 1.0);
        assert!((1.0 / slow.decode_tok_per_s - 0.575).abs() < 1e-9);
        // The whole bank over 2 GB/s, then 100 rows of 2 GB at 100 GB/s, then a token.
        assert!((f.ttft_s[0].1 - (5.0 + 2.0 + 0.3)).abs() < 1e-9);
        // 20 ms at 2 GB/s is four 10 MB records, plus the one under way.
        assert_eq!(background_reads_per_layer(&input()), 5);
    }

    #[test]
    fn demand_beside_background_reads_gets_its_share_of_the_drive() {
        let f = forecast(&ForecastInput {
            demand_share: 0.5,
            ..input()
        });
        // Nine layers read 20 MB on demand beside the next layer's 40 MB: at half speed, 20 ms
        // each; the last has nothing beside it: 10 ms.
        assert!((f.wait_s_per_token - (9.0 * 0.02 + 0.01)).abs() < 1e-9);
        // Beside fewer background bytes than its own, demand takes its bytes plus theirs.
        let f = forecast(&ForecastInput {
            demand_share: 0.1,
            ..input()
        });
        assert!((f.wait_s_per_token - (9.0 * 0.03 + 0.01)).abs() < 1e-9);
    }

    #[test]
    fn overhead_and_digests_add_cpu_time() {
        let base = forecast(&ForecastInput {
            reads: vec![LayerReads::default(); 10],
            ..input()
        });
        assert!((1.0 / base.decode_tok_per_s - 0.2).abs() < 1e-9);
        let f = forecast(&ForecastInput {
            cpu_overhead: 0.5,
            digest_gbps: Some(10.0),
            ..input()
        });
        assert!((f.compute_s_per_token - 0.3).abs() < 1e-9);
        // At 10 GB/s, per layer: the last 10 MB demand record alone, the other
        // 10 MB and the 40 MB read in the background over 2 cores.
        assert!((f.digest_s_per_token - 10.0 * (0.001 + 0.0025)).abs() < 1e-9);
        // One core checks everything in turn.
        let one = forecast(&ForecastInput {
            cores: 1,
            cpu_overhead: 0.5,
            digest_gbps: Some(10.0),
            ..input()
        });
        assert!((one.digest_s_per_token - 10.0 * 0.006).abs() < 1e-9);
    }

    #[test]
    fn unions_grow_towards_the_whole_layer() {
        assert!((uniform_union_share(100, 10, 1) - 0.1).abs() < 1e-12);
        assert!(uniform_union_share(100, 10, 1000) > 0.999);
        assert_eq!(uniform_union_share(0, 1, 5), 0.0);
    }
}
