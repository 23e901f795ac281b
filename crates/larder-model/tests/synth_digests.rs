//! `larder synth`'s output is pinned byte for byte: the sha256 of every file
//! [`synth::write`] writes, for every architecture x tiny preset x experts
//! format, latent experts (`--routed-expert-hidden-size`) and the skewed, local
//! and mixed routing presets,
//! against tests/data/synth_digests.txt. Synth's tensor list now comes from
//! the loaders (weight recorder), in the order they read tensors, with values
//! seeded by tensor name: the digests changed once for that (they were
//! recorded first with the hand-written lists and position seeds); that the
//! recorded list is the hand-written one, tensor for tensor, is pinned by
//! `synth::plan_tests`. The skewed lines changed again when `--routing`
//! gained calibrated presets and knobs (skew profile, layer-to-layer drift,
//! the knobs in config.json); uniform's did not. The latent lines changed
//! when latent experts took Kimi K3's names (`routed_expert_*`, with the
//! latent norm on the 4-bit ones); `kimi_k3` lines were added with it. Regenerate (only for an intended change of synth's
//! output) with
//! `LARDER_SYNTH_DIGESTS_WRITE=1 cargo test -p larder-model --test synth_digests`.

use std::path::Path;

use larder_model::synth::{self, ExpertsFormat, Routing, SynthSpec, ARCHITECTURES};
use sha2::{Digest, Sha256};

const DIGESTS: &str = "tests/data/synth_digests.txt";

/// Every combination pinned: a label and its spec.
fn combinations() -> Vec<(String, SynthSpec)> {
    let mut out = Vec::new();
    for arch in ARCHITECTURES {
        for &format in ExpertsFormat::for_arch(arch) {
            let mut spec = SynthSpec::preset(arch, "tiny", None).expect("tiny preset");
            spec.set_experts_format(format).expect("format");
            out.push((format!("{arch} tiny {format:?}"), spec));
        }
    }
    for (latent, format) in [(24, ExpertsFormat::Bf16), (32, ExpertsFormat::Int4), (32, ExpertsFormat::Mxfp4)] {
        let mut spec = SynthSpec::preset("kimi_linear", "tiny", None).expect("tiny preset");
        spec.routed_expert_hidden_size = Some(latent);
        spec.latent_moe_use_norm = format != ExpertsFormat::Bf16;
        spec.set_experts_format(format).expect("format");
        out.push((format!("kimi_linear tiny {format:?} latent {latent}"), spec));
    }
    for arch in ARCHITECTURES {
        let mut spec = SynthSpec::preset(arch, "tiny", None).expect("tiny preset");
        spec.routing = Routing::Skewed;
        spec.seed = 7;
        out.push((format!("{arch} tiny skewed seed 7"), spec));
    }
    for (routing, name) in [(Routing::Local, "local"), (Routing::Mixed, "mixed")] {
        for arch in ARCHITECTURES {
            let mut spec = SynthSpec::preset(arch, "tiny", None).expect("tiny preset");
            spec.routing = routing;
            spec.seed = 7;
            out.push((format!("{arch} tiny {name} seed 7"), spec));
        }
    }
    out
}

/// `label file sha256` lines for every file of every combination.
fn digests() -> String {
    let root = std::env::temp_dir().join(format!("larder-synth-digests-{}", std::process::id()));
    let mut lines = String::new();
    for (i, (label, spec)) in combinations().into_iter().enumerate() {
        let out = root.join(i.to_string());
        synth::write(&spec, &out, &mut |_| {}).unwrap_or_else(|e| panic!("{label}: {e}"));
        let mut files: Vec<_> = std::fs::read_dir(&out)
            .expect("read out dir")
            .map(|e| e.expect("dir entry").path())
            .collect();
        files.sort();
        for f in files {
            let bytes = std::fs::read(&f).expect("read synth file");
            let name = f.file_name().and_then(|n| n.to_str()).expect("file name");
            lines += &format!("{label} | {name} | {:x}\n", Sha256::digest(&bytes));
        }
    }
    let _ = std::fs::remove_dir_all(&root);
    lines
}

#[test]
fn synth_output_is_byte_identical_to_the_pinned_digests() {
    let got = digests();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(DIGESTS);
    if std::env::var_os("LARDER_SYNTH_DIGESTS_WRITE").is_some() {
        std::fs::write(&path, &got).expect("write digests");
        return;
    }
    let want = std::fs::read_to_string(&path).expect("read pinned digests");
    let differ: Vec<_> = got.lines().zip(want.lines()).filter(|(g, w)| g != w).collect();
    assert!(
        differ.is_empty() && got.lines().count() == want.lines().count(),
        "differ: {differ:#?}"
    );
}
