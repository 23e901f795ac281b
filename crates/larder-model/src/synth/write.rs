//! Writing a synthetic checkpoint: one safetensors shard per layer (plus one
//! for embeddings, final norm and LM head), index, generation config and
//! config.json last; each file under a `.partial` name until complete (the
//! shards through larder-tensor's one safetensors writer).
//! Values are drawn per row from SplitMix64 streams seeded by the spec's seed
//! and the tensor's name, in parallel, so the same spec and seed always give
//! the same bytes, whatever order the tensors are listed in.

use std::path::{Path, PathBuf};

use larder_tensor::safetensors_write::{Header, KeyOrder, SafetensorsWriter, TensorHeader};
use rayon::prelude::*;

use super::plan::{self, Dtype, Init, TensorPlan};
use super::{Routing, SynthSpec};
use crate::error::ModelError;

/// Writes the checkpoint; `progress(bytes)` as tensors are written.
pub fn write(spec: &SynthSpec, out: &Path, progress: &mut dyn FnMut(u64)) -> Result<Vec<PathBuf>, ModelError> {
    let io = |p: &Path, e: std::io::Error| ModelError::Io {
        path: p.to_path_buf(),
        source: e,
    };
    if let Some(latent) = spec.moe_latent_size {
        if spec.kda.is_none() || latent == 0 {
            return Err(ModelError::Config {
                path: out.join("config.json"),
                field: "moe_latent_size".into(),
                message: format!("{latent}: latent-space experts are written for kimi_linear only, at a width of 1 or more"),
            });
        }
    }
    if let Err(message) = spec.clone().set_experts_format(spec.experts_format) {
        return Err(ModelError::Config {
            path: out.join("config.json"),
            field: "quantization_config".into(),
            message,
        });
    }
    std::fs::create_dir_all(out).map_err(|e| io(out, e))?;
    // Shard 0: embeddings, final norm, LM head; shard l+1: layer l.
    let shards = plan::shards(spec, out)?;
    let n = shards.len();
    let mut weight_map = serde_json::Map::new();
    let mut files = Vec::new();
    for (s, tensors) in shards.iter().enumerate() {
        let name = format!("model-{:05}-of-{:05}.safetensors", s + 1, n);
        let path = write_shard(spec, &out.join(&name), tensors, progress)?;
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

/// Writes one shard at `path` (via `path.partial`); returns `path`.
fn write_shard(spec: &SynthSpec, path: &Path, tensors: &[TensorPlan], progress: &mut dyn FnMut(u64)) -> Result<PathBuf, ModelError> {
    let list: Vec<TensorHeader> = tensors
        .iter()
        .map(|tp| TensorHeader {
            name: tp.name.clone(),
            dtype: tp.dtype.name().to_string(),
            shape: tp.shape.clone(),
            len: tp.bytes(),
        })
        .collect();
    let header = Header::new(&list, &[("format", "pt")], KeyOrder::Sorted)?;
    let mut f = SafetensorsWriter::create(path, &header)?;
    for tp in tensors {
        // Rows: every dimension but the last (generated in parallel).
        let cols = tp.shape.last().copied().unwrap_or(1).max(1);
        let rows = tp.shape.iter().product::<usize>() / cols;
        let data = generate(
            spec,
            tp.kind,
            tp.dtype,
            rows,
            cols,
            spec.seed.wrapping_mul(0x9e37_79b9).wrapping_add(tp.seed),
        );
        f.write(&data)?;
        progress(data.len() as u64);
    }
    Ok(f.finish()?.commit()?)
}

/// rms of an INT4 code q = u - 8 over uniform u in 0..16: sqrt(mean of q^2) = sqrt(21.5).
const INT4_RMS: f32 = 4.636_809;
/// rms of an e2m1 value over the 16 codes: sqrt(8.5625).
const E2M1_RMS: f32 = 2.926_175_6;

/// Fills `row` for the 4-bit kinds (codes, scales, `weight_shape`); false for value kinds.
fn packed_row(kind: Init, row: &mut [u8], s: &mut u64) -> bool {
    match kind {
        Init::Codes => {
            for chunk in row.chunks_mut(8) {
                let bits = splitmix(s).to_le_bytes();
                chunk.copy_from_slice(&bits[..chunk.len()]);
            }
        }
        Init::Shape(rows, cols) => {
            for (b, v) in row.chunks_exact_mut(4).zip([rows, cols]) {
                b.copy_from_slice(&(v as i32).to_le_bytes());
            }
        }
        Init::E8m0(std) => {
            let exponent = (std / E2M1_RMS).log2().round() as i32;
            for b in row.iter_mut() {
                let step = (splitmix(s) % 3) as i32 - 1;
                *b = (127 + exponent + step).clamp(1, 254) as u8;
            }
        }
        Init::Int4Scale(std) => {
            for b in row.chunks_exact_mut(2) {
                let u = (splitmix(s) >> 40) as f32 / (1u64 << 24) as f32;
                let v = std / INT4_RMS * (u - 0.5).exp2();
                b.copy_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
            }
        }
        _ => return false,
    }
    true
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
fn generate(spec: &SynthSpec, kind: Init, dtype: Dtype, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let size = dtype.size();
    let mut out = vec![0u8; rows * cols * size];
    let skewed = spec.routing == Routing::Skewed;
    out.par_chunks_mut(cols * size).enumerate().for_each(|(r, row)| {
        let mut s = seed.wrapping_mul(0x1000_0000_01b3) ^ (r as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        if packed_row(kind, row, &mut s) {
            return;
        }
        let cluster = (r / 64) as u64;
        let mut pop = spec.seed ^ 0xabcd_ef01;
        let mut clu = spec.seed ^ 0x1234_5678 ^ cluster.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        // `pop` and `clu` replay the same sequences in every row: the shared
        // popularity direction and this row's cluster direction.
        for b in row.chunks_exact_mut(size) {
            let z = unit(&mut s);
            let v = match kind {
                Init::Ones => 1.0,
                Init::Zeros => 0.0,
                Init::Const(c) => c,
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
                Init::Codes | Init::Shape(..) | Init::E8m0(_) | Init::Int4Scale(_) => 0.0, // packed_row
            };
            match dtype {
                Dtype::Bf16 => b.copy_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes()),
                Dtype::F32 => b.copy_from_slice(&v.to_le_bytes()),
                Dtype::I32 | Dtype::U8 => {} // packed_row
            }
        }
    });
    out
}
