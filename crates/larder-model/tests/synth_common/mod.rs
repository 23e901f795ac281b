//! Helpers shared by the synthetic-checkpoint tests of the Kimi layouts
//! (`synth_kimi_linear.rs`, `synth_kimi_k3.rs`): a scratch folder, a preset
//! with a seed, and the routing overlap greedy decoding shows.

#![allow(dead_code)] // each test crate uses its own subset

use std::path::{Path, PathBuf};

use larder_model::synth::SynthSpec;
use larder_model::{load_model, RouteTrace};

/// An empty folder under the temporary directory, unique per process.
pub fn scratch(arch: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("larder-synth-{arch}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `arch`'s tiny preset with `seed`.
pub fn tiny(arch: &str, seed: u64) -> SynthSpec {
    let mut spec = SynthSpec::preset(arch, "tiny", None).unwrap();
    spec.seed = seed;
    spec
}

/// Mean consecutive-token expert overlap over 32 greedy tokens.
pub fn overlap(dir: &Path) -> f64 {
    let model = load_model(dir, None).unwrap();
    let mut state = model.new_state();
    let mut trace = RouteTrace::default();
    let mut tok = 9u32;
    for _ in 0..32 {
        let logits = model.forward_last(&[tok], &mut state, Some(&mut trace)).unwrap();
        tok = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap() as u32;
    }
    trace.consecutive_overlap().0
}
