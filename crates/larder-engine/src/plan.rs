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

use larder_model::config::{ExpertKind, FfnSpec, KdaOutputGate, MixerSpec, ModelSpec, MoeSpec, Scoring};
use larder_model::quant::{ModuleRule, PackedFormat};

/// RAM kept free for the KV cache, activations, the OS and the page cache:
/// the larger of this and [`HEADROOM_FRACTION`] of the RAM available.
pub const HEADROOM_MIN_BYTES: u64 = 1 << 30;
/// Share of the RAM available kept free (see [`HEADROOM_MIN_BYTES`]).
pub const HEADROOM_FRACTION: f64 = 0.05;

/// Why a plan cannot be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("{field} = {value}: must be a finite number above 0 (re-measure it)")]
    NotPositive { field: &'static str, value: f64 },
    #[error("config dtype {dtype:?} is not one larder reads (bfloat16, float16, float32, or fp8 via quantization_config); set `torch_dtype` in config.json")]
    UnknownDType { dtype: String },
}

/// How a model's weights are stored, for estimating sizes from a config alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Storage {
    /// Bytes per element of the checkpoint's main dtype (`torch_dtype`).
    pub bytes_per_weight: u64,
    /// fp8 checkpoints: block size of the f32 scales of their linear weights
    /// (which are then 1 byte per element; embeddings, norms and routers stay
    /// in `bytes_per_weight`).
    pub fp8_block: Option<(usize, usize)>,
    /// gpt-oss `quantization_config.quant_method: mxfp4`: the fused routed
    /// experts ship as MXFP4 `_blocks` (4 bits a weight) and `_scales` (one
    /// e8m0 byte per 32), their biases in `bytes_per_weight`.
    /// (compressed-tensors 4-bit experts are read from the spec's `compressed`.)
    pub mxfp4_experts: bool,
}

impl Storage {
    /// From config.json's `torch_dtype` / `dtype` (default bfloat16) and the
    /// fp8 block of its `quantization_config`.
    pub fn from_config(dtype: Option<&str>, fp8_block: Option<(usize, usize)>) -> Result<Storage, PlanError> {
        let bytes_per_weight = match dtype.unwrap_or("bfloat16") {
            "bfloat16" | "bf16" | "float16" | "fp16" | "half" => 2,
            "float32" | "fp32" | "float" => 4,
            other => return Err(PlanError::UnknownDType { dtype: other.to_string() }),
        };
        Ok(Storage {
            bytes_per_weight,
            fp8_block,
            mxfp4_experts: false,
        })
    }

    /// With gpt-oss MXFP4 experts (`quantization_config.quant_method: mxfp4`).
    pub fn with_mxfp4_experts(self, mxfp4_experts: bool) -> Storage {
        Storage { mxfp4_experts, ..self }
    }

    /// Bytes of a linear weight of `rows x cols` (with its fp8 scales).
    fn linear(&self, rows: usize, cols: usize) -> u64 {
        let elems = mul(rows as u64, cols as u64);
        match self.fp8_block {
            Some((bn, bk)) => {
                let scales = mul(rows.div_ceil(bn.max(1)) as u64, cols.div_ceil(bk.max(1)) as u64);
                elems.saturating_add(mul(scales, 4))
            }
            None => mul(elems, self.bytes_per_weight),
        }
    }

    /// Bytes of a plain (never fp8) tensor of `elems` elements.
    fn plain(&self, elems: u64) -> u64 {
        mul(elems, self.bytes_per_weight)
    }
}

/// Bytes of a `[rows, cols]` weight shipped 4-bit packed: codes at 4 bits
/// plus one scale per group of columns (INT4: a bf16 scale per `group` and
/// the i32 `[2]` `weight_shape`; MXFP4: an e8m0 byte per 32).
fn packed_bytes(format: PackedFormat, rows: usize, cols: usize) -> u64 {
    let codes = mul(rows as u64, cols.div_ceil(2) as u64);
    match format {
        PackedFormat::Int4 { group } => {
            let scales = mul(rows as u64, cols.div_ceil(group.max(1)) as u64);
            codes.saturating_add(mul(scales, 2)).saturating_add(8)
        }
        PackedFormat::Mxfp4 => codes.saturating_add(mul(rows as u64, cols.div_ceil(32) as u64)),
    }
}

/// Bytes of one routed expert of MoE layer `layer`: gate, up and down as
/// shipped (compressed-tensors packs the modules its scheme targets; gpt-oss
/// fuses gate/up and adds biases, MXFP4 with [`Storage::mxfp4_experts`]).
fn routed_expert_bytes(spec: &ModelSpec, m: &MoeSpec, layer: usize, storage: Storage) -> u64 {
    let (w, i) = (m.expert_width(spec.hidden_size), m.expert_intermediate);
    if let ExpertKind::GptOss { .. } = m.experts {
        let biases = storage.plain((2 * i + w) as u64);
        let weights = if storage.mxfp4_experts {
            packed_bytes(PackedFormat::Mxfp4, 2 * i, w).saturating_add(packed_bytes(PackedFormat::Mxfp4, w, i))
        } else {
            storage.plain(mul(3 * i as u64, w as u64))
        };
        return weights.saturating_add(biases);
    }
    let names = &spec.moe_names;
    let shapes = [(i, w), (i, w), (w, i)];
    names
        .expert_proj
        .iter()
        .zip(shapes)
        .map(|(proj, (rows, cols))| {
            let module = format!("model.layers.{layer}.{}.experts.0.{proj}", names.block);
            match spec.compressed.as_ref().map(|c| c.rule(&module)) {
                Some(ModuleRule::Packed(f)) => packed_bytes(f, rows, cols),
                _ => storage.linear(rows, cols),
            }
        })
        .fold(0u64, u64::saturating_add)
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
    /// config.json shapes and dtype).
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
    pub fn min_cache_bytes(&self) -> u64 {
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

/// Estimates a model's sizes from its config alone (`exact: false`):
/// every tensor the architecture declares, at `storage`'s dtype.
pub fn estimate_sizes(spec: &ModelSpec, storage: Storage) -> ModelSizes {
    let h = spec.hidden_size;
    let embed = storage.plain(mul(spec.vocab_size as u64, h as u64));
    let head = if spec.tie_word_embeddings { 0 } else { embed };
    let mut spine = embed.saturating_add(head).saturating_add(storage.plain(h as u64));
    let mut bank = 0u64;
    let mut expert_bytes = 0u64;
    for (l, layer) in spec.layers.iter().enumerate() {
        spine = spine
            .saturating_add(mixer_bytes(spec, &layer.mixer, storage))
            .saturating_add(storage.plain(2 * h as u64));
        match &layer.ffn {
            FfnSpec::Dense { intermediate } => spine = spine.saturating_add(mlp_bytes(storage, h, *intermediate)),
            FfnSpec::Moe(m) => {
                // Latent-space experts are `latent` wide; their two projections
                // (`[latent, h]`, `[h, latent]`) are spine tensors.
                expert_bytes = routed_expert_bytes(spec, m, l, storage);
                bank = bank.saturating_add(mul(m.num_experts as u64, expert_bytes));
                spine = spine.saturating_add(storage.plain(mul(m.num_experts as u64, h as u64)));
                if let Scoring::SigmoidGroups { .. } | Scoring::TopKSoftmax = m.scoring {
                    // The router's bias [E]: DeepSeek's selection-only
                    // `e_score_correction_bias`, gpt-oss's `router.bias`.
                    spine = spine.saturating_add(storage.plain(m.num_experts as u64));
                }
                if let Some(latent) = m.latent {
                    spine = spine
                        .saturating_add(storage.linear(latent, h))
                        .saturating_add(storage.linear(h, latent));
                }
                if let Some(s) = &m.shared_expert {
                    spine = spine.saturating_add(mlp_bytes(storage, h, s.intermediate));
                    if s.sigmoid_gate {
                        spine = spine.saturating_add(storage.plain(h as u64));
                    }
                }
            }
        }
    }
    if spec.attn_res_block.is_some() {
        // Block attention residuals: a `[hidden]` query per layer for the MLP
        // input, per layer but the first for the mixer input, and one for the
        // final norm's input; f32, as inkling2 keeps and saves them.
        let queries = 2 * spec.layers.len() as u64;
        spine = spine.saturating_add(mul(mul(queries, h as u64), 4));
    }
    let (moe_layers, experts_per_layer, top_k) = moe_shape(spec);
    ModelSizes {
        layers: spec.layers.len(),
        moe_layers,
        experts_per_layer,
        top_k,
        spine_bytes: spine,
        expert_bytes,
        bank_bytes: bank,
        exact: false,
    }
}

/// A SwiGLU MLP: gate and up `[i, h]`, down `[h, i]`.
fn mlp_bytes(storage: Storage, h: usize, i: usize) -> u64 {
    mul(storage.linear(i, h), 2).saturating_add(storage.linear(h, i))
}

/// One layer's mixer (attention or linear attention): projections and norms.
fn mixer_bytes(spec: &ModelSpec, mixer: &MixerSpec, s: Storage) -> u64 {
    let (h, heads) = (spec.hidden_size, spec.num_heads);
    match mixer {
        MixerSpec::Gqa => {
            let (q, kv) = (heads * spec.head_dim, spec.num_kv_heads * spec.head_dim);
            let norms = if spec.qk_norm { s.plain(2 * spec.head_dim as u64) } else { 0 };
            let qkv_bias = if spec.qkv_bias { s.plain((q + 2 * kv) as u64) } else { 0 };
            let o_bias = if spec.o_bias { s.plain(h as u64) } else { 0 };
            let sinks = if spec.attention_sinks { s.plain(heads as u64) } else { 0 };
            s.linear(q, h)
                .saturating_add(mul(s.linear(kv, h), 2))
                .saturating_add(s.linear(h, q))
                .saturating_add(norms)
                .saturating_add(qkv_bias)
                .saturating_add(o_bias)
                .saturating_add(sinks)
        }
        MixerSpec::Mla(m) => {
            let qk = heads * (m.qk_nope_head_dim + m.qk_rope_head_dim);
            let q = match m.q_lora_rank {
                Some(r) => s.linear(r, h).saturating_add(s.plain(r as u64)).saturating_add(s.linear(qk, r)),
                None => s.linear(qk, h),
            };
            let kv_a = s
                .linear(m.kv_lora_rank + m.qk_rope_head_dim, h)
                .saturating_add(s.plain(m.kv_lora_rank as u64));
            let kv_b = s.linear(heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank);
            let gate = if m.output_gate { s.linear(heads, h) } else { 0 };
            q.saturating_add(kv_a)
                .saturating_add(kv_b)
                .saturating_add(s.linear(h, heads * m.v_head_dim))
                .saturating_add(gate)
        }
        MixerSpec::Kda(k) => {
            // q, k, v [HD, h]; o [h, HD]; the low-rank forget gate f_a [D, h],
            // f_b [HD, D]; the output gate g_a [D, h] + g_b [HD, D], or one
            // full-rank g_proj [HD, h]; beta's b [H, h]; three depthwise
            // convolutions of K taps over HD channels; A_log [H], dt_bias [HD],
            // the output norm [D].
            let (hd, d) = (k.num_heads * k.head_dim, k.head_dim);
            let small = mul(mul(3, hd as u64), k.conv_kernel as u64).saturating_add((k.num_heads + hd + d) as u64);
            let output_gate = match k.output_gate {
                KdaOutputGate::LowRank => s.linear(d, h).saturating_add(s.linear(hd, d)),
                KdaOutputGate::FullRank => s.linear(hd, h),
            };
            mul(s.linear(hd, h), 3)
                .saturating_add(s.linear(h, hd))
                .saturating_add(s.linear(d, h))
                .saturating_add(s.linear(hd, d))
                .saturating_add(output_gate)
                .saturating_add(s.linear(k.num_heads, h))
                .saturating_add(s.plain(small))
        }
    }
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
pub fn miss_rate(budget: u64, bank: u64) -> f64 {
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

    #[test]
    fn storage_from_config_dtype() {
        assert_eq!(Storage::from_config(None, None).unwrap().bytes_per_weight, 2);
        assert_eq!(Storage::from_config(Some("float32"), None).unwrap().bytes_per_weight, 4);
        let e = Storage::from_config(Some("int3"), None).unwrap_err();
        assert!(e.to_string().contains("\"int3\""), "{e}");
        let fp8 = Storage::from_config(Some("bfloat16"), Some((128, 128))).unwrap();
        // 1 byte per element plus one f32 scale per 128x128 block (2 x 4 blocks).
        assert_eq!(fp8.linear(256, 512), 256 * 512 + 8 * 4);
        assert_eq!(fp8.plain(10), 20);
    }

    #[test]
    fn estimate_matches_the_bf16_fixture_exactly() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen3_moe_tiny");
        let spec = larder_model::arch::read_spec(&dir).unwrap();
        let s = estimate_sizes(&spec, Storage::from_config(Some("bfloat16"), None).unwrap());
        assert_eq!((s.layers, s.moe_layers, s.experts_per_layer, s.top_k), (4, 3, 8, 2));
        // From the fixture's safetensors header: every BF16 tensor, experts apart.
        assert_eq!((s.expert_bytes, s.bank_bytes, s.spine_bytes), (12288, 294912, 283008));
        assert!(!s.exact);
        let exact = ModelSizes::exact(&spec, 283008, 294912);
        assert_eq!(exact.expert_bytes, 12288);
        assert!(exact.exact);
    }

    #[test]
    fn attention_residual_queries_count_in_the_spine() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/kimi_linear_attn_res");
        let spec = larder_model::arch::read_spec(&dir).unwrap();
        let bf16 = Storage::from_config(Some("bfloat16"), None).unwrap();
        let with = estimate_sizes(&spec, bf16).spine_bytes;
        let mut plain = spec.clone();
        plain.attn_res_block = None;
        // 7 layers, hidden 48: 6 attention_input + 7 mlp_input + final_input, f32 (as the fixture ships them).
        assert_eq!(with - estimate_sizes(&plain, bf16).spine_bytes, 14 * 48 * 4);
    }

    /// Latent-space experts: experts are latent wide, the two projections
    /// are spine; the all-bf16 fixture's estimate equals its safetensors sizes.
    #[test]
    fn estimate_matches_the_latent_kimi_fixture_exactly() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/kimi_linear_latent");
        let spec = larder_model::arch::read_spec(&dir).unwrap();
        let ckpt = larder_model::checkpoint::Checkpoint::open(&dir).unwrap();
        let bank = crate::experts::direct_index(&spec, &ckpt).unwrap().total_bytes();
        let total: u64 = ckpt.names().into_iter().map(|n| ckpt.tensor_info(n).unwrap().len).sum();
        let s = estimate_sizes(&spec, Storage::from_config(Some("bfloat16"), None).unwrap());
        // 3 matrices of 16 x 24 in bf16 per expert (hidden 64 would be 6144).
        assert_eq!(s.expert_bytes, 3 * 16 * 24 * 2);
        assert_eq!((s.bank_bytes, s.spine_bytes), (bank, total - bank));
    }

    /// Every tensor's bytes of fixture `name`: (routed experts, the rest).
    fn fixture_bytes(name: &str, is_expert: impl Fn(&str) -> bool) -> (u64, u64) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name);
        let ckpt = larder_model::checkpoint::Checkpoint::open(&dir).unwrap();
        let (mut bank, mut spine) = (0, 0);
        for n in ckpt.names() {
            let len = ckpt.tensor_info(n).unwrap().len;
            *(if is_expert(n) { &mut bank } else { &mut spine }) += len;
        }
        (bank, spine)
    }

    /// compressed-tensors 4-bit experts count at their packed size (codes,
    /// scales, INT4's weight_shape); the estimate equals the fixtures'
    /// safetensors sizes, and the bank equals what `larder pack` indexes.
    #[test]
    fn estimate_matches_the_compressed_tensors_4bit_fixtures_exactly() {
        // hidden 64, expert intermediate 32: gate, up [32, 64], down [64, 32].
        for (name, expert) in [
            ("deepseek_v3_int4", 3 * (32 * 64 / 2 + 64 * 2 + 8)),
            ("deepseek_v3_mxfp4", 3 * (32 * 64 / 2 + 64)),
        ] {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name);
            let spec = larder_model::arch::read_spec(&dir).unwrap();
            let ckpt = larder_model::checkpoint::Checkpoint::open(&dir).unwrap();
            let indexed = crate::experts::direct_index(&spec, &ckpt).unwrap().total_bytes();
            let (bank, spine) = fixture_bytes(name, |n| n.contains(".mlp.experts."));
            assert_eq!(indexed, bank, "{name}");
            let s = estimate_sizes(&spec, Storage::from_config(Some("bfloat16"), None).unwrap());
            assert_eq!(s.expert_bytes, expert, "{name}");
            assert_eq!((s.bank_bytes, s.spine_bytes), (bank, spine), "{name}");
        }
    }

    /// gpt-oss: fused experts with biases (bf16, or MXFP4 blocks and scales),
    /// router bias, attention biases and sinks; equal to the fixtures' sizes.
    #[test]
    fn estimate_matches_the_gpt_oss_fixtures_exactly() {
        let experts = |n: &str| n.contains(".mlp.experts.");
        let bf16 = Storage::from_config(Some("bfloat16"), None).unwrap();
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/gpt_oss_bf16");
        let spec = larder_model::arch::read_spec(&dir).unwrap();
        let s = estimate_sizes(&spec, bf16);
        // gate_up [64, 64] + down [32, 64] + biases 64 + 64, bf16.
        assert_eq!(s.expert_bytes, (3 * 32 * 64 + 64 + 64) * 2);
        assert_eq!((s.bank_bytes, s.spine_bytes), fixture_bytes("gpt_oss_bf16", experts));

        // gpt_oss_tiny's shape (intermediate 64) read without its
        // quantization_config (refused by the gpt_oss reader until MXFP4
        // experts load), sized as MXFP4.
        let tmp = std::env::temp_dir().join(format!("larder-plan-gpt-oss-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let fixture = dir.with_file_name("gpt_oss_tiny");
        let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture.join("config.json")).unwrap()).unwrap();
        assert_eq!(cfg["quantization_config"]["quant_method"], "mxfp4");
        cfg.as_object_mut().unwrap().remove("quantization_config");
        std::fs::write(tmp.join("config.json"), cfg.to_string()).unwrap();
        let spec = larder_model::arch::read_spec(&tmp).unwrap();
        let _ = std::fs::remove_dir_all(&tmp);
        let s = estimate_sizes(&spec, bf16.with_mxfp4_experts(true));
        // gate_up [128, 64] and down [64, 64] at 4 bits + a scale byte per 32, bf16 biases.
        assert_eq!(s.expert_bytes, 128 * 32 + 128 * 2 + 64 * 32 + 64 * 2 + (128 + 64) * 2);
        assert_eq!((s.bank_bytes, s.spine_bytes), fixture_bytes("gpt_oss_tiny", experts));
    }
}
