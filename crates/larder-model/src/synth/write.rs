//! Writing a synthetic checkpoint: one safetensors shard per layer (plus one
//! for embeddings, final norm and LM head, and Kimi K3's vision shard), index, generation config and
//! config.json last; each file under a `.partial` name until complete (the
//! shards through larder-tensor's one safetensors writer).
//! Values are drawn per row from SplitMix64 streams seeded by the spec's seed
//! and the tensor's name, in parallel, so the same spec and seed always give
//! the same bytes, whatever order the tensors are listed in.

use std::path::{Path, PathBuf};

use larder_tensor::safetensors_write::{Header, KeyOrder, SafetensorsWriter, TensorHeader};
use rayon::prelude::*;

use super::plan::{self, Dtype, Init, TensorPlan};
use super::SynthSpec;
use crate::error::ModelError;

/// Writes the checkpoint; `progress(bytes)` as tensors are written.
pub fn write(spec: &SynthSpec, out: &Path, progress: &mut dyn FnMut(u64)) -> Result<Vec<PathBuf>, ModelError> {
    let io = |p: &Path, e: std::io::Error| ModelError::Io {
        path: p.to_path_buf(),
        source: e,
    };
    if let Err(message) = spec.check_latent() {
        return Err(ModelError::Config {
            path: out.join("config.json"),
            field: "routed_expert_hidden_size".into(),
            message,
        });
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
    // Until config.json is written, a failure removes every file this run made.
    let mut made = Made(Vec::new());
    for (s, tensors) in shards.iter().enumerate() {
        let name = format!("model-{:05}-of-{:05}.safetensors", s + 1, n);
        let path = out.join(&name);
        made.0.push(path.clone());
        made.0.push(larder_tensor::safetensors_write::partial_path(&path));
        write_shard(spec, &path, tensors, progress)?;
        for tp in tensors {
            weight_map.insert(tp.name.clone(), serde_json::Value::String(name.clone()));
        }
    }
    for name in ["model.safetensors.index.json", "generation_config.json", "config.json"] {
        made.0.push(out.join(name));
        made.0.push(out.join(format!("{name}.partial")));
    }
    let total: u64 = shards.iter().flatten().map(|t| t.bytes()).sum();
    let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    let write_json = |name: &str, v: &serde_json::Value| -> Result<(), ModelError> {
        let path = out.join(name);
        let tmp = out.join(format!("{name}.partial"));
        let text = serde_json::to_vec_pretty(&sorted_keys(v)).map_err(|e| ModelError::Experts(e.to_string()))?;
        std::fs::write(&tmp, text).map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))
    };
    write_json("model.safetensors.index.json", &index)?;
    let (bos, eos) = spec.bos_eos();
    write_json(
        "generation_config.json",
        &serde_json::json!({"bos_token_id": bos, "eos_token_id": eos}),
    )?;
    write_json("config.json", &spec.config())?;
    let files = made
        .0
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .cloned()
        .collect();
    made.0.clear();
    Ok(files)
}

/// Files a synth run made (or was making); removed when dropped non-empty,
/// so a failed run leaves no shard or `.partial` file behind.
struct Made(Vec<PathBuf>);

impl Drop for Made {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Removes what an interrupted synth left in `out` (killed before it could
/// clean up): `model-NNNNN-of-NNNNN.safetensors` shards and `.partial`
/// files, only when `out` holds no config.json (no checkpoint). The names removed.
pub fn remove_leftovers(out: &Path) -> Result<Vec<PathBuf>, ModelError> {
    if out.join("config.json").exists() || !out.is_dir() {
        return Ok(Vec::new());
    }
    let read = std::fs::read_dir(out).map_err(|e| ModelError::Io {
        path: out.to_path_buf(),
        source: e,
    })?;
    let mut removed = Vec::new();
    for path in read.filter_map(|e| e.ok()).map(|e| e.path()) {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let shard = name.strip_prefix("model-").and_then(|r| r.strip_suffix(".safetensors"));
        let synth_shard = shard.is_some_and(|r| {
            r.len() == 14 && r.as_bytes()[5..9] == *b"-of-" && r[..5].bytes().chain(r[9..].bytes()).all(|b| b.is_ascii_digit())
        });
        if (synth_shard || name.ends_with(".partial")) && path.is_file() && std::fs::remove_file(&path).is_ok() {
            removed.push(path);
        }
    }
    Ok(removed)
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

/// Tokens per cluster under `--routing-locality`: greedy decoding moves
/// from cluster `c` to cluster `c + 1` at every token.
pub(super) const CLUSTER: usize = 16;
/// Columns of the embeddings that hold the cluster key under
/// `--routing-locality` (half of them; none otherwise).
pub(super) fn key_columns(spec: &SynthSpec) -> usize {
    if spec.knobs().locality > 0.0 {
        spec.hidden / 2
    } else {
        0
    }
}

/// Clusters (so tokens) a cluster's shared direction reaches back over
/// under `--routing-locality X`: `round(1 / (1 - X))`, so tokens `d` apart
/// share `X * (1 - d / window)` of their embeddings.
pub(super) fn window(locality: f32) -> usize {
    ((1.0 / (1.0 - locality)).round() as usize).clamp(1, 100)
}

/// Layers over which `--routing-drift`'s slow part of the post-attention
/// norm weights changes: layer `l`'s weights are `1 + drift * (u_l + SLOW *
/// (w_l + ... + w_{l-7}) / sqrt(8))` (u, w of unit variance, fresh per
/// layer), so a router's logits on a layer `d` earlier correlate about
/// `(1 + drift^2 SLOW^2 (1 - d/8)) / (1 + drift^2 (1 + SLOW^2))` with its own:
/// a first drop (the fresh part) and a slow decay with depth.
pub(super) const LAYER_WINDOW: usize = 8;
/// Weight of the slow part (see [`LAYER_WINDOW`]).
const SLOW: f32 = 2.5;

/// Weight of the key in LM head rows over their random part.
const ADVANCE: f32 = 6.0;

/// SplitMix64 seed of the direction `salt` of cluster `c`.
fn dir_seed(spec: &SynthSpec, salt: u64, c: usize) -> u64 {
    spec.seed ^ salt ^ (c as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Weight of the popularity direction in the embeddings (`--routing-skew` above 0).
const POPULAR: f32 = 0.5;

/// Deterministic per-row seeds; rows are generated in parallel.
fn generate(spec: &SynthSpec, kind: Init, dtype: Dtype, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let size = dtype.size();
    let mut out = vec![0u8; rows * cols * size];
    let k = spec.knobs();
    let (skewed, local) = (k.skew > 0.0, k.locality > 0.0);
    let (skew, locality) = (k.skew as f32, k.locality as f32);
    // Embedding mix: own, cluster (`locality`) and popularity (`skew`) directions.
    let own = (1.0 - locality).sqrt();
    let span = window(locality);
    let shared = locality.sqrt() / (span as f32).sqrt();
    let clusters = spec.vocab.div_ceil(CLUSTER).max(1);
    // Under `locality`, the first `keyed` columns of an embedding hold only
    // its cluster's key (what the LM head keys on) and routers are blind to
    // them (post-attention norm weights 0 there, see plan); the rest hold
    // the own, shared and popularity directions.
    let keyed = key_columns(spec);
    let popular = if skewed { POPULAR } else { 0.0 };
    // Router rows lean on the popularity direction so that expert `r` gets a
    // logit bias of `skew * exp(-4 r / E)` logit stds on every token. Routers
    // see the `frac` of columns outside the key, each of variance
    // `routed_var`: the logit std over experts is sqrt(frac * routed_var) /
    // rms(h) and `p . h` over those columns is `popular * frac * cols`.
    let frac = 1.0 - keyed as f32 / spec.hidden.max(1) as f32;
    let routed_var = 1.0 + popular * popular;
    let lean = if skewed {
        skew * (frac * routed_var).sqrt() / (POPULAR * frac)
    } else {
        0.0
    };
    out.par_chunks_mut(cols * size).enumerate().for_each(|(r, row)| {
        let mut s = seed.wrapping_mul(0x1000_0000_01b3) ^ (r as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        if packed_row(kind, row, &mut s) {
            return;
        }
        let mut pop = spec.seed ^ 0xabcd_ef01;
        // Under `locality`, replayed in every row of a cluster: the last
        // `span` clusters' shared directions, this cluster's key and the
        // previous cluster's key (the LM head's).
        let c = r / CLUSTER;
        let mut window: Vec<u64> = match local {
            true => (0..span)
                .map(|j| dir_seed(spec, 0x1234_5678, (c + clusters - j % clusters) % clusters))
                .collect(),
            false => Vec::new(),
        };
        let mut own_key = dir_seed(spec, 0x5eed_4b1d, c);
        let mut prev_key = dir_seed(spec, 0x5eed_4b1d, (c + clusters - 1) % clusters);
        // `--routing-drift`: the innovations of the last LAYER_WINDOW layers.
        let mut slow: Vec<u64> = match kind {
            Init::NormSpread(d, layer) if d > 0.0 => (0..LAYER_WINDOW)
                .map(|j| dir_seed(spec, 0x00d1_f7ed, layer + LAYER_WINDOW - j))
                .collect(),
            _ => Vec::new(),
        };
        let heat = lean * (-4.0 * r as f32 / rows as f32).exp();
        // `pop` replays the same sequence in every row: the shared
        // popularity direction.
        for (col, b) in row.chunks_exact_mut(size).enumerate() {
            let z = unit(&mut s);
            let v = match kind {
                Init::Ones => 1.0,
                Init::Zeros => 0.0,
                Init::Const(c) => c,
                Init::NormSpread(..) if col < keyed => 0.0,
                Init::NormSpread(drift, _) => {
                    1.0 + drift * (z + SLOW * slow.iter_mut().map(unit).sum::<f32>() / (LAYER_WINDOW as f32).sqrt())
                }
                Init::Uniform(std) => z * std,
                Init::Embedding if skewed || local => {
                    let p = unit(&mut pop);
                    let cl: f32 = window.iter_mut().map(unit).sum();
                    let kd = unit(&mut own_key);
                    if col < keyed {
                        kd
                    } else {
                        own * z + shared * cl + popular * p
                    }
                }
                Init::Embedding => z,
                // A token of cluster `c` keys on cluster `c - 1`'s key, ADVANCE
                // times its random part (which picks the token within the cluster).
                Init::LmHead if local => {
                    let kd = unit(&mut prev_key);
                    (z + if col < keyed { ADVANCE * kd } else { 0.0 }) / (cols as f32).sqrt()
                }
                Init::LmHead => z / (cols as f32).sqrt(),
                Init::Router if skewed => {
                    let p = unit(&mut pop);
                    (z + heat * p / (cols as f32).sqrt()) / (cols as f32).sqrt()
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

/// `v` with every object's keys in sorted order, as transformers writes
/// config files (`sort_keys=True`), whatever order `serde_json::Map` keeps
/// (another crate may turn on its `preserve_order`).
fn sorted_keys(v: &serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => {
            let sorted: std::collections::BTreeMap<&String, serde_json::Value> = m.iter().map(|(k, v)| (k, sorted_keys(v))).collect();
            serde_json::Value::Object(sorted.into_iter().map(|(k, v)| (k.clone(), v)).collect())
        }
        serde_json::Value::Array(a) => serde_json::Value::Array(a.iter().map(sorted_keys).collect()),
        v => v.clone(),
    }
}
