//! Pins the bytes of the converted `model.safetensors` for a small in-memory
//! GGUF (two llama layers, every tensor type the reader dequantises, q/k
//! rope-permuted, an untied LM head): the header layout of the reference
//! script (compact JSON, script order, `__metadata__` last, space padding)
//! and the data, so a change to how the file is written cannot change a byte.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

use super::super::gguf::{Gguf, TensorInfo, TensorType, Value};
use super::super::wheel::hex;
use super::convert;

/// Deterministic pseudo-random numbers in [-1, 1).
struct Numbers(u64);

impl Numbers {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn byte(&mut self) -> u8 {
        ((self.next() + 1.0) * 128.0) as u8
    }

    fn f16(&mut self) -> [u8; 2] {
        half::f16::from_f32(self.next()).to_le_bytes()
    }

    /// The raw ggml bytes of `n` elements of type `ty`.
    fn raw(&mut self, ty: TensorType, n: usize) -> Vec<u8> {
        let mut out = Vec::new();
        match ty {
            TensorType::F32 => (0..n).for_each(|_| out.extend(self.next().to_le_bytes())),
            TensorType::F16 => (0..n).for_each(|_| out.extend(self.f16())),
            TensorType::Q8_0 => {
                for _ in 0..n / 32 {
                    out.extend(self.f16());
                    out.extend((0..32).map(|_| self.byte()));
                }
            }
            TensorType::Q4_1 => {
                for _ in 0..n / 32 {
                    out.extend(self.f16());
                    out.extend(self.f16());
                    out.extend((0..16).map(|_| self.byte()));
                }
            }
        }
        out
    }
}

/// GGUF tensors (name, ggml dims, type) of a llama with hidden 8, 2 heads,
/// 1 KV head, ffn 32, vocab 4, 2 layers, in llama.cpp's file order.
fn tensor_list() -> Vec<(String, Vec<u64>, TensorType)> {
    let mut list = vec![
        ("token_embd.weight".to_string(), vec![8, 4], TensorType::F16),
        ("output_norm.weight".to_string(), vec![8], TensorType::F32),
        ("output.weight".to_string(), vec![8, 4], TensorType::Q8_0),
    ];
    for l in 0..2 {
        for (name, ne, ty) in [
            ("attn_norm", vec![8], TensorType::F32),
            ("attn_q", vec![8, 8], TensorType::F32),
            ("attn_k", vec![8, 4], TensorType::F16),
            ("attn_v", vec![8, 4], TensorType::Q8_0),
            ("attn_output", vec![8, 8], TensorType::Q4_1),
            ("ffn_norm", vec![8], TensorType::F32),
            ("ffn_gate", vec![8, 32], TensorType::Q4_1),
            ("ffn_up", vec![8, 32], TensorType::Q8_0),
            ("ffn_down", vec![32, 8], TensorType::F16),
        ] {
            list.push((format!("blk.{l}.{name}.weight"), ne, ty));
        }
    }
    list
}

fn metadata() -> HashMap<String, Value> {
    let strs = |v: &[&str]| Value::Arr(v.iter().map(|s| Value::Str(s.to_string())).collect());
    let mut meta = HashMap::new();
    for (k, v) in [
        ("general.architecture", Value::Str("llama".into())),
        ("llama.attention.head_count", Value::U(2)),
        ("llama.attention.head_count_kv", Value::U(1)),
        ("llama.embedding_length", Value::U(8)),
        ("llama.block_count", Value::U(2)),
        ("llama.feed_forward_length", Value::U(32)),
        ("llama.context_length", Value::U(64)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.rope.freq_base", Value::F32(10000.0)),
        ("tokenizer.ggml.model", Value::Str("gpt2".into())),
        ("tokenizer.ggml.tokens", strs(&["a", "b", "ab", "<|end|>"])),
        ("tokenizer.ggml.merges", strs(&["a b"])),
        ("tokenizer.ggml.token_type", Value::Arr([1, 1, 1, 3].map(Value::I).to_vec())),
        ("tokenizer.ggml.bos_token_id", Value::U(3)),
        ("tokenizer.ggml.eos_token_id", Value::U(3)),
    ] {
        meta.insert(k.to_string(), v);
    }
    meta
}

fn small_gguf() -> Gguf {
    let mut numbers = Numbers(7);
    let (mut bytes, mut tensors) = (Vec::new(), Vec::new());
    for (name, ne, ty) in tensor_list() {
        let raw = numbers.raw(ty, ne.iter().product::<u64>() as usize);
        tensors.push(TensorInfo {
            name,
            ne,
            ty,
            start: bytes.len(),
            len: raw.len(),
        });
        bytes.extend(raw);
    }
    Gguf {
        bytes,
        meta: metadata(),
        tensors,
    }
}

/// The header the reference script writes for [`small_gguf`] (before its padding).
const HEADER: &str = concat!(
    r#"{"model.embed_tokens.weight":{"dtype":"F32","shape":[4,8],"data_offsets":[0,128]},"#,
    r#""model.layers.0.input_layernorm.weight":{"dtype":"F32","shape":[8],"data_offsets":[128,160]},"#,
    r#""model.layers.0.mlp.down_proj.weight":{"dtype":"F32","shape":[8,32],"data_offsets":[160,1184]},"#,
    r#""model.layers.0.mlp.gate_proj.weight":{"dtype":"F32","shape":[32,8],"data_offsets":[1184,2208]},"#,
    r#""model.layers.0.mlp.up_proj.weight":{"dtype":"F32","shape":[32,8],"data_offsets":[2208,3232]},"#,
    r#""model.layers.0.post_attention_layernorm.weight":{"dtype":"F32","shape":[8],"data_offsets":[3232,3264]},"#,
    r#""model.layers.0.self_attn.k_proj.weight":{"dtype":"F32","shape":[4,8],"data_offsets":[3264,3392]},"#,
    r#""model.layers.0.self_attn.o_proj.weight":{"dtype":"F32","shape":[8,8],"data_offsets":[3392,3648]},"#,
    r#""model.layers.0.self_attn.q_proj.weight":{"dtype":"F32","shape":[8,8],"data_offsets":[3648,3904]},"#,
    r#""model.layers.0.self_attn.v_proj.weight":{"dtype":"F32","shape":[4,8],"data_offsets":[3904,4032]},"#,
    r#""model.layers.1.input_layernorm.weight":{"dtype":"F32","shape":[8],"data_offsets":[4032,4064]},"#,
    r#""model.layers.1.mlp.down_proj.weight":{"dtype":"F32","shape":[8,32],"data_offsets":[4064,5088]},"#,
    r#""model.layers.1.mlp.gate_proj.weight":{"dtype":"F32","shape":[32,8],"data_offsets":[5088,6112]},"#,
    r#""model.layers.1.mlp.up_proj.weight":{"dtype":"F32","shape":[32,8],"data_offsets":[6112,7136]},"#,
    r#""model.layers.1.post_attention_layernorm.weight":{"dtype":"F32","shape":[8],"data_offsets":[7136,7168]},"#,
    r#""model.layers.1.self_attn.k_proj.weight":{"dtype":"F32","shape":[4,8],"data_offsets":[7168,7296]},"#,
    r#""model.layers.1.self_attn.o_proj.weight":{"dtype":"F32","shape":[8,8],"data_offsets":[7296,7552]},"#,
    r#""model.layers.1.self_attn.q_proj.weight":{"dtype":"F32","shape":[8,8],"data_offsets":[7552,7808]},"#,
    r#""model.layers.1.self_attn.v_proj.weight":{"dtype":"F32","shape":[4,8],"data_offsets":[7808,7936]},"#,
    r#""model.norm.weight":{"dtype":"F32","shape":[8],"data_offsets":[7936,7968]},"#,
    r#""lm_head.weight":{"dtype":"F32","shape":[4,8],"data_offsets":[7968,8096]},"#,
    r#""__metadata__":{"format":"pt"}}"#,
);

/// sha256 of the whole model.safetensors, as the converter wrote it when this test was added.
const FILE_SHA256: &str = "a4dffb18f458ea6f623b468aea58e173694091d1d21749cfa454d2b949d289cc";

#[test]
fn model_safetensors_bytes_are_pinned() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("checkpoint");
    let mut last = (0, 0);
    let summary = convert(&small_gguf(), &out, &mut |done, total| last = (done, total)).unwrap();
    let file = std::fs::read(out.join("model.safetensors")).unwrap();

    let header_len = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    assert_eq!(header_len % 8, 0);
    let header = &file[8..8 + header_len];
    assert_eq!(std::str::from_utf8(header).unwrap().trim_end_matches(' '), HEADER);
    assert!(header[HEADER.len()..].iter().all(|&b| b == b' '));
    assert_eq!(file.len(), 8 + header_len + 8096);
    assert_eq!((summary.tensors, summary.tied, summary.bytes), (21, false, file.len() as u64));
    assert_eq!(last, (8096, 8096));
    assert!(!dir.path().join("checkpoint.tmp").exists());
    let names: Vec<_> = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(!names.iter().any(|n| n.to_string_lossy().ends_with(".partial")), "{names:?}");
    let read = safetensors::SafeTensors::deserialize(&file).unwrap();
    assert_eq!(read.names().len(), 21);
    assert_eq!(hex(&Sha256::digest(&file)), FILE_SHA256);
}
