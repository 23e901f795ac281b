//! Checkpoint I/O: weights are read into memory the process owns (a weight
//! file changed after loading cannot crash it), and `open_unread` validates
//! a whole checkpoint without reading weight bytes.

use std::path::{Path, PathBuf};

use larder_model::arch::read_spec;
use larder_model::checkpoint::Checkpoint;
use larder_model::{DecoderModel, ModelError};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

fn copy_fixture(name: &str, tag: &str) -> PathBuf {
    let dst = std::env::temp_dir().join(format!("larder-ckpt-io-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap().flatten() {
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    dst
}

fn drop_tensor(dir: &Path, dropped: &str) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<_> = st.tensors().into_iter().filter(|(n, _)| n != dropped).collect();
    std::fs::write(&path, safetensors::serialize(kept, None).unwrap()).unwrap();
}

#[test]
fn open_unread_validates_a_whole_checkpoint_without_reading_weights() {
    for name in ["qwen3_moe_tiny", "deepseek_v3_fp8", "llama_tiny"] {
        let dir = fixture(name);
        let spec = read_spec(&dir).unwrap();
        let ckpt = Checkpoint::open_unread(&dir).unwrap();
        assert!(!ckpt.reads_weights());
        let model = DecoderModel::load(spec, &ckpt, None).unwrap_or_else(|e| panic!("{name}: {e}"));
        // Every weight is zeros: the logits are all equal (zero), not the model's.
        let logits = model.forward(&[1, 2], &mut model.new_state(), None).unwrap();
        assert!(logits.row(1).iter().all(|&x| x == 0.0), "{name}: weights were read");
        assert!(ckpt.tensor_bytes("model.norm.weight").is_err());
    }
}

#[test]
fn open_unread_fails_like_open_on_a_missing_tensor() {
    let dir = copy_fixture("qwen3_moe_tiny", "nonorm");
    drop_tensor(&dir, "model.norm.weight");
    let spec = read_spec(&dir).unwrap();
    let unread = DecoderModel::load(spec.clone(), &Checkpoint::open_unread(&dir).unwrap(), None).err();
    let read = DecoderModel::load(spec, &Checkpoint::open(&dir).unwrap(), None).err();
    for err in [&unread, &read] {
        assert!(
            matches!(err, Some(ModelError::MissingTensor { name }) if name == "model.norm.weight"),
            "{err:?}"
        );
    }
    assert_eq!(unread.map(|e| e.to_string()), read.map(|e| e.to_string()));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn weights_survive_their_file_being_truncated_and_overwritten() {
    let dir = copy_fixture("qwen3_moe_tiny", "trunc");
    let spec = read_spec(&dir).unwrap();
    let ckpt = Checkpoint::open(&dir).unwrap();
    assert!(ckpt.reads_weights());
    let model = DecoderModel::load(spec, &ckpt, None).unwrap();
    let before = model.forward(&[1, 2, 3], &mut model.new_state(), None).unwrap();
    // Truncate in place (a mapping would now SIGBUS on its next page fault),
    // then overwrite with other bytes.
    let path = dir.join("model.safetensors");
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(16).unwrap();
    let after = model.forward(&[1, 2, 3], &mut model.new_state(), None).unwrap();
    assert_eq!(before.row(2), after.row(2));
    std::fs::write(&path, vec![0x7fu8; len as usize]).unwrap();
    let after = model.forward(&[1, 2, 3], &mut model.new_state(), None).unwrap();
    assert_eq!(before.row(2), after.row(2));
    // Reading a tensor now is an error naming the file, not a crash.
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(16).unwrap();
    let err = ckpt.tensor_bytes("model.norm.weight").unwrap_err().to_string();
    assert!(err.contains("model.safetensors") && err.contains("model.norm.weight"), "{err}");
    assert!(err.contains("changed or truncated"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_tensor_check_sees_every_tensor_once_with_its_stored_bytes() {
    use std::sync::{Arc, Mutex};
    let dir = fixture("deepseek_v3_fp8");
    let spec = read_spec(&dir).unwrap();
    let mut ckpt = Checkpoint::open(&dir).unwrap();
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let s = seen.clone();
    let file = std::fs::read(dir.join("model.safetensors")).unwrap();
    ckpt.set_tensor_check(Arc::new(move |name, info, bytes| {
        let want = &file[info.offset as usize..(info.offset + info.len) as usize];
        if bytes != want {
            return Err(format!("{name}: bytes differ from the file"));
        }
        s.lock().unwrap().push(name.to_string());
        Ok(())
    }));
    DecoderModel::load(spec, &ckpt, None).unwrap();
    let mut seen = seen.lock().unwrap().clone();
    let n = seen.len();
    assert!(seen.iter().any(|n| n.ends_with("_scale_inv")), "fp8 scales are checked");
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), n, "a tensor was checked twice in one load");
}

#[test]
fn slices_of_a_fused_tensor_are_ranges_of_it() {
    // The router [E, hidden] of deepseek_v3_tiny's layer 1 stands in for a
    // fused per-layer expert tensor: slice e is row e.
    let ckpt = Checkpoint::open(&fixture("deepseek_v3_tiny")).unwrap();
    let name = "model.layers.1.mlp.gate.weight";
    let whole = ckpt.tensor_info(name).unwrap();
    let (count, row) = (whole.shape[0], whole.len / whole.shape[0] as u64);
    let all = ckpt.tensor_bytes(name).unwrap();
    for e in [0, count - 1] {
        let s = ckpt.slice_info(name, e).unwrap();
        assert_eq!((s.offset, s.len, s.file), (whole.offset + e as u64 * row, row, whole.file));
        assert_eq!(s.shape, whole.shape[1..].to_vec());
        let bytes = ckpt.slice_bytes(name, e).unwrap();
        assert_eq!(bytes.as_slice(), &all[e * row as usize..(e + 1) * row as usize]);
    }
    let err = ckpt.slice_info(name, count).unwrap_err().to_string();
    assert!(err.contains(name) && err.contains(&format!("no slice {count}")), "{err}");
}
