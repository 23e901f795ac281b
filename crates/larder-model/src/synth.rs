//! Synthetic checkpoints: real layouts (config.json, sharded safetensors with
//! the architecture's tensor names, index.json), random weights, any size.
//! This is how larder tests scale without downloading terabytes.
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
//! uniformly (consecutive-token overlap ~ k/E). [`Routing::Skewed`] adds a
//! Zipf-like popularity (a direction shared by every embedding, weighted per
//! expert by 1/rank in the router) and temporal locality (tokens fall into
//! clusters of 64 ids that share an embedding component, and the LM head
//! prefers tokens of the current cluster).
//!
//! Files are written under `.partial` names and renamed when complete;
//! `config.json` is written last, so an interrupted synth is not loadable.

use std::io::Write;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::Serialize;

use crate::error::ModelError;

/// How routing should behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Routing {
    Uniform,
    Skewed,
}

/// The shape of a synthetic Qwen3-MoE checkpoint.
#[derive(Debug, Clone, Serialize)]
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
    /// DeepSeek-V3 layout: MLA, a dense first layer, shared experts, grouped sigmoid routing.
    pub deepseek: Option<DeepseekShape>,
}

/// The DeepSeek-V3-specific dimensions of a synthetic checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct DeepseekShape {
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub n_shared_experts: usize,
    pub first_k_dense_replace: usize,
    pub n_group: usize,
    pub topk_group: usize,
}

impl SynthSpec {
    /// A preset (`tiny`, `k3-mini`); with `experts_gib`, the layer count is
    /// chosen so routed experts total about that many GiB.
    pub fn preset(arch: &str, preset: &str, experts_gib: Option<f64>) -> Result<SynthSpec, String> {
        if arch != "qwen3_moe" && arch != "deepseek_v3" {
            return Err(format!(
                "--arch {arch}: synthetic checkpoints are available for qwen3_moe and deepseek_v3"
            ));
        }
        let mut s = match preset {
            "tiny" => SynthSpec {
                arch: arch.into(),
                preset: preset.into(),
                hidden: 64,
                expert_intermediate: 32,
                experts: 16,
                top_k: 2,
                layers: 3,
                heads: 4,
                kv_heads: 2,
                head_dim: 16,
                vocab: 512,
                seed: 0,
                routing: Routing::Uniform,
                deepseek: (arch == "deepseek_v3").then_some(DeepseekShape {
                    q_lora_rank: 48,
                    kv_lora_rank: 32,
                    qk_nope_head_dim: 16,
                    qk_rope_head_dim: 8,
                    v_head_dim: 16,
                    n_shared_experts: 1,
                    first_k_dense_replace: 1,
                    n_group: 4,
                    topk_group: 2,
                }),
            },
            // Kimi-class expert size (~17.3 MB in bf16), top-8 of 64.
            "k3-mini" => SynthSpec {
                arch: arch.into(),
                preset: preset.into(),
                hidden: 2048,
                expert_intermediate: 1408,
                experts: 64,
                top_k: 8,
                layers: 24,
                heads: 16,
                kv_heads: 4,
                head_dim: 128,
                vocab: 32000,
                seed: 0,
                routing: Routing::Uniform,
                // DeepSeek-V3's proportions at hidden 2048: 8 groups, 4 eligible.
                deepseek: (arch == "deepseek_v3").then_some(DeepseekShape {
                    q_lora_rank: 512,
                    kv_lora_rank: 256,
                    qk_nope_head_dim: 64,
                    qk_rope_head_dim: 32,
                    v_head_dim: 64,
                    n_shared_experts: 1,
                    first_k_dense_replace: 1,
                    n_group: 8,
                    topk_group: 4,
                }),
            },
            other => return Err(format!("unknown preset {other:?} (tiny, k3-mini)")),
        };
        if let Some(gib) = experts_gib {
            if !(gib.is_finite() && gib > 0.0) {
                return Err("--experts-gib must be positive".into());
            }
            let per_layer = (s.experts * s.expert_bytes()) as f64;
            let dense = s.deepseek.as_ref().map_or(0, |d| d.first_k_dense_replace);
            s.layers = ((gib * (1u64 << 30) as f64 / per_layer).round() as usize).max(1) + dense;
        }
        Ok(s)
    }

    /// Bytes of one routed expert (bf16 gate, up, down).
    pub fn expert_bytes(&self) -> usize {
        3 * self.hidden * self.expert_intermediate * 2
    }

    /// Layers with routed experts.
    pub fn moe_layers(&self) -> usize {
        self.layers - self.deepseek.as_ref().map_or(0, |d| d.first_k_dense_replace.min(self.layers))
    }

    pub fn total_expert_bytes(&self) -> u64 {
        (self.moe_layers() * self.experts * self.expert_bytes()) as u64
    }

    /// Bytes of every tensor [`write`](write()) writes (the total its progress counts):
    /// embeddings, final norm, LM head and every layer, experts included.
    pub fn total_bytes(&self) -> u64 {
        let top = (2 * self.vocab * self.hidden + self.hidden) as u64 * 2;
        top + (0..self.layers)
            .flat_map(|l| layer_tensors(self, l))
            .map(|t| t.bytes())
            .sum::<u64>()
    }

    fn config(&self) -> serde_json::Value {
        if let Some(d) = &self.deepseek {
            return serde_json::json!({
                "architectures": ["DeepseekV3ForCausalLM"],
                "model_type": "deepseek_v3",
                "hidden_size": self.hidden,
                "intermediate_size": self.expert_intermediate * 4,
                "moe_intermediate_size": self.expert_intermediate,
                "n_routed_experts": self.experts,
                "num_experts_per_tok": self.top_k,
                "n_shared_experts": d.n_shared_experts,
                "first_k_dense_replace": d.first_k_dense_replace,
                "moe_layer_freq": 1,
                "n_group": d.n_group,
                "topk_group": d.topk_group,
                "norm_topk_prob": true,
                "routed_scaling_factor": 2.5,
                "scoring_func": "sigmoid",
                "topk_method": "noaux_tc",
                "q_lora_rank": d.q_lora_rank,
                "kv_lora_rank": d.kv_lora_rank,
                "qk_nope_head_dim": d.qk_nope_head_dim,
                "qk_rope_head_dim": d.qk_rope_head_dim,
                "v_head_dim": d.v_head_dim,
                "rope_interleave": true,
                "num_hidden_layers": self.layers,
                "num_attention_heads": self.heads,
                "num_key_value_heads": self.heads,
                "vocab_size": self.vocab,
                "max_position_embeddings": 8192,
                "rms_norm_eps": 1e-6,
                "rope_theta": 10000.0,
                "tie_word_embeddings": false,
                "attention_bias": false,
                "hidden_act": "silu",
                "torch_dtype": "bfloat16",
                "bos_token_id": 0,
                "eos_token_id": self.vocab - 1,
                "num_nextn_predict_layers": 0,
                "larder_synth": {"preset": self.preset, "seed": self.seed, "routing": self.routing},
            });
        }
        serde_json::json!({
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "hidden_size": self.hidden,
            "intermediate_size": self.expert_intermediate * 4,
            "moe_intermediate_size": self.expert_intermediate,
            "num_experts": self.experts,
            "num_experts_per_tok": self.top_k,
            "norm_topk_prob": true,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab,
            "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": false,
            "attention_bias": false,
            "hidden_act": "silu",
            "torch_dtype": "bfloat16",
            "bos_token_id": 0,
            "eos_token_id": self.vocab - 1,
            "larder_synth": {"preset": self.preset, "seed": self.seed, "routing": self.routing},
        })
    }
}

/// One tensor to generate.
struct TensorPlan {
    name: String,
    shape: Vec<usize>,
    kind: Init,
}

#[derive(Clone, Copy)]
enum Init {
    /// Uniform with this std, seeded by the tensor's index.
    Uniform(f32),
    Ones,
    Zeros,
    Embedding,
    LmHead,
    Router,
}

impl TensorPlan {
    fn bytes(&self) -> u64 {
        self.shape.iter().product::<usize>() as u64 * 2
    }
}

/// Writes the checkpoint; `progress(bytes)` as tensors are written.
pub fn write(spec: &SynthSpec, out: &Path, progress: &mut dyn FnMut(u64)) -> Result<Vec<PathBuf>, ModelError> {
    let io = |p: &Path, e: std::io::Error| ModelError::Io {
        path: p.to_path_buf(),
        source: e,
    };
    std::fs::create_dir_all(out).map_err(|e| io(out, e))?;
    let h = spec.hidden;
    // Shard 0: embeddings, final norm, LM head; shard l+1: layer l.
    let mut shards: Vec<Vec<TensorPlan>> = vec![vec![
        t("model.embed_tokens.weight", &[spec.vocab, h], Init::Embedding),
        t("model.norm.weight", &[h], Init::Ones),
        t("lm_head.weight", &[spec.vocab, h], Init::LmHead),
    ]];
    for l in 0..spec.layers {
        shards.push(layer_tensors(spec, l));
    }
    let n = shards.len();
    let mut weight_map = serde_json::Map::new();
    let mut files = Vec::new();
    let mut seed_index = 0u64;
    for (s, tensors) in shards.iter().enumerate() {
        let name = format!("model-{:05}-of-{:05}.safetensors", s + 1, n);
        let path = out.join(&name);
        let tmp = out.join(format!("{name}.partial"));
        write_shard(spec, &tmp, tensors, &mut seed_index, progress).map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))?;
        for tp in tensors {
            weight_map.insert(tp.name.clone(), serde_json::Value::String(name.clone()));
        }
        files.push(path);
    }
    let total: u64 = shards.iter().flatten().map(|t| t.bytes()).sum();
    let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    let write_json = |name: &str, v: &serde_json::Value| -> Result<(), ModelError> {
        let path = out.join(name);
        let tmp = out.join(format!("{name}.partial"));
        let text = serde_json::to_vec_pretty(v).map_err(|e| ModelError::Experts(e.to_string()))?;
        std::fs::write(&tmp, text).map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))
    };
    write_json("model.safetensors.index.json", &index)?;
    write_json(
        "generation_config.json",
        &serde_json::json!({"bos_token_id": 0, "eos_token_id": spec.vocab - 1}),
    )?;
    write_json("config.json", &spec.config())?;
    Ok(files)
}

/// Every tensor of layer `l`, named as the architecture's checkpoints name them.
fn layer_tensors(spec: &SynthSpec, l: usize) -> Vec<TensorPlan> {
    let (h, i, hd) = (spec.hidden, spec.expert_intermediate, spec.head_dim);
    let (small, proj) = (0.002f32, 0.02f32);
    let p = format!("model.layers.{l}");
    let mut v = vec![
        t(&format!("{p}.input_layernorm.weight"), &[h], Init::Ones),
        t(&format!("{p}.post_attention_layernorm.weight"), &[h], Init::Ones),
    ];
    let a = format!("{p}.self_attn");
    let moe = match &spec.deepseek {
        None => {
            v.extend([
                t(&format!("{a}.q_proj.weight"), &[spec.heads * hd, h], Init::Uniform(proj)),
                t(&format!("{a}.k_proj.weight"), &[spec.kv_heads * hd, h], Init::Uniform(proj)),
                t(&format!("{a}.v_proj.weight"), &[spec.kv_heads * hd, h], Init::Uniform(proj)),
                t(&format!("{a}.o_proj.weight"), &[h, spec.heads * hd], Init::Uniform(small)),
                t(&format!("{a}.q_norm.weight"), &[hd], Init::Ones),
                t(&format!("{a}.k_norm.weight"), &[hd], Init::Ones),
            ]);
            true
        }
        Some(d) => {
            let qk = d.qk_nope_head_dim + d.qk_rope_head_dim;
            v.extend([
                t(&format!("{a}.q_a_proj.weight"), &[d.q_lora_rank, h], Init::Uniform(proj)),
                t(&format!("{a}.q_a_layernorm.weight"), &[d.q_lora_rank], Init::Ones),
                t(
                    &format!("{a}.q_b_proj.weight"),
                    &[spec.heads * qk, d.q_lora_rank],
                    Init::Uniform(proj),
                ),
                t(
                    &format!("{a}.kv_a_proj_with_mqa.weight"),
                    &[d.kv_lora_rank + d.qk_rope_head_dim, h],
                    Init::Uniform(proj),
                ),
                t(&format!("{a}.kv_a_layernorm.weight"), &[d.kv_lora_rank], Init::Ones),
                t(
                    &format!("{a}.kv_b_proj.weight"),
                    &[spec.heads * (d.qk_nope_head_dim + d.v_head_dim), d.kv_lora_rank],
                    Init::Uniform(proj),
                ),
                t(&format!("{a}.o_proj.weight"), &[h, spec.heads * d.v_head_dim], Init::Uniform(small)),
            ]);
            if l < d.first_k_dense_replace {
                let di = spec.expert_intermediate * 4;
                v.extend([
                    t(&format!("{p}.mlp.gate_proj.weight"), &[di, h], Init::Uniform(proj)),
                    t(&format!("{p}.mlp.up_proj.weight"), &[di, h], Init::Uniform(proj)),
                    t(&format!("{p}.mlp.down_proj.weight"), &[h, di], Init::Uniform(small)),
                ]);
                false
            } else {
                let si = i * d.n_shared_experts;
                v.extend([
                    t(&format!("{p}.mlp.gate.e_score_correction_bias"), &[spec.experts], Init::Zeros),
                    t(&format!("{p}.mlp.shared_experts.gate_proj.weight"), &[si, h], Init::Uniform(proj)),
                    t(&format!("{p}.mlp.shared_experts.up_proj.weight"), &[si, h], Init::Uniform(proj)),
                    t(&format!("{p}.mlp.shared_experts.down_proj.weight"), &[h, si], Init::Uniform(small)),
                ]);
                true
            }
        }
    };
    if moe {
        v.push(t(&format!("{p}.mlp.gate.weight"), &[spec.experts, h], Init::Router));
        for e in 0..spec.experts {
            let x = format!("{p}.mlp.experts.{e}");
            v.push(t(&format!("{x}.gate_proj.weight"), &[i, h], Init::Uniform(proj)));
            v.push(t(&format!("{x}.up_proj.weight"), &[i, h], Init::Uniform(proj)));
            v.push(t(&format!("{x}.down_proj.weight"), &[h, i], Init::Uniform(small)));
        }
    }
    v
}

fn t(name: &str, shape: &[usize], kind: Init) -> TensorPlan {
    TensorPlan {
        name: name.into(),
        shape: shape.to_vec(),
        kind,
    }
}

fn write_shard(
    spec: &SynthSpec,
    path: &Path,
    tensors: &[TensorPlan],
    seed_index: &mut u64,
    progress: &mut dyn FnMut(u64),
) -> std::io::Result<()> {
    let mut header = serde_json::Map::new();
    let mut at = 0u64;
    for tp in tensors {
        header.insert(
            tp.name.clone(),
            serde_json::json!({"dtype": "BF16", "shape": tp.shape, "data_offsets": [at, at + tp.bytes()]}),
        );
        at += tp.bytes();
    }
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut text = serde_json::to_vec(&serde_json::Value::Object(header))?;
    while text.len() % 8 != 0 {
        text.push(b' ');
    }
    let mut f = std::io::BufWriter::with_capacity(16 << 20, std::fs::File::create(path)?);
    f.write_all(&(text.len() as u64).to_le_bytes())?;
    f.write_all(&text)?;
    for tp in tensors {
        *seed_index += 1;
        let rows = if tp.shape.len() == 2 { tp.shape[0] } else { 1 };
        let cols = tp.shape.iter().product::<usize>() / rows;
        let data = generate(
            spec,
            tp.kind,
            rows,
            cols,
            spec.seed.wrapping_mul(0x9e37_79b9).wrapping_add(*seed_index),
        );
        f.write_all(&data)?;
        progress(data.len() as u64);
    }
    let f = f.into_inner().map_err(|e| e.into_error())?;
    f.sync_all()
}

/// SplitMix64: a tiny, fast, seedable generator (weights need speed, not quality).
fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Uniform in [-sqrt(3), sqrt(3)) (unit variance).
pub(crate) fn unit(x: &mut u64) -> f32 {
    let u = (splitmix(x) >> 40) as f32 / (1u64 << 24) as f32;
    (u * 2.0 - 1.0) * 1.732_050_8
}

/// Deterministic per-row seeds; rows are generated in parallel.
fn generate(spec: &SynthSpec, kind: Init, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut out = vec![0u8; rows * cols * 2];
    let skewed = spec.routing == Routing::Skewed;
    out.par_chunks_mut(cols * 2).enumerate().for_each(|(r, row)| {
        let mut s = seed.wrapping_mul(0x1000_0000_01b3) ^ (r as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let cluster = (r / 64) as u64;
        let mut pop = spec.seed ^ 0xabcd_ef01;
        let mut clu = spec.seed ^ 0x1234_5678 ^ cluster.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        // `pop` and `clu` replay the same sequences in every row: the shared
        // popularity direction and this row's cluster direction.
        for b in row.chunks_exact_mut(2) {
            let z = unit(&mut s);
            let v = match kind {
                Init::Ones => 1.0,
                Init::Zeros => 0.0,
                Init::Uniform(std) => z * std,
                Init::Embedding if skewed => {
                    // 0.6 own + 0.6 cluster + 0.5 popularity direction.
                    let (p, cl) = (unit(&mut pop), unit(&mut clu));
                    0.6 * z + 0.6 * cl + 0.5 * p
                }
                Init::Embedding => z,
                Init::LmHead if skewed => {
                    let cl = unit(&mut clu);
                    (0.5 * z + cl) / (cols as f32).sqrt()
                }
                Init::LmHead => z / (cols as f32).sqrt(),
                Init::Router if skewed => {
                    // Expert r leans on the popularity direction in proportion to
                    // 1/(r+1): a logit bias of about 2.5/(r+1) for every token.
                    let p = unit(&mut pop);
                    (z + 5.0 / (cols as f32).sqrt() * p / (r as f32 + 1.0)) / (cols as f32).sqrt()
                }
                Init::Router => z / (cols as f32).sqrt(),
            };
            b.copy_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
        }
    });
    out
}
