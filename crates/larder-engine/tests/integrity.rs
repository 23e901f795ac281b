//! Fail closed: a store that verifies is exactly the checkpoint it claims,
//! and nothing a user does to its files makes it compute silently wrong.
//! Each test is one way it went wrong before: two stores on one drive
//! folder, a resume over changed source bytes or a damaged layer file, edits
//! of the spine, config or manifest, two packs at once, and a checkpoint
//! that cannot load.

use std::path::{Path, PathBuf};

use larder_engine::{Engine, LoadOptions};
use larder_model::checkpoint::Checkpoint;
use larder_store::pack::{pack, pack_with, DriveSpec, PackOptions};
use larder_store::Manifest;

mod common;
use common::{fixture, pack_store, pread_streaming, scratch_dir};

const IDS: &[u32] = &[5, 17, 42, 99, 3, 250, 7, 1];

fn scratch(name: &str) -> PathBuf {
    scratch_dir(&format!("integrity-{name}"))
}

/// A copy of a fixture checkpoint that a test may change.
fn copy_fixture(name: &str, to: &Path) -> PathBuf {
    let dst = to.join(name);
    std::fs::create_dir_all(&dst).unwrap();
    for f in std::fs::read_dir(fixture(name)).unwrap() {
        let f = f.unwrap().path();
        if f.is_file() {
            std::fs::copy(&f, dst.join(f.file_name().unwrap())).unwrap();
        }
    }
    dst
}

fn streamed() -> LoadOptions {
    pread_streaming(2, 0, true)
}

fn logits(dir: &Path, opts: &LoadOptions) -> Vec<f32> {
    Engine::load_with(dir, opts).unwrap().forward(IDS).unwrap().into_vec()
}

fn error_of<T>(r: Result<T, impl std::fmt::Display>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

fn bad_of(store: &Path) -> Vec<String> {
    larder_engine::integrity::verify(store, &mut |_| {}).unwrap().bad
}

/// Flips one byte of `path` at `offset`.
fn flip(path: &Path, offset: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[offset as usize] ^= 0x5a;
    std::fs::write(path, bytes).unwrap();
}

fn record_path(store: &Path, m: &Manifest, layer: usize, expert: usize) -> (PathBuf, u64) {
    let e = &m.layers[layer].experts[expert];
    (m.drive_dir(store, e.drive).join(&e.file), e.offset)
}

#[test]
fn two_stores_on_one_drive_folder_stay_exact() {
    let dir = scratch("two-stores");
    let drive = [DriveSpec {
        dir: dir.join("ssd"),
        gbps: Some(1.0),
    }];
    std::fs::create_dir_all(&drive[0].dir).unwrap();
    let a = pack_store(&fixture("qwen3_moe_tiny"), &dir.join("a"), &drive);
    let b = pack_store(&fixture("mixtral_tiny"), &dir.join("b"), &drive);
    assert_ne!(a.store_id, b.store_id);
    for (model, store) in [("qwen3_moe_tiny", "a"), ("mixtral_tiny", "b")] {
        let want = logits(&fixture(model), &LoadOptions::default());
        assert_eq!(
            logits(&dir.join(store), &streamed()),
            want,
            "{model} from its store on a shared drive folder"
        );
        assert!(bad_of(&dir.join(store)).is_empty());
    }
    // A layer file of the other store under this store's name is refused by its header.
    let (ma, mb) = (Manifest::read(&dir.join("a")).unwrap(), Manifest::read(&dir.join("b")).unwrap());
    let (pa, _) = record_path(&dir.join("a"), &ma, 0, 0);
    let (pb, _) = record_path(&dir.join("b"), &mb, 0, 0);
    std::fs::copy(&pb, &pa).unwrap();
    let msg = error_of(Engine::load_with(&dir.join("a"), &streamed()));
    assert!(msg.contains(&format!("belongs to store {}", b.store_id)), "{msg}");
    assert!(!bad_of(&dir.join("a")).is_empty());
}

#[test]
fn resume_redoes_records_whose_source_changed_or_whose_file_is_damaged() {
    let dir = scratch("resume");
    let model = copy_fixture("qwen3_moe_tiny", &dir);
    let store = dir.join("store");
    pack_store(&model, &store, &[]);
    let m = Manifest::read(&store).unwrap();
    // As if the pack stopped before its manifest; meanwhile a revision of the
    // checkpoint with the same shapes changed one expert's bytes, and a
    // finished layer file was damaged.
    std::fs::remove_file(store.join("manifest.json")).unwrap();
    let ckpt = Checkpoint::open(&model).unwrap();
    let name = larder_model::expert_tensors(&larder_model::arch::read_spec(&model).unwrap(), m.layers[1].layer, 2).unwrap()[1]
        .name
        .clone();
    let info = ckpt.tensor_info(&name).unwrap();
    drop(ckpt);
    flip(&ckpt_file(&model, info.file), info.offset + 7);
    let (path, offset) = record_path(&store, &m, 2, 5);
    flip(&path, offset + 100);

    let report = pack_store(&model, &store, &[]);
    assert_eq!(report.rewritten_records, 2, "the changed source record and the damaged one");
    assert_eq!(report.resumed_layers, m.layers.len());
    assert!(bad_of(&store).is_empty());
    assert_eq!(
        logits(&store, &streamed()),
        logits(&model, &LoadOptions::default()),
        "the store is the new checkpoint"
    );
}

fn ckpt_file(model: &Path, file: usize) -> PathBuf {
    Checkpoint::open(model).unwrap().file_paths()[file].clone()
}

#[test]
fn spine_and_config_edits_are_caught_by_verify_and_at_load() {
    let dir = scratch("spine");
    let store = dir.join("store");
    pack_store(&fixture("qwen3_moe_tiny"), &store, &[]);
    let m = Manifest::read(&store).unwrap();
    let spine = store.join(&m.spine[0].file);
    let norm = m.spine[0].tensors.iter().find(|t| t.name == "model.norm.weight").unwrap().clone();
    let original = std::fs::read(&spine).unwrap();

    flip(&spine, norm.offset + 1);
    let msg = error_of(Engine::load_with(&store, &streamed()));
    assert!(msg.contains("model.norm.weight") && msg.contains("digest mismatch"), "{msg}");
    let bad = bad_of(&store);
    assert!(bad.iter().any(|b| b.contains("model.norm.weight")), "{bad:?}");

    std::fs::remove_file(&spine).unwrap();
    assert!(Engine::load_with(&store, &streamed()).is_err());
    assert!(!bad_of(&store).is_empty());
    std::fs::write(&spine, &original).unwrap();
    assert!(bad_of(&store).is_empty());

    let cfg = store.join("config.json");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, text.replacen('{', "{\"rms_norm_eps\": 0.5, ", 1)).unwrap();
    let msg = error_of(Engine::load_with(&store, &streamed()));
    assert!(msg.contains("config.json"), "{msg}");
    assert!(bad_of(&store).iter().any(|b| b.contains("config.json")));
    std::fs::write(&cfg, text).unwrap();

    // A template beside the store that the manifest does not list would change the prompt.
    std::fs::write(store.join("chat_template.jinja"), "{{ messages }}").unwrap();
    let msg = error_of(Engine::load_with(&store, &streamed()));
    assert!(
        msg.contains("chat_template.jinja") && msg.contains("not part of this store"),
        "{msg}"
    );
}

#[test]
fn manifest_edits_are_refused_even_when_resealed() {
    let dir = scratch("manifest");
    let store = dir.join("store");
    pack_store(&fixture("qwen3_moe_tiny"), &store, &[]);
    let m = Manifest::read(&store).unwrap();
    let path = store.join("manifest.json");
    let text = std::fs::read_to_string(&path).unwrap();

    // A part's dtype edited by hand: the manifest's own digest no longer matches.
    std::fs::write(&path, text.replacen("\"BF16\"", "\"F16\"", 1).replacen("\"F32\"", "\"F16\"", 1)).unwrap();
    let msg = error_of(Engine::load_with(&store, &streamed()));
    assert!(msg.contains("changed after packing"), "{msg}");
    assert!(error_of(larder_engine::integrity::verify(&store, &mut |_| {})).contains("changed after packing"));

    // Two experts' offsets and digests swapped, manifest resealed: the record
    // digests are bound to their expert id, so both fail.
    let mut swapped = m.clone();
    let l = &mut swapped.layers[0];
    let (o0, d0) = (l.experts[0].offset, l.experts[0].digest.clone());
    l.experts[0].offset = l.experts[1].offset;
    l.experts[0].digest = l.experts[1].digest.clone();
    l.experts[1].offset = o0;
    l.experts[1].digest = d0;
    swapped.write(&store).unwrap();
    let msg = error_of(Engine::load_with(&store, &streamed()).unwrap().forward(IDS));
    assert!(msg.contains("digest mismatch"), "{msg}");
    let bad = bad_of(&store);
    assert!(
        bad.iter().any(|b| b.contains("expert 0")) && bad.iter().any(|b| b.contains("expert 1")),
        "{bad:?}"
    );

    // A dtype changed and resealed: the digests are bound to it too.
    let mut retyped = m.clone();
    retyped.layers[0].parts[0].desc.dtype = "F16".into();
    retyped.write(&store).unwrap();
    assert!(!bad_of(&store).is_empty());
    m.write(&store).unwrap();
    assert!(bad_of(&store).is_empty());
}

#[test]
fn repair_rewrites_exactly_the_bad_records_verify_lists() {
    let dir = scratch("repair");
    let store = dir.join("store");
    let model = fixture("qwen3_moe_tiny");
    pack_store(&model, &store, &[]);
    let m = Manifest::read(&store).unwrap();
    for (layer, expert) in [(0, 1), (2, 6)] {
        let (path, offset) = record_path(&store, &m, layer, expert);
        flip(&path, offset + 33);
    }
    let bad = bad_of(&store);
    assert_eq!(bad.len(), 2, "{bad:?}");
    let src = larder_engine::pack::pack_source(&model).unwrap();
    let msg = error_of(pack(&src, &store, &[], &mut |_| {}));
    assert!(msg.contains("--repair"), "{msg}");
    let report = pack_with(&src, &store, &[], PackOptions { repair: true }, &mut |_| {}).unwrap();
    assert_eq!(report.rewritten_records, 2);
    assert!(bad_of(&store).is_empty());
    assert_eq!(Manifest::read(&store).unwrap().layers, m.layers);

    // A damaged manifest is rebuilt by --repair from the kept plan.
    std::fs::write(store.join("manifest.json"), "{\"format\": \"larder-store\", \"version\": 2}").unwrap();
    pack_with(&src, &store, &[], PackOptions { repair: true }, &mut |_| {}).unwrap();
    assert!(bad_of(&store).is_empty());
}

#[test]
fn a_second_pack_into_the_same_out_is_refused_while_one_runs() {
    let dir = scratch("lock");
    let store = dir.join("store");
    std::fs::create_dir_all(&store).unwrap();
    let _held = larder_store::fsutil::lock_exclusive(&store.join(larder_store::pack::LOCK), "a test").unwrap();
    let src = larder_engine::pack::pack_source(&fixture("qwen3_moe_tiny")).unwrap();
    let msg = error_of(pack(&src, &store, &[], &mut |_| {}));
    assert!(msg.contains("pack.lock") && msg.contains("another `larder pack`"), "{msg}");
}

#[test]
fn pack_refuses_a_checkpoint_that_cannot_load_before_writing() {
    let dir = scratch("validate");
    let model = copy_fixture("qwen3_moe_tiny", &dir);
    let file = ckpt_file(&model, 0);
    let bytes = std::fs::read(&file).unwrap();
    let at = bytes.windows(17).position(|w| w == b"model.norm.weight").unwrap();
    let mut renamed = bytes.clone();
    renamed[at..at + 17].copy_from_slice(b"model.norm.weighX");
    std::fs::write(&file, renamed).unwrap();
    let msg = error_of(larder_engine::pack::pack_source(&model));
    assert!(msg.contains("model.norm.weight"), "{msg}");
}
