//! Bad stores get clear errors and never wrong answers: a flipped byte is a
//! digest error naming layer, expert and file; truncated files, missing
//! drives and manifests of another model or format version are refused.

use std::path::PathBuf;

use larder_engine::{Engine, LoadOptions};
use larder_store::Manifest;

mod common;
use common::{drive_dirs, fixture, pack_store, pread_streaming, scratch_dir};

/// The fixture `model` packed into a fresh store, its layer files over
/// `drives` drive folders.
fn packed(name: &str, model: &str, drives: usize) -> PathBuf {
    let out = scratch_dir(&format!("store-errors-{name}"));
    let store = out.join("store");
    pack_store(&fixture(model), &store, &drive_dirs(&out, drives, |_| 1.0));
    store
}

fn opts(verify: bool) -> LoadOptions {
    pread_streaming(2, 0, verify)
}

const IDS: &[u32] = &[5, 17, 42, 99, 3, 250, 7, 1];

fn error_of(r: Result<impl Sized, larder_engine::EngineError>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn flipped_byte_is_a_digest_error_naming_layer_expert_and_file() {
    let store = packed("flip", "qwen3_moe_tiny", 1);
    let m = Manifest::read(&store).unwrap();
    let (layer, e) = (&m.layers[0], &m.layers[0].experts[3]);
    let path = m.drive_dir(&store, e.drive).join(&e.file);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[e.offset as usize + 10] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();

    // Every expert is read (no cache, all ids): the bad one is hit.
    let engine = Engine::load_with(&store, &opts(true)).unwrap();
    let msg = error_of(engine.forward(IDS));
    assert!(msg.contains("digest mismatch"), "{msg}");
    assert!(msg.contains(&format!("layer {} expert 3", layer.layer)), "{msg}");
    assert!(msg.contains(&e.file), "{msg}");

    // `larder verify` finds it too.
    let report = larder_store::verify_store(&store, &mut |_| {}).unwrap();
    assert_eq!(report.bad.len(), 1, "{:?}", report.bad);
    assert!(report.bad[0].contains("expert 3"), "{:?}", report.bad);

    // --verify off runs (documented as unsafe: the corruption goes unnoticed).
    let engine = Engine::load_with(&store, &opts(false)).unwrap();
    engine.forward(IDS).unwrap();
}

#[test]
fn truncated_layer_file_is_refused_at_open() {
    let store = packed("trunc", "qwen3_moe_tiny", 2);
    let m = Manifest::read(&store).unwrap();
    let e = &m.layers[1].experts[0];
    let path = m.drive_dir(&store, e.drive).join(&e.file);
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - 4096)
        .unwrap();
    let msg = error_of(Engine::load_with(&store, &opts(true)));
    assert!(msg.contains("truncated") && msg.contains(&e.file), "{msg}");
}

#[test]
fn missing_drive_directory_is_named() {
    let store = packed("drive", "qwen3_moe_tiny", 2);
    let m = Manifest::read(&store).unwrap();
    let gone = m.drive_dir(&store, 1);
    std::fs::rename(&gone, gone.with_extension("away")).unwrap();
    let msg = error_of(Engine::load_with(&store, &opts(true)));
    assert!(msg.contains("drive directory") && msg.contains("missing"), "{msg}");
}

#[test]
fn manifest_of_another_model_or_version_is_refused() {
    let a = packed("other-a", "qwen3_moe_tiny", 1);
    let b = packed("other-b", "mixtral_tiny", 1);
    // b's manifest in a's folder: a's config.json is not the one it describes.
    std::fs::copy(b.join("manifest.json"), a.join("manifest.json")).unwrap();
    let msg = error_of(Engine::load_with(&a, &opts(true)));
    assert!(msg.contains("another model"), "{msg}");

    // A future format version.
    let text = std::fs::read_to_string(b.join("manifest.json")).unwrap();
    std::fs::write(b.join("manifest.json"), text.replace("\"version\": 2", "\"version\": 99")).unwrap();
    let msg = error_of(Engine::load_with(&b, &opts(true)));
    assert!(msg.contains("version 99"), "{msg}");
}

#[test]
fn an_unfinished_pack_is_not_a_store() {
    let store = packed("unfinished", "qwen3_moe_tiny", 1);
    // Simulate a crash before the manifest: the plan is still there.
    std::fs::remove_file(store.join("manifest.json")).unwrap();
    std::fs::write(store.join(larder_store::pack::PLAN), "{}").unwrap();
    let msg = error_of(Engine::load(&store));
    assert!(msg.contains("unfinished"), "{msg}");
}

#[test]
fn pack_resumes_finished_layers() {
    let store = packed("resume", "qwen3_moe_tiny", 1);
    // Remove the manifest and one layer file as if the pack had stopped there (the plan stays).
    let m = Manifest::read(&store).unwrap();
    let e = &m.layers[2].experts[0];
    std::fs::remove_file(m.drive_dir(&store, 0).join(&e.file)).unwrap();
    std::fs::remove_file(store.join("manifest.json")).unwrap();
    let same = drive_dirs(store.parent().unwrap(), 1, |_| 1.0);
    let report = pack_store(&fixture("qwen3_moe_tiny"), &store, &same);
    assert_eq!(report.resumed_layers, m.layers.len() - 1);
    assert_eq!(report.rewritten_records, 0);
    assert_eq!(Manifest::read(&store).unwrap(), m, "the resumed store equals the original");
    let report = larder_store::verify_store(&store, &mut |_| {}).unwrap();
    assert!(report.bad.is_empty());
}

#[test]
fn an_int4_expert_whose_weight_shape_disagrees_with_the_config_fails_verify() {
    // A checkpoint whose expert 1 of layer 1 says another gate shape: its
    // store is exactly its source (digests match), but that expert cannot run.
    let out = scratch_dir("store-errors-weight-shape");
    let model = out.join("model");
    std::fs::create_dir_all(&model).unwrap();
    for f in std::fs::read_dir(fixture("deepseek_v3_int4")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, model.join(f.file_name().unwrap())).unwrap();
    }
    let path = model.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let at = header["model.layers.1.mlp.experts.1.gate_proj.weight_shape"]["data_offsets"][0]
        .as_u64()
        .unwrap() as usize;
    bytes[8 + n + at] ^= 0x01;
    std::fs::write(&path, bytes).unwrap();
    let store = out.join("store");
    pack_store(&model, &store, &[]);
    let report = larder_engine::integrity::verify(&store, &mut |_| {}).unwrap();
    assert_eq!(report.bad.len(), 1, "{:?}", report.bad);
    assert!(
        report.bad[0].contains("layer 1 expert 1") && report.bad[0].contains("weight_shape"),
        "{:?}",
        report.bad
    );
    let _ = std::fs::remove_dir_all(&out);
}
