//! The first decode planner: from a model's sizes and this machine's figures
//! (RAM available, one-thread RAM read GB/s, the model drive's read GB/s),
//! whether the model runs in RAM, streamed, or not at all, the `--ram-budget`
//! to use, and a first estimate of decode tok/s with the bound that sets it.
//!
//! The estimate is deliberately simple (see docs/doctor.md): routing is
//! assumed uniform, so a cache holding `budget / bank` of the experts misses
//! `1 - budget / bank` of the reads; reading and computing do not overlap;
//! the whole spine plus the chosen experts are read from RAM once per token.
//! Everything here is pure arithmetic so a later planner can refine it.
//! The [`ModelSizes`] it plans with come from [`crate::sizing`]: a
//! checkpoint's headers, a store's manifest, or, from a config.json alone,
//! the tensors the architecture's loader reads ([`crate::tensor_sizes`]);
//! nothing here knows a model's tensors.

use larder_model::{FfnSpec, ModelSpec};

/// RAM kept free for the KV cache, activations, the OS and the page cache:
/// the larger of this and [`HEADROOM_FRACTION`] of the RAM available.
pub const HEADROOM_MIN_BYTES: u64 = 1 << 30;
/// Share of the RAM available kept free (see [`HEADROOM_MIN_BYTES`]).
pub const HEADROOM_FRACTION: f64 = 0.05;

/// Why a plan cannot be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    #[error("{field} = {value}: must be a finite number above 0 (re-measure it)")]
    NotPositive { field: &'static str, value: f64 },
    #[error("config dtype {dtype:?} is not one larder reads (bfloat16, float16, float32, or fp8 via quantization_config); set `torch_dtype` in config.json")]
    UnknownDType { dtype: String },
}

fn mul(a: u64, b: u64) -> u64 {
    a.saturating_mul(b)
}

/// A model's shape and byte sizes, as far as planning needs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSizes {
    pub layers: usize,
    /// Layers with routed experts.
    pub moe_layers: usize,
    /// Routed experts per MoE layer (the largest, if they differ).
    pub experts_per_layer: usize,
    /// Experts each token uses per MoE layer.
    pub top_k: usize,
    /// Every weight that is not a routed expert (embeddings, attention,
    /// norms, routers, shared experts, dense layers, LM head).
    pub spine_bytes: u64,
    /// Bytes of one routed expert (gate, up, down and their scales; the
    /// mean when they differ).
    pub expert_bytes: u64,
    /// Bytes of all routed experts.
    pub bank_bytes: u64,
    /// From safetensors headers or a store manifest (false: estimated from
    /// the tensors the loader reads, at config.json's dtype).
    pub exact: bool,
}

impl ModelSizes {
    /// Routed-expert bytes one token reads: top-k experts of every MoE layer.
    pub fn expert_bytes_per_token(&self) -> u64 {
        mul(mul(self.top_k as u64, self.moe_layers as u64), self.expert_bytes)
    }

    /// Weight bytes one token computes on: the spine plus its experts.
    pub fn active_bytes_per_token(&self) -> u64 {
        self.spine_bytes.saturating_add(self.expert_bytes_per_token())
    }

    /// The least expert cache that streams: one layer step's top-k experts.
    pub(crate) fn min_cache_bytes(&self) -> u64 {
        mul(self.top_k as u64, self.expert_bytes)
    }

    /// Layer count, experts and top-k from `spec`, with exact byte sizes.
    pub fn exact(spec: &ModelSpec, spine_bytes: u64, bank_bytes: u64) -> ModelSizes {
        let (moe_layers, experts_per_layer, top_k) = moe_shape(spec);
        let count = mul(moe_layers as u64, experts_per_layer as u64);
        ModelSizes {
            layers: spec.layers.len(),
            moe_layers,
            experts_per_layer,
            top_k,
            spine_bytes,
            expert_bytes: bank_bytes.checked_div(count).unwrap_or(0),
            bank_bytes,
            exact: true,
        }
    }
}

/// (MoE layers, largest expert count, largest top-k) of `spec`.
fn moe_shape(spec: &ModelSpec) -> (usize, usize, usize) {
    let moes = spec.layers.iter().filter_map(|l| match &l.ffn {
        FfnSpec::Moe(m) => Some(m),
        FfnSpec::Dense { .. } => None,
    });
    moes.fold((0, 0, 0), |(n, e, k), m| (n + 1, e.max(m.num_experts), k.max(m.top_k)))
}

/// This machine's figures the plan is made from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MachineFigures {
    /// RAM available now (the cgroup limit when lower), bytes.
    pub ram_available: u64,
    /// One-thread streaming RAM read, GB/s.
    pub ram_gbps: f64,
    /// Expert-sized reads from the model's drive, GB/s (None: not measured).
    pub drive_gbps: Option<f64>,
}

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// Spine, every expert and the headroom fit in RAM.
    InRam,
    /// Spine and at least one layer step's experts fit; the rest streams.
    Streamed,
    /// Not even the spine plus one layer step's experts fit: `needs` bytes.
    DoesNotFit { needs: u64 },
}

impl Fit {
    /// `in_ram`, `streamed` or `does_not_fit` (JSON).
    pub fn key(self) -> &'static str {
        match self {
            Fit::InRam => "in_ram",
            Fit::Streamed => "streamed",
            Fit::DoesNotFit { .. } => "does_not_fit",
        }
    }
}

/// Which limit sets the expected decode speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// Reading weights from RAM (compute-bound decoding is memory-bound).
    Compute,
    /// Reading missed experts from the drive.
    Disk,
}

impl Bound {
    pub fn key(self) -> &'static str {
        match self {
            Bound::Compute => "compute",
            Bound::Disk => "disk",
        }
    }
}

/// The plan for one model on one machine.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub fit: Fit,
    /// RAM kept free (see [`HEADROOM_MIN_BYTES`]).
    pub headroom_bytes: u64,
    /// The `--ram-budget` to use: RAM available minus spine minus headroom,
    /// capped at the bank (0 when the model does not fit).
    pub recommended_ram_budget: u64,
    /// The budget the estimate is for: the one asked for, else the recommended one.
    pub ram_budget: u64,
    /// Share of expert reads that miss the cache under uniform routing.
    pub miss_rate: f64,
    /// tok/s if only missed expert reads from the drive limited decoding
    /// (None: nothing is read, or the drive was not measured).
    pub disk_tok_per_s: Option<f64>,
    /// tok/s if only reading active weights from RAM limited decoding.
    pub compute_tok_per_s: f64,
    /// The lower of the two bounds (0 when the model does not fit).
    pub expected_tok_per_s: f64,
    pub bound: Bound,
}

fn positive(field: &'static str, value: f64) -> Result<f64, PlanError> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(PlanError::NotPositive { field, value })
    }
}

/// RAM kept free out of `available`.
pub fn headroom(available: u64) -> u64 {
    HEADROOM_MIN_BYTES.max((available as f64 * HEADROOM_FRACTION) as u64)
}

/// Plans `sizes` on `machine` (see the module doc for the model), for an
/// expert cache of `budget` bytes when given, else the recommended one.
pub fn plan(sizes: &ModelSizes, machine: &MachineFigures, budget: Option<u64>) -> Result<Plan, PlanError> {
    let ram_gbps = positive("ram_gbps", machine.ram_gbps)?;
    let drive_gbps = machine.drive_gbps.map(|g| positive("drive_gbps", g)).transpose()?;
    let headroom_bytes = headroom(machine.ram_available);
    let usable = machine.ram_available.saturating_sub(headroom_bytes);
    let fit = if sizes.spine_bytes.saturating_add(sizes.bank_bytes) <= usable {
        Fit::InRam
    } else if sizes.spine_bytes.saturating_add(sizes.min_cache_bytes()) <= usable {
        Fit::Streamed
    } else {
        Fit::DoesNotFit {
            needs: sizes
                .spine_bytes
                .saturating_add(sizes.min_cache_bytes())
                .saturating_add(headroom_bytes),
        }
    };
    let recommended_ram_budget = match fit {
        Fit::DoesNotFit { .. } => 0,
        _ => usable.saturating_sub(sizes.spine_bytes).min(sizes.bank_bytes),
    };
    let ram_budget = budget.unwrap_or(recommended_ram_budget);
    let miss_rate = miss_rate(ram_budget, sizes.bank_bytes);
    let compute = ram_gbps * 1e9 / sizes.active_bytes_per_token().max(1) as f64;
    let missed = sizes.expert_bytes_per_token() as f64 * miss_rate;
    let disk = drive_gbps.filter(|_| missed > 0.0).map(|g| g * 1e9 / missed);
    let (expected, bound) = match disk {
        Some(d) if d < compute => (d, Bound::Disk),
        _ => (compute, Bound::Compute),
    };
    Ok(Plan {
        fit,
        headroom_bytes,
        recommended_ram_budget,
        ram_budget,
        miss_rate,
        disk_tok_per_s: disk,
        compute_tok_per_s: compute,
        expected_tok_per_s: if matches!(fit, Fit::DoesNotFit { .. }) { 0.0 } else { expected },
        bound,
    })
}

/// Share of expert reads that miss a cache of `budget` bytes over a bank of
/// `bank` bytes when every expert is equally likely: `1 - budget / bank`.
pub(crate) fn miss_rate(budget: u64, bank: u64) -> f64 {
    if bank == 0 {
        return 0.0;
    }
    (1.0 - budget as f64 / bank as f64).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn sizes(spine: u64, expert: u64, experts: usize, moe_layers: usize, top_k: usize) -> ModelSizes {
        ModelSizes {
            layers: moe_layers,
            moe_layers,
            experts_per_layer: experts,
            top_k,
            spine_bytes: spine,
            expert_bytes: expert,
            bank_bytes: expert * (experts * moe_layers) as u64,
            exact: true,
        }
    }

    fn machine(ram: u64, ram_gbps: f64, drive: Option<f64>) -> MachineFigures {
        MachineFigures {
            ram_available: ram,
            ram_gbps,
            drive_gbps: drive,
        }
    }

    #[test]
    fn miss_rate_is_the_uncached_share() {
        assert_eq!(miss_rate(0, 0), 0.0);
        assert_eq!(miss_rate(10, 0), 0.0);
        assert_eq!(miss_rate(0, 100), 1.0);
        assert_eq!(miss_rate(25, 100), 0.75);
        assert_eq!(miss_rate(200, 100), 0.0);
    }

    #[test]
    fn headroom_is_a_gib_or_five_percent() {
        assert_eq!(headroom(0), GIB);
        assert_eq!(headroom(8 * GIB), GIB);
        assert_eq!(headroom(100 * GIB), 5 * GIB);
    }

    #[test]
    fn per_token_bytes() {
        let s = sizes(2 * GIB, 100 * MIB, 64, 10, 8);
        assert_eq!(s.expert_bytes_per_token(), 8 * 10 * 100 * MIB);
        assert_eq!(s.active_bytes_per_token(), 2 * GIB + 8000 * MIB);
        assert_eq!(s.min_cache_bytes(), 800 * MIB);
    }

    #[test]
    fn small_model_runs_in_ram_compute_bound() {
        let s = sizes(GIB, 10 * MIB, 8, 4, 2);
        let p = plan(&s, &machine(32 * GIB, 10.0, Some(2.0)), None).unwrap();
        assert_eq!(p.fit, Fit::InRam);
        assert_eq!(p.ram_budget, s.bank_bytes);
        assert_eq!(p.miss_rate, 0.0);
        assert_eq!(p.disk_tok_per_s, None);
        assert_eq!(p.bound, Bound::Compute);
        let want = 10e9 / s.active_bytes_per_token() as f64;
        assert!((p.compute_tok_per_s - want).abs() < 1e-9 && p.expected_tok_per_s == p.compute_tok_per_s);
    }

    #[test]
    fn big_model_streams_disk_bound() {
        let s = sizes(2 * GIB, 100 * MIB, 1024, 1, 8); // 100 GiB bank
        let p = plan(&s, &machine(20 * GIB, 50.0, Some(3.0)), None).unwrap();
        assert_eq!(p.fit, Fit::Streamed);
        assert_eq!(p.headroom_bytes, GIB);
        assert_eq!(p.ram_budget, 17 * GIB);
        assert!((p.miss_rate - 0.83).abs() < 1e-9, "{}", p.miss_rate);
        let disk = 3e9 / (800.0 * MIB as f64 * 0.83);
        assert!((p.disk_tok_per_s.unwrap() - disk).abs() < 1e-6);
        assert_eq!(p.bound, Bound::Disk);
        assert_eq!(p.expected_tok_per_s, p.disk_tok_per_s.unwrap());
    }

    #[test]
    fn a_given_budget_sets_the_miss_rate() {
        let s = sizes(2 * GIB, 100 * MIB, 1024, 1, 8);
        let p = plan(&s, &machine(20 * GIB, 50.0, Some(3.0)), Some(25 * GIB)).unwrap();
        assert_eq!((p.ram_budget, p.recommended_ram_budget), (25 * GIB, 17 * GIB));
        assert!((p.miss_rate - 0.75).abs() < 1e-9);
        let p = plan(&s, &machine(20 * GIB, 50.0, Some(3.0)), Some(0)).unwrap();
        assert_eq!(p.miss_rate, 1.0);
    }

    #[test]
    fn a_fast_drive_leaves_it_compute_bound() {
        let s = sizes(2 * GIB, 100 * MIB, 1024, 1, 8);
        let p = plan(&s, &machine(20 * GIB, 1.0, Some(1000.0)), None).unwrap();
        assert_eq!(p.bound, Bound::Compute);
        assert!(p.disk_tok_per_s.unwrap() > p.compute_tok_per_s);
        assert_eq!(p.expected_tok_per_s, p.compute_tok_per_s);
    }

    #[test]
    fn no_drive_figure_means_compute_bound_only() {
        let s = sizes(2 * GIB, 100 * MIB, 1024, 1, 8);
        let p = plan(&s, &machine(20 * GIB, 10.0, None), None).unwrap();
        assert_eq!((p.fit, p.disk_tok_per_s, p.bound), (Fit::Streamed, None, Bound::Compute));
    }

    #[test]
    fn spine_too_big_does_not_fit() {
        let s = sizes(30 * GIB, 100 * MIB, 64, 10, 8);
        let p = plan(&s, &machine(16 * GIB, 10.0, Some(3.0)), None).unwrap();
        assert_eq!(
            p.fit,
            Fit::DoesNotFit {
                needs: 30 * GIB + 800 * MIB + GIB
            }
        );
        assert_eq!((p.ram_budget, p.recommended_ram_budget, p.expected_tok_per_s), (0, 0, 0.0));
        assert_eq!(p.fit.key(), "does_not_fit");
    }

    #[test]
    fn bad_figures_are_errors() {
        let s = sizes(GIB, MIB, 8, 1, 2);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = plan(&s, &machine(GIB, bad, None), None).unwrap_err();
            assert!(e.to_string().starts_with("ram_gbps = "), "{e}");
            assert!(plan(&s, &machine(GIB, 1.0, Some(bad)), None).is_err());
        }
    }
}
