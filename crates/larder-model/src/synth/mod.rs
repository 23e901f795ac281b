//! Synthetic checkpoints: real layouts (config.json, sharded safetensors with
//! the architecture's tensor names, index.json), random weights, any size.
//! This is how larder tests scale without downloading terabytes.
//! Architectures: `qwen3_moe`, `deepseek_v3`, `kimi_linear` (KDA and MLA
//! layers in the K3 ratio 3:1, DeepSeek-style MoE), `kimi_k3` (Kimi K3 as
//! published: the `kimi_k3` wrapper around a kimi_linear text model with
//! every K3 field, `language_model.` tensor names, MXFP4 latent experts and
//! a small vision tower in a shard of its own) and `gpt_oss` (fused
//! experts with biases, attention sinks, alternating sliding windows); this
//! module owns the shapes and presets, `config` the config.json of each,
//! `plan` the tensor list (learned from the loaders through the weight
//! [`Recorder`](crate::Recorder); synth declares only how values are drawn),
//! `gpt_oss` and `kimi_k3` their presets and config, and `write` the files.
//!
//! Routed experts ship in bf16 or, as the largest checkpoints ship them, in
//! 4 bits ([`ExpertsFormat`]): compressed-tensors `pack-quantized` INT4 or
//! `mxfp4-pack-quantized` on the DeepSeek-V3 / Kimi layouts (Kimi K3's by
//! default, with its released `quantization_config`), gpt-oss's own
//! MXFP4 (`_blocks` / `_scales`) on gpt-oss. Codes are uniform random; scales
//! give the dequantized weights the std the bf16 experts have (see
//! `plan`).
//!
//! Scales are chosen so routing behaves like a trained model's would in the
//! case being tested, rather than collapsing (random matrices at one small
//! std make consecutive tokens reuse most experts, turning any I/O benchmark
//! into a page-cache benchmark):
//! - embeddings ~ U(std 1) and an **untied** random LM head, so each token's
//!   residual stream is its own and greedy decoding walks a random sequence;
//! - attention and expert output projections small (std 0.002), so the
//!   residual stays dominated by the current token;
//! - router rows with std 1/sqrt(hidden) (unit-variance logits).
//!
//! Under [`Routing::Uniform`] every token picks experts independently and
//! uniformly (consecutive-token overlap ~ k/E). The other presets set
//! [`RoutingKnobs`]: popularity skew (a direction shared by every embedding,
//! weighted per expert in the router), temporal locality (clusters of token
//! ids that greedy decoding walks through in order, sharing embedding
//! directions with the clusters before them) and layer-to-layer drift
//! (post-attention norm weights that change from layer to layer, so a later
//! layer's router on this layer's input recalls ~70% instead of ~98%); see
//! docs/store.md "Routing presets" for the calibration against published figures.
//!
//! Files are written under `.partial` names and renamed when complete;
//! `config.json` is written last, so an interrupted synth is not loadable.

mod config;
mod gpt_oss;
mod kimi_k3;
mod plan;
#[cfg(test)]
mod plan_tests;
mod write;

use serde::Serialize;

pub(crate) use write::unit;
pub use write::{remove_leftovers, write};

/// The architectures [`SynthSpec::preset`] writes.
pub const ARCHITECTURES: [&str; 5] = ["qwen3_moe", "deepseek_v3", "kimi_linear", "kimi_k3", "gpt_oss"];

/// How routed experts are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ExpertsFormat {
    /// bf16 weights (gpt-oss: the unquantized fused layout).
    Bf16,
    /// compressed-tensors `pack-quantized`: int4 codes (8 per i32), a bf16
    /// scale per 32 columns, `weight_shape` (deepseek_v3, kimi_linear).
    Int4,
    /// deepseek_v3, kimi_linear, kimi_k3: compressed-tensors
    /// `mxfp4-pack-quantized` (e2m1 codes 2 per byte, an e8m0 scale byte per
    /// 32 columns); gpt_oss: its own `_blocks` / `_scales` (`quant_method: mxfp4`).
    Mxfp4,
}

impl ExpertsFormat {
    /// `bf16`, `int4` or `mxfp4`.
    pub fn parse(s: &str) -> Result<ExpertsFormat, String> {
        match s {
            "bf16" => Ok(ExpertsFormat::Bf16),
            "int4" => Ok(ExpertsFormat::Int4),
            "mxfp4" => Ok(ExpertsFormat::Mxfp4),
            other => Err(format!("unknown experts format {other:?} (bf16, int4, mxfp4)")),
        }
    }

    /// The formats `arch` is written in; the first is the one its real checkpoints ship.
    pub fn for_arch(arch: &str) -> &'static [ExpertsFormat] {
        use ExpertsFormat::*;
        match arch {
            "gpt_oss" | "kimi_k3" => &[Mxfp4, Bf16],
            "deepseek_v3" | "kimi_linear" => &[Bf16, Int4, Mxfp4],
            _ => &[Bf16],
        }
    }

    /// Bytes of one `[rows, cols]` expert matrix (4-bit: codes, scales and,
    /// for INT4, the i32 `[2]` `weight_shape`).
    pub(crate) fn matrix_bytes(self, rows: usize, cols: usize) -> usize {
        let groups = rows * cols.div_ceil(32);
        match self {
            ExpertsFormat::Bf16 => rows * cols * 2,
            ExpertsFormat::Int4 => rows * cols / 2 + groups * 2 + 8,
            ExpertsFormat::Mxfp4 => rows * cols / 2 + groups,
        }
    }
}

/// How routing should behave: a preset of [`RoutingKnobs`] (see the module
/// doc and docs/store.md "Routing presets" for what each models and how it was calibrated).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Routing {
    /// Independent, uniform routing per token (GLM- and Qwen3-Next-class
    /// models route near-uniformly); every knob 0, so the next layer's
    /// router on this layer's input recalls ~98% (unrealistically easy).
    Uniform,
    /// Temporal locality (Qwen3-30B-A3B reuses experts within two tokens)
    /// with realistic router lookahead.
    Local,
    /// Skewed heat (K3: 85.6% of decode routes in the hottest 30% of
    /// experts) with realistic router lookahead.
    Skewed,
    /// Skew, some locality and realistic lookahead together.
    Mixed,
}

/// The routing presets, as `--routing` names them.
pub const ROUTINGS: [&str; 4] = ["uniform", "local", "skewed", "mixed"];

impl Routing {
    /// `uniform`, `local`, `skewed` or `mixed`.
    pub fn parse(s: &str) -> Result<Routing, String> {
        match s {
            "uniform" => Ok(Routing::Uniform),
            "local" => Ok(Routing::Local),
            "skewed" => Ok(Routing::Skewed),
            "mixed" => Ok(Routing::Mixed),
            other => Err(format!("--routing {other:?}: use {}", ROUTINGS.join(", "))),
        }
    }

    /// The preset's knobs (calibrated on qwen3_moe, 64 experts top-8; docs/store.md "Routing presets").
    pub fn knobs(self) -> RoutingKnobs {
        let (skew, locality, drift) = match self {
            Routing::Uniform => (0.0, 0.0, 0.0),
            Routing::Local => (0.0, 0.98, 0.3),
            Routing::Skewed => (4.0, 0.0, 0.5),
            Routing::Mixed => (4.0, 0.9, 0.45),
        };
        RoutingKnobs { skew, locality, drift }
    }
}

/// What the weights are drawn to make routing do (all 0: uniform routing).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RoutingKnobs {
    /// Popularity skew, 0 to 8: the hottest expert's logit bias in units of
    /// the routing logits' std; the expert of popularity rank `r` (of `E`)
    /// gets `skew * exp(-4 r / E)`. A direction shared by every embedding,
    /// weighted per expert in the router, carries it.
    pub skew: f64,
    /// Temporal locality, 0 to 0.99: tokens are in clusters of 16 ids and
    /// greedy decoding moves from cluster `c` to `c + 1` at every token (the
    /// LM head keys on the previous cluster's key, held in half of the
    /// embedding columns, which routers do not see: their post-attention
    /// norm weights are 0 there); the other half of a token's embedding
    /// shares `locality` of its variance with the tokens of the last
    /// `round(1 / (1 - locality))` clusters, linearly less the further back,
    /// so tokens `d` apart route alike by about `locality * (1 - d (1 - locality))`.
    pub locality: f64,
    /// Layer-to-layer drift, 0 to 2: each layer's post-attention norm
    /// weights are `1 + drift * (u + 2.5 * slow)`, `u` fresh per layer and
    /// `slow` a sum over the last 8 layers' innovations, so a later layer's
    /// router on this layer's normed input sees a differently weighted
    /// vector: a first drop in lookahead recall, then a slow decay with depth.
    pub drift: f64,
}

impl RoutingKnobs {
    /// Refuses a knob out of its range, naming its flag.
    pub fn check(&self) -> Result<(), String> {
        for (flag, v, max) in [
            ("--routing-skew", self.skew, 8.0),
            ("--routing-locality", self.locality, 0.99),
            ("--routing-drift", self.drift, 2.0),
        ] {
            if !(v.is_finite() && (0.0..=max).contains(&v)) {
                return Err(format!("{flag} {v}: use a value from 0 to {max}"));
            }
        }
        Ok(())
    }

    /// Every knob 0: the original uniform draw, byte for byte.
    pub(crate) fn is_uniform(&self) -> bool {
        self.skew == 0.0 && self.locality == 0.0 && self.drift == 0.0
    }
}

/// The shape of a synthetic checkpoint.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct SynthSpec {
    pub arch: String,
    pub preset: String,
    pub hidden: usize,
    pub expert_intermediate: usize,
    pub experts: usize,
    pub top_k: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub seed: u64,
    pub routing: Routing,
    /// Knobs overriding the preset's ([`Routing::knobs`]); `None`: the preset's.
    pub routing_knobs: Option<RoutingKnobs>,
    /// DeepSeek-V3 layout: MLA, a dense first layer, shared experts, grouped
    /// sigmoid routing (also the MLA and MoE of `kimi_linear`).
    pub deepseek: Option<DeepseekShape>,
    /// Kimi Linear: KDA mixers in every layer but each `mla_every`-th.
    pub kda: Option<KdaShape>,
    /// Kimi K3's latent experts (`routed_expert_hidden_size`): routed experts
    /// this wide between `block_sparse_moe.routed_expert_down_proj`
    /// `[N, hidden]` and `routed_expert_up_proj` `[hidden, N]` (`None`:
    /// experts at `hidden`). `kimi_linear` and `kimi_k3` only (K3's preset: 3584).
    pub routed_expert_hidden_size: Option<usize>,
    /// `latent_moe_use_norm`: the experts' weighted sum is RMS-normalised
    /// (`routed_expert_norm.weight` `[N]`) before `routed_expert_up_proj`, as
    /// K3 ships. Only with [`Self::routed_expert_hidden_size`].
    pub latent_moe_use_norm: bool,
    /// Kimi K3 as published (`kimi_k3`): the wrapper, its K3 fields and the vision tower.
    pub k3: Option<K3Shape>,
    /// How routed experts are stored (bf16 unless set; gpt_oss: MXFP4).
    pub experts_format: ExpertsFormat,
    /// gpt-oss: fused experts with biases, sinks, sliding-window layers.
    pub gpt_oss: Option<GptOssShape>,
}

/// The gpt-oss-specific dimensions of a synthetic checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct GptOssShape {
    /// Window of the sliding-attention layers (0-based even layers; odd ones are full).
    pub sliding_window: usize,
}

/// The DeepSeek-V3-specific dimensions of a synthetic checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct DeepseekShape {
    /// Rank of `q_a_proj`; `None` is one `q_proj` (Kimi Linear's MLA, `q_lora_rank: null`).
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub n_shared_experts: usize,
    pub first_k_dense_replace: usize,
    pub n_group: usize,
    pub topk_group: usize,
}

/// What `kimi_k3` adds to a `kimi_linear` text model (the other K3 fields
/// are written with their released values: SiTU betas 4.0 / 25.0, KDA gate
/// lower bound −5.0, full-rank KDA and MLA output gates).
#[derive(Debug, Clone, Serialize)]
pub struct K3Shape {
    /// `attn_res_block_size`: layers per attention-residual block (K3: 12).
    pub attn_res_block_size: usize,
}

/// The KDA (Kimi Delta Attention) dimensions of a synthetic `kimi_linear` or `kimi_k3` checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct KdaShape {
    /// `linear_attn_config.num_heads` (H).
    pub heads: usize,
    /// `linear_attn_config.head_dim` (D, also the rank of `f_a`/`g_a`).
    pub head_dim: usize,
    /// `linear_attn_config.short_conv_kernel_size`.
    pub conv_kernel: usize,
    /// MLA in the 1-based layers `mla_every`, `2 * mla_every`, ... (K3: 4, three KDA to one MLA).
    pub mla_every: usize,
    /// MLA in the last layer too (K3's release: `full_attn_layers` 4, 8, ..., 92, 93).
    pub mla_last: bool,
}

impl KdaShape {
    /// Whether 0-based layer `l` of `layers` is KDA (else MLA).
    pub(crate) fn is_kda(&self, l: usize, layers: usize) -> bool {
        !((l + 1).is_multiple_of(self.mla_every) || (self.mla_last && l + 1 == layers))
    }
}

impl SynthSpec {
    /// A preset (`tiny`, `k3-mini`; gpt_oss: `tiny`, `20b`, `120b`; kimi_k3:
    /// `tiny`, `k3`) of `arch` (one of [`ARCHITECTURES`]);
    /// with `experts_gib`, the layer count is chosen so routed experts total
    /// about that many GiB (rounded to whole MoE layers, plus the dense ones).
    pub fn preset(arch: &str, preset: &str, experts_gib: Option<f64>) -> Result<SynthSpec, String> {
        if !ARCHITECTURES.contains(&arch) {
            return Err(format!(
                "--arch {arch}: synthetic checkpoints are available for {}",
                ARCHITECTURES.join(", ")
            ));
        }
        let mut s = match (arch, preset) {
            ("gpt_oss", _) => gpt_oss::preset(preset)?,
            ("kimi_k3", _) => kimi_k3::preset(preset)?,
            (_, "tiny") => tiny(arch),
            (_, "k3-mini") => k3_mini(arch),
            (_, other) => return Err(format!("unknown preset {other:?} (tiny, k3-mini)")),
        };
        if let Some(gib) = experts_gib {
            s.size_experts(gib)?;
        }
        Ok(s)
    }

    /// Sets the layer count so routed experts total about `gib` GiB (whole
    /// MoE layers, plus the dense ones) at the current expert shape.
    pub fn size_experts(&mut self, gib: f64) -> Result<(), String> {
        if !(gib.is_finite() && gib > 0.0) {
            return Err("--experts-gib must be positive".into());
        }
        let per_layer = (self.experts * self.expert_bytes()) as f64;
        let dense = self.deepseek.as_ref().map_or(0, |d| d.first_k_dense_replace);
        self.layers = ((gib * (1u64 << 30) as f64 / per_layer).round() as usize).max(1) + dense;
        Ok(())
    }

    /// Bytes of one routed expert as stored: gate, up and down in
    /// [`Self::experts_format`] (gpt-oss: plus its bf16 biases).
    pub fn expert_bytes(&self) -> usize {
        let (w, i, f) = (self.expert_width(), self.expert_intermediate, self.experts_format);
        let biases = if self.gpt_oss.is_some() { (2 * i + w) * 2 } else { 0 };
        if self.gpt_oss.is_some() && f == ExpertsFormat::Mxfp4 {
            // Fused gate_up [2I, W] and down [W, I]: no per-matrix extras.
            return f.matrix_bytes(2 * i, w) + f.matrix_bytes(w, i) + biases;
        }
        2 * f.matrix_bytes(i, w) + f.matrix_bytes(w, i) + biases
    }

    /// Sets how routed experts are stored, refusing a format the
    /// architecture is not written in or shapes it cannot pack (4-bit
    /// formats pack groups of 32 input columns).
    pub fn set_experts_format(&mut self, format: ExpertsFormat) -> Result<(), String> {
        if !ExpertsFormat::for_arch(&self.arch).contains(&format) {
            let names: Vec<String> = ExpertsFormat::for_arch(&self.arch)
                .iter()
                .map(|f| format!("{f:?}").to_lowercase())
                .collect();
            return Err(format!(
                "--experts-format {}: {} experts are written in {}",
                format!("{format:?}").to_lowercase(),
                self.arch,
                names.join(", ")
            ));
        }
        self.experts_format = format;
        self.check_packable()
    }

    /// 4-bit experts need their input widths (expert width and intermediate size) in whole groups of 32.
    pub fn check_packable(&self) -> Result<(), String> {
        if self.experts_format == ExpertsFormat::Bf16 {
            return Ok(());
        }
        for (what, n) in [
            ("expert width", self.expert_width()),
            ("expert intermediate size", self.expert_intermediate),
        ] {
            if n == 0 || !n.is_multiple_of(32) {
                return Err(format!(
                    "{what} {n}: 4-bit experts pack groups of 32 columns, so it must be a multiple of 32"
                ));
            }
        }
        Ok(())
    }

    /// The routed experts' input and output width: the latent size, else `hidden`.
    pub fn expert_width(&self) -> usize {
        self.routed_expert_hidden_size.unwrap_or(self.hidden)
    }

    /// Refuses latent experts where they cannot be written: only the Kimi
    /// layouts (`kimi_linear`, `kimi_k3`) have them, at a width of 1 or
    /// more, and `latent_moe_use_norm` needs them.
    pub fn check_latent(&self) -> Result<(), String> {
        match self.routed_expert_hidden_size {
            Some(_) if self.kda.is_none() => Err(format!(
                "routed_expert_hidden_size: latent experts are a Kimi K3 extension, written for kimi_linear and kimi_k3, not {}",
                self.arch
            )),
            Some(0) => Err("routed_expert_hidden_size 0: latent experts need a width of 1 or more".into()),
            None if self.latent_moe_use_norm => Err("latent_moe_use_norm: true needs latent experts (routed_expert_hidden_size)".into()),
            _ => Ok(()),
        }
    }

    /// The BOS and EOS token ids config.json and generation_config.json
    /// give (Kimi K3: the release's specials, near the end of the vocabulary).
    pub fn bos_eos(&self) -> (usize, usize) {
        match self.k3 {
            Some(_) => {
                let (bos, eos, _, _) = kimi_k3::special_ids(self.vocab);
                (bos, eos)
            }
            None => (0, self.vocab - 1),
        }
    }

    /// The routing knobs in effect: the overrides, else the preset's.
    pub fn knobs(&self) -> RoutingKnobs {
        self.routing_knobs.unwrap_or(self.routing.knobs())
    }

    /// Layers with routed experts.
    pub fn moe_layers(&self) -> usize {
        self.layers - self.deepseek.as_ref().map_or(0, |d| d.first_k_dense_replace.min(self.layers))
    }

    pub fn total_expert_bytes(&self) -> u64 {
        (self.moe_layers() * self.experts * self.expert_bytes()) as u64
    }

    /// Bytes of every tensor [`write`](write()) writes (the total its progress counts):
    /// embeddings, final norm, LM head and every layer, experts included;
    /// learned, as the tensors are, from recording the architecture's loader.
    pub fn total_bytes(&self) -> Result<u64, crate::ModelError> {
        let shards = plan::shards(self, std::path::Path::new("."))?;
        Ok(shards.iter().flatten().map(|t| t.bytes()).sum())
    }
}

/// hidden 64, 16 experts, top-2; kimi_linear: 5 layers (KDA x3, MLA, KDA).
fn tiny(arch: &str) -> SynthSpec {
    let kimi = arch == "kimi_linear";
    SynthSpec {
        arch: arch.into(),
        preset: "tiny".into(),
        hidden: 64,
        expert_intermediate: 32,
        experts: 16,
        top_k: 2,
        layers: if kimi { 5 } else { 3 },
        heads: 4,
        kv_heads: if kimi { 4 } else { 2 },
        head_dim: 16,
        vocab: 512,
        seed: 0,
        routing: Routing::Uniform,
        routing_knobs: None,
        deepseek: (arch != "qwen3_moe").then_some(DeepseekShape {
            // Moonshot's Kimi Linear MLA has no q LoRA (`q_lora_rank: null`).
            q_lora_rank: (!kimi).then_some(48),
            kv_lora_rank: 32,
            qk_nope_head_dim: 16,
            qk_rope_head_dim: 8,
            v_head_dim: 16,
            n_shared_experts: 1,
            first_k_dense_replace: 1,
            n_group: 4,
            topk_group: 2,
        }),
        kda: kimi.then_some(KdaShape {
            heads: 2,
            head_dim: 16,
            conv_kernel: 4,
            mla_every: 4,
            mla_last: false,
        }),
        routed_expert_hidden_size: None,
        latent_moe_use_norm: false,
        k3: None,
        experts_format: ExpertsFormat::Bf16,
        gpt_oss: None,
    }
}

/// Kimi-class expert size (~17.3 MB in bf16), top-8 of 64, hidden 2048.
/// kimi_linear: Kimi-Linear-48B-A3B's attention (hidden 2304: KDA 32 heads x
/// 128, MLA 32 heads, nope 128, rope 64, v 128, kv rank 512, no q LoRA)
/// scaled to hidden 2048: 28 heads of each (32 x 2048/2304 = 28.4), head
/// dims kept (the KDA state is H x 128 x 128 per layer, as in the real model).
fn k3_mini(arch: &str) -> SynthSpec {
    let kimi = arch == "kimi_linear";
    let heads = if kimi { 28 } else { 16 };
    SynthSpec {
        arch: arch.into(),
        preset: "k3-mini".into(),
        hidden: 2048,
        expert_intermediate: 1408,
        experts: 64,
        top_k: 8,
        layers: 24,
        heads,
        kv_heads: if kimi { heads } else { 4 },
        head_dim: 128,
        vocab: 32000,
        seed: 0,
        routing: Routing::Uniform,
        routing_knobs: None,
        // DeepSeek-V3's proportions at hidden 2048: 8 groups, 4 eligible.
        deepseek: match arch {
            "deepseek_v3" => Some(DeepseekShape {
                q_lora_rank: Some(512),
                kv_lora_rank: 256,
                qk_nope_head_dim: 64,
                qk_rope_head_dim: 32,
                v_head_dim: 64,
                n_shared_experts: 1,
                first_k_dense_replace: 1,
                n_group: 8,
                topk_group: 4,
            }),
            "kimi_linear" => Some(DeepseekShape {
                q_lora_rank: None,
                kv_lora_rank: 512,
                qk_nope_head_dim: 128,
                qk_rope_head_dim: 64,
                v_head_dim: 128,
                n_shared_experts: 1,
                first_k_dense_replace: 1,
                n_group: 8,
                topk_group: 4,
            }),
            _ => None,
        },
        kda: kimi.then_some(KdaShape {
            heads,
            head_dim: 128,
            conv_kernel: 4,
            mla_every: 4,
            mla_last: false,
        }),
        routed_expert_hidden_size: None,
        latent_moe_use_norm: false,
        k3: None,
        experts_format: ExpertsFormat::Bf16,
        gpt_oss: None,
    }
}

impl SynthSpec {
    /// The 1-based `kda_layers` and `full_attn_layers` of `linear_attn_config`.
    pub(super) fn layer_lists(&self, k: &KdaShape) -> (Vec<usize>, Vec<usize>) {
        (1..=self.layers).partition(|l| k.is_kda(l - 1, self.layers))
    }
}
