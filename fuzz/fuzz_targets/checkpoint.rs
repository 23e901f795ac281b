//! Fuzzes opening a checkpoint folder: `model.safetensors` headers, the
//! `model.safetensors.index.json` shard list, and older multi-file exports.
//! Then asks for every tensor as the model would (bytes, info, 1-D vectors,
//! 2-D matrices at their declared shapes): a lying header must be an error,
//! never a panic, an out-of-bounds slice or a huge allocation.
//!
//! Input: one mode byte, then files separated by `larder_fuzz::FILE_SEPARATOR`.
//! Mode 0: `model.safetensors`; 1: the index JSON then two shards
//! `model-00001-of-00002.safetensors`, `model-00002-of-00002.safetensors`;
//! 2: files `a.safetensors`, `b.safetensors`, ... with no index.
#![no_main]

use larder_model::checkpoint::Checkpoint;
use libfuzzer_sys::fuzz_target;

const SHARDS: [&str; 2] = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let dir = larder_fuzz::scratch_dir("checkpoint");
    let files = larder_fuzz::split_files(rest);
    match mode % 3 {
        0 => larder_fuzz::write(dir, "model.safetensors", files[0]),
        1 => {
            larder_fuzz::write(dir, "model.safetensors.index.json", files[0]);
            for (name, bytes) in SHARDS.iter().zip(&files[1..]) {
                larder_fuzz::write(dir, name, bytes);
            }
        }
        _ => {
            for (i, bytes) in files.iter().take(4).enumerate() {
                larder_fuzz::write(dir, &format!("{}.safetensors", (b'a' + i as u8) as char), bytes);
            }
        }
    }
    let Ok(ckpt) = Checkpoint::open(dir) else { return };
    ckpt.set_fp8_block(Some((128, 128)));
    for (i, _) in ckpt.file_paths().iter().enumerate() {
        let _ = ckpt.file_header(i);
    }
    for name in ckpt.names() {
        let Ok(info) = ckpt.tensor_info(name) else { continue };
        if let Ok(bytes) = ckpt.tensor_bytes(name) {
            assert_eq!(bytes.len() as u64, info.len, "tensor_bytes and tensor_info disagree on `{name}`");
        }
        let _ = ckpt.slice_info(name, 0);
        match info.shape[..] {
            [len] => {
                if let Ok(v) = ckpt.vector(name, len) {
                    assert_eq!(v.len(), len);
                }
            }
            [rows, cols] => {
                let _ = ckpt.weight_parts(name, rows, cols);
                let _ = ckpt.matrix(name, rows, cols);
            }
            _ => {}
        }
    }
});
