//! A model built from a spec alone over a `RandomSource`: it loads, runs a
//! forward pass to finite logits, and the same seed gives the same bits.

use std::path::Path;

use larder_model::arch::read_spec;
use larder_model::{DecoderModel, RandomSource};

fn logits(fixture: &str, seed: u64) -> Vec<f32> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(fixture);
    let spec = read_spec(&dir).unwrap();
    // gpt-oss's fused expert tensors are asked about before they are taken.
    let weights = RandomSource::new(seed, 0.05).with_presence(|name| name.contains(".mlp.experts."));
    let model = DecoderModel::load(spec, &weights, None).unwrap_or_else(|e| panic!("{fixture}: {e}"));
    let out = model.forward(&[1, 2, 3], &mut model.new_state(), None).unwrap();
    (0..out.rows()).flat_map(|r| out.row(r).to_vec()).collect()
}

#[test]
fn random_weights_build_and_run_tiny_models() {
    for fixture in ["llama_tiny", "qwen3_moe_tiny", "deepseek_v3_tiny", "gpt_oss_tiny"] {
        let a = logits(fixture, 7);
        assert!(!a.is_empty() && a.iter().all(|x| x.is_finite()), "{fixture}");
        let same: Vec<u32> = logits(fixture, 7).iter().map(|x| x.to_bits()).collect();
        assert_eq!(
            a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            same,
            "{fixture}: same seed, same bits"
        );
        assert_ne!(a, logits(fixture, 8), "{fixture}: another seed, other weights");
    }
}
