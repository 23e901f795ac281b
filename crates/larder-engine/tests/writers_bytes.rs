//! The files larder writes in safetensors form (synth checkpoints, an
//! upcycled checkpoint, a packed store's spine), written to the folder
//! `$LARDER_WRITERS_OUT` so their sha256 can be compared across a change to
//! the writer (`cargo test -p larder-engine --test writers_bytes -- --ignored`,
//! then `sha256sum` over the folder). Ignored by default: it only writes.

use std::path::{Path, PathBuf};

use larder_model::synth::{SynthSpec, ARCHITECTURES};
use larder_model::{upcycle, UpcycleLayout, UpcycleSpec};
use larder_store::pack::pack;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

#[test]
#[ignore = "writes files for a byte comparison; needs LARDER_WRITERS_OUT"]
fn write_every_safetensors_kind() {
    let out = PathBuf::from(std::env::var("LARDER_WRITERS_OUT").expect("LARDER_WRITERS_OUT"));
    let _ = std::fs::remove_dir_all(&out);
    for arch in ARCHITECTURES {
        let spec = SynthSpec::preset(arch, "tiny", None).unwrap();
        let model = out.join(format!("synth-{arch}"));
        larder_model::synth::write(&spec, &model, &mut |_| {}).unwrap();
        let src = larder_engine::pack::pack_source(&model).unwrap();
        pack(&src, &out.join(format!("store-{arch}")), &[], &mut |_| {}).unwrap();
    }
    let spec = UpcycleSpec {
        source: fixture("llama_tiny"),
        out: out.join("upcycled"),
        experts: 4,
        top_k: 2,
        layout: UpcycleLayout::Mixtral,
        seed: 3,
    };
    upcycle(&spec, &mut |_, _| {}).unwrap();
}
