//! GGUF (llama architecture) to a Hugging Face Llama checkpoint folder, the
//! same bytes `scripts/smollm2_from_gguf.py` writes: f32 tensors dequantised
//! as ggml does, llama.cpp's rope permutation of `attn_q` / `attn_k` undone,
//! tensors in the script's order, `config.json`, `generation_config.json`
//! and the tokenizer files. Written to `OUT.tmp`, renamed to `OUT` last;
//! model.safetensors goes through larder-tensor's one safetensors writer
//! (`safetensors_write`, the script's `KeyOrder::AsGiven` header).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use larder_tensor::safetensors_write::{Header, KeyOrder, SafetensorsWriter, TensorHeader};

use super::gguf::{Gguf, TensorInfo, Value};
use super::json::{self, Style, J};
use super::tokenizer::{self, SpecialIds};
use super::{refuse, ConvertError, Result};

/// What a conversion wrote.
#[derive(Debug, Clone)]
pub struct Summary {
    pub tensors: usize,
    pub tied: bool,
    pub vocab_size: i64,
    /// Bytes of model.safetensors.
    pub bytes: u64,
}

/// The llama hyperparameters the script reads.
struct Hparams {
    hidden: i64,
    layers: i64,
    heads: i64,
    kv_heads: i64,
    ffn: i64,
    ctx: i64,
    rope_theta: f64,
    eps: f64,
}

fn int(g: &Gguf, key: &str) -> Result<Option<i64>> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_int()
            .map(Some)
            .ok_or_else(|| ConvertError::Gguf(format!("GGUF metadata {key:?} is not an integer"))),
    }
}

fn required_int(g: &Gguf, key: &str) -> Result<i64> {
    int(g, key)?.ok_or_else(|| ConvertError::Gguf(format!("GGUF metadata has no {key:?}")))
}

/// Python's `float(str(np.float32(x)))`: the shortest decimal that round-trips to the f32.
fn f32_shortest(g: &Gguf, key: &str) -> Result<Option<f64>> {
    let x = match g.get(key) {
        None => return Ok(None),
        Some(Value::F32(x)) => *x,
        Some(Value::F64(x)) => *x as f32,
        Some(v) => v
            .as_int()
            .ok_or_else(|| ConvertError::Gguf(format!("GGUF metadata {key:?} is not a number")))? as f32,
    };
    let shortest = format!("{x}");
    let parsed = shortest
        .parse::<f64>()
        .map_err(|e| ConvertError::Gguf(format!("GGUF metadata {key:?}: {shortest}: {e}")))?;
    Ok(Some(parsed))
}

fn hparams(g: &Gguf) -> Result<Hparams> {
    match g.get("general.architecture").and_then(Value::as_str) {
        Some("llama") => {}
        Some(a) => refuse!("general.architecture is {a:?}; only 'llama' is supported"),
        None => refuse!("GGUF metadata has no 'general.architecture'"),
    }
    let heads = required_int(g, "llama.attention.head_count")?;
    let hidden = required_int(g, "llama.embedding_length")?;
    if heads <= 0 || hidden <= 0 || hidden % heads != 0 {
        refuse!("embedding_length {hidden} is not a positive multiple of head_count {heads}");
    }
    if let Some(r) = int(g, "llama.rope.dimension_count")? {
        if r != hidden / heads {
            refuse!("partial rope (rope.dimension_count={r}, head_dim={}) unsupported", hidden / heads);
        }
    }
    match g.get("llama.rope.scaling.type") {
        None => {}
        Some(v) if v.as_str() == Some("none") => {}
        Some(_) => refuse!("rope scaling in GGUF metadata is not supported by this converter"),
    }
    Ok(Hparams {
        hidden,
        layers: required_int(g, "llama.block_count")?,
        heads,
        kv_heads: int(g, "llama.attention.head_count_kv")?.unwrap_or(heads),
        ffn: required_int(g, "llama.feed_forward_length")?,
        ctx: required_int(g, "llama.context_length")?,
        rope_theta: f32_shortest(g, "llama.rope.freq_base")?.unwrap_or(10000.0),
        eps: f32_shortest(g, "llama.attention.layer_norm_rms_epsilon")?
            .ok_or_else(|| ConvertError::Gguf("GGUF metadata has no 'llama.attention.layer_norm_rms_epsilon'".into()))?,
    })
}

/// The Hugging Face name of a GGUF tensor.
fn hf_name(gname: &str) -> Result<String> {
    let global = match gname {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(n) = global {
        return Ok(n.to_string());
    }
    let mut parts = gname.splitn(3, '.');
    let (blk, layer, rest) = (parts.next(), parts.next().and_then(|l| l.parse::<u64>().ok()), parts.next());
    let mapped = match rest {
        Some("attn_norm.weight") => "input_layernorm.weight",
        Some("attn_q.weight") => "self_attn.q_proj.weight",
        Some("attn_k.weight") => "self_attn.k_proj.weight",
        Some("attn_v.weight") => "self_attn.v_proj.weight",
        Some("attn_output.weight") => "self_attn.o_proj.weight",
        Some("ffn_norm.weight") => "post_attention_layernorm.weight",
        Some("ffn_gate.weight") => "mlp.gate_proj.weight",
        Some("ffn_up.weight") => "mlp.up_proj.weight",
        Some("ffn_down.weight") => "mlp.down_proj.weight",
        _ => refuse!("unexpected GGUF tensor {gname:?}"),
    };
    match (blk, layer) {
        (Some("blk"), Some(l)) => Ok(format!("model.layers.{l}.{mapped}")),
        _ => refuse!("unexpected GGUF tensor {gname:?}"),
    }
}

/// The script's tensor order: embeddings, layers by number then name, final norm, LM head.
fn sort_key(hf: &str) -> (u8, u64, String) {
    let p: Vec<&str> = hf.split('.').collect();
    let group = match p.get(1).copied() {
        _ if p[0] == "lm_head" => return (3, 0, hf.to_string()),
        Some("layers") => return (1, p.get(2).and_then(|l| l.parse().ok()).unwrap_or(0), hf.to_string()),
        Some("embed_tokens") => 0,
        _ => 2,
    };
    (group, 0, hf.to_string())
}

/// The shapes the config implies, by Hugging Face name.
fn expected_shapes(h: &Hparams, vocab: i64, tied: bool) -> HashMap<String, Vec<usize>> {
    let u = |x: i64| x as usize;
    let hd = h.hidden / h.heads;
    let mut exp = HashMap::new();
    exp.insert("model.embed_tokens.weight".to_string(), vec![u(vocab), u(h.hidden)]);
    exp.insert("model.norm.weight".to_string(), vec![u(h.hidden)]);
    for i in 0..h.layers {
        let p = format!("model.layers.{i}.");
        for (name, shape) in [
            ("input_layernorm.weight", vec![u(h.hidden)]),
            ("post_attention_layernorm.weight", vec![u(h.hidden)]),
            ("self_attn.q_proj.weight", vec![u(h.heads * hd), u(h.hidden)]),
            ("self_attn.k_proj.weight", vec![u(h.kv_heads * hd), u(h.hidden)]),
            ("self_attn.v_proj.weight", vec![u(h.kv_heads * hd), u(h.hidden)]),
            ("self_attn.o_proj.weight", vec![u(h.hidden), u(h.heads * hd)]),
            ("mlp.gate_proj.weight", vec![u(h.ffn), u(h.hidden)]),
            ("mlp.up_proj.weight", vec![u(h.ffn), u(h.hidden)]),
            ("mlp.down_proj.weight", vec![u(h.hidden), u(h.ffn)]),
        ] {
            exp.insert(format!("{p}{name}"), shape);
        }
    }
    if !tied {
        exp.insert("lm_head.weight".to_string(), vec![u(vocab), u(h.hidden)]);
    }
    exp
}

/// Undoes llama.cpp's `permute` of q/k rows: row (h, i, j) goes back to (h, j, i)
/// for `i < dim`, `j < 2` (numpy: `reshape(n_head, dim, 2, cols).swapaxes(1, 2)`).
fn unpermute_rope(w: &[f32], rows: usize, cols: usize, n_head: usize) -> Result<Vec<f32>> {
    if n_head == 0 || !rows.is_multiple_of(n_head * 2) {
        refuse!("{rows} rows cannot be split over {n_head} heads x 2 for the rope permutation");
    }
    let dim = rows / n_head / 2;
    let mut out = vec![0f32; w.len()];
    for h in 0..n_head {
        for i in 0..dim {
            for j in 0..2 {
                let src = (h * dim * 2 + i * 2 + j) * cols;
                let dst = (h * 2 * dim + j * dim + i) * cols;
                out[dst..dst + cols].copy_from_slice(&w[src..src + cols]);
            }
        }
    }
    Ok(out)
}

/// One output tensor: its GGUF source, HF name, shape and rope heads (q/k).
struct Planned<'a> {
    info: &'a TensorInfo,
    name: String,
    shape: Vec<usize>,
    rope_heads: Option<usize>,
}

fn plan<'a>(g: &'a Gguf, h: &Hparams, vocab: i64) -> Result<(Vec<Planned<'a>>, bool)> {
    let tied = !g.tensors.iter().any(|t| t.name == "output.weight");
    let mut out: Vec<Planned> = Vec::with_capacity(g.tensors.len());
    for t in &g.tensors {
        let name = hf_name(&t.name)?;
        if out.iter().any(|p| p.name == name) {
            refuse!("GGUF tensor {:?} appears twice", t.name);
        }
        let rope_heads = if t.name.ends_with("attn_q.weight") {
            Some(h.heads as usize)
        } else if t.name.ends_with("attn_k.weight") {
            Some(h.kv_heads as usize)
        } else {
            None
        };
        out.push(Planned {
            info: t,
            name,
            shape: t.shape(),
            rope_heads,
        });
    }
    let exp = expected_shapes(h, vocab, tied);
    for p in &out {
        match exp.get(&p.name) {
            None => refuse!("unexpected tensor {} (from GGUF {})", p.name, p.info.name),
            Some(s) if *s != p.shape => refuse!("{}: shape {:?}, expected {:?}", p.name, p.shape, s),
            Some(_) => {}
        }
    }
    if let Some(missing) = exp.keys().find(|k| !out.iter().any(|p| &p.name == *k)) {
        refuse!("tensor set mismatch: {missing} is missing from the GGUF");
    }
    out.sort_by_key(|p| sort_key(&p.name));
    Ok((out, tied))
}

fn config_json(h: &Hparams, ids: SpecialIds, vocab: i64, tied: bool) -> J {
    J::obj(vec![
        ("architectures", J::Arr(vec![J::s("LlamaForCausalLM")])),
        ("model_type", J::s("llama")),
        ("attention_bias", J::Bool(false)),
        ("attention_dropout", J::Float(0.0)),
        ("bos_token_id", J::opt_int(ids.bos)),
        ("eos_token_id", J::opt_int(ids.eos)),
        ("pad_token_id", J::opt_int(ids.pad)),
        ("head_dim", J::Int(h.hidden / h.heads)),
        ("hidden_act", J::s("silu")),
        ("hidden_size", J::Int(h.hidden)),
        ("initializer_range", J::Float(0.02)),
        ("intermediate_size", J::Int(h.ffn)),
        ("max_position_embeddings", J::Int(h.ctx)),
        ("mlp_bias", J::Bool(false)),
        ("num_attention_heads", J::Int(h.heads)),
        ("num_hidden_layers", J::Int(h.layers)),
        ("num_key_value_heads", J::Int(h.kv_heads)),
        ("pretraining_tp", J::Int(1)),
        ("rms_norm_eps", J::Float(h.eps)),
        ("rope_scaling", J::Null),
        ("rope_theta", J::Float(h.rope_theta)),
        ("tie_word_embeddings", J::Bool(tied)),
        ("torch_dtype", J::s("float32")),
        ("use_cache", J::Bool(true)),
        ("vocab_size", J::Int(vocab)),
    ])
}

fn write_json(dir: &Path, name: &str, v: &J, style: Style, newline: bool) -> Result<()> {
    let mut s = json::to_string(v, style).map_err(|e| ConvertError::Gguf(format!("{name}: {e}")))?;
    if newline {
        s.push('\n');
    }
    let path = dir.join(name);
    std::fs::write(&path, s).map_err(|e| ConvertError::io(format!("cannot write {}", path.display()), e))
}

/// The safetensors header the script writes: its tensor order, all F32,
/// `{"format": "pt"}` metadata, laid out as its `json.dumps` prints it
/// (larder-tensor's `KeyOrder::AsGiven`: compact, padded with spaces to 8 bytes).
fn safetensors_header(tensors: &[Planned]) -> Result<Header> {
    let list: Vec<TensorHeader> = tensors
        .iter()
        .map(|t| TensorHeader {
            name: t.name.clone(),
            dtype: "F32".to_string(),
            shape: t.shape.clone(),
            len: t.info.elements() * 4,
        })
        .collect();
    Header::new(&list, &[("format", "pt")], KeyOrder::AsGiven).map_err(|source| ConvertError::Header { source })
}

/// Writes `path` through the shared safetensors writer (under `.partial`,
/// renamed when complete); returns its size.
fn write_safetensors(path: &Path, g: &Gguf, tensors: &[Planned], progress: &mut dyn FnMut(u64, u64)) -> Result<u64> {
    let header = safetensors_header(tensors)?;
    let total = header.file_len() - header.data_start();
    let mut w = SafetensorsWriter::create(path, &header)?;
    let mut done = 0u64;
    for t in tensors {
        let mut values = g.dequantize(t.info);
        if let Some(heads) = t.rope_heads {
            values = unpermute_rope(&values, t.shape[0], t.shape[1], heads).map_err(|e| ConvertError::Gguf(format!("{}: {e}", t.name)))?;
        }
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        w.write(&bytes)?;
        done += bytes.len() as u64;
        progress(done, total);
    }
    w.finish()?.commit()?;
    Ok(header.file_len())
}

/// Converts `g` into the checkpoint folder `out` (via `out.tmp`, renamed last);
/// `progress(done, total)` follows the tensor bytes written.
pub fn convert(g: &Gguf, out: &Path, progress: &mut dyn FnMut(u64, u64)) -> Result<Summary> {
    let h = hparams(g)?;
    let vocab = tokenizer::read_vocab(g)?;
    let vocab_size = int(g, "llama.vocab_size")?.unwrap_or(vocab.tokens.len() as i64);
    let ids = SpecialIds {
        bos: int(g, "tokenizer.ggml.bos_token_id")?,
        eos: int(g, "tokenizer.ggml.eos_token_id")?,
        pad: int(g, "tokenizer.ggml.padding_token_id")?,
        unk: int(g, "tokenizer.ggml.unknown_token_id")?,
    };
    let (tensors, tied) = plan(g, &h, vocab_size)?;
    let mut generation = vec![("_from_model_config", J::Bool(true)), ("bos_token_id", J::opt_int(ids.bos))];
    generation.push(("eos_token_id", J::opt_int(ids.eos)));
    if let Some(p) = ids.pad {
        generation.push(("pad_token_id", J::Int(p)));
    }
    match g.get("tokenizer.ggml.add_bos_token") {
        Some(Value::Bool(true)) => refuse!("tokenizer.ggml.add_bos_token is true; this converter writes no BOS post-processor"),
        Some(v) if v.as_int().is_some_and(|i| i != 0) => refuse!("tokenizer.ggml.add_bos_token is set; no BOS post-processor"),
        _ => {}
    }
    let template = match g.get("tokenizer.chat_template") {
        None => None,
        Some(v) => Some(
            v.as_str()
                .ok_or_else(|| ConvertError::Gguf("tokenizer.chat_template is not a string".into()))?,
        ),
    };
    let (tok_config, special_map) = tokenizer::tokenizer_configs(&vocab, ids, h.ctx, template)?;

    let tmp = PathBuf::from(format!("{}.tmp", out.display()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| ConvertError::io(format!("cannot remove {}", tmp.display()), e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| ConvertError::io(format!("cannot create {}", tmp.display()), e))?;
    write_json(&tmp, "config.json", &config_json(&h, ids, vocab_size, tied), Style::PRETTY, true)?;
    write_json(&tmp, "generation_config.json", &J::obj(generation), Style::PRETTY, true)?;
    write_json(&tmp, "tokenizer_config.json", &tok_config, Style::PRETTY, true)?;
    write_json(&tmp, "special_tokens_map.json", &special_map, Style::PRETTY, true)?;
    write_json(&tmp, "tokenizer.json", &tokenizer::tokenizer_json(&vocab), Style::LINE, false)?;
    let bytes = write_safetensors(&tmp.join("model.safetensors"), g, &tensors, progress)?;
    if out.exists() {
        std::fs::remove_dir_all(out).map_err(|e| ConvertError::io(format!("cannot remove the old {}", out.display()), e))?;
    }
    std::fs::rename(&tmp, out).map_err(|e| ConvertError::io(format!("cannot rename {} to {}", tmp.display(), out.display()), e))?;
    Ok(Summary {
        tensors: tensors.len(),
        tied,
        vocab_size,
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // llama.cpp: w.reshape(n_head, 2, dim, cols).swapaxes(1, 2): row (h, j, i) -> (h, i, j).
        let (n_head, dim, cols) = (2, 3, 2);
        let rows = n_head * 2 * dim;
        let hf: Vec<f32> = (0..rows * cols).map(|x| x as f32).collect();
        let mut ggml = vec![0f32; hf.len()];
        for h in 0..n_head {
            for j in 0..2 {
                for i in 0..dim {
                    let src = (h * 2 * dim + j * dim + i) * cols;
                    let dst = (h * dim * 2 + i * 2 + j) * cols;
                    ggml[dst..dst + cols].copy_from_slice(&hf[src..src + cols]);
                }
            }
        }
        assert_eq!(unpermute_rope(&ggml, rows, cols, n_head).unwrap(), hf);
        assert!(unpermute_rope(&ggml, rows, cols, 5).is_err());
    }

    #[test]
    fn names_and_order_follow_the_script() {
        assert_eq!(hf_name("blk.12.attn_q.weight").unwrap(), "model.layers.12.self_attn.q_proj.weight");
        assert!(hf_name("blk.x.attn_q.weight").is_err());
        assert!(hf_name("rope_freqs.weight").is_err());
        let mut names = vec!["lm_head.weight", "model.norm.weight", "model.layers.10.a", "model.layers.2.b"];
        names.push("model.embed_tokens.weight");
        names.sort_by_key(|n| sort_key(n));
        assert_eq!(
            names,
            [
                "model.embed_tokens.weight",
                "model.layers.2.b",
                "model.layers.10.a",
                "model.norm.weight",
                "lm_head.weight"
            ]
        );
    }
}

#[cfg(test)]
#[path = "convert_bytes_tests.rs"]
mod bytes_tests;
