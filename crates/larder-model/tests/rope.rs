//! RoPE scaling against transformers' own rope init functions
//! (`tests/data/rope_reference.json`, written by `scripts/rope_reference.py`):
//! YaRN with and without mscale, a max_position_embeddings that differs from
//! factor x original (the Qwen3 long-context recipe), and linear scaling.

use larder_model::config::ConfigJson;
use larder_model::{Rope, RopeSpec};
use serde_json::{json, Value};

#[test]
fn scaled_frequencies_match_transformers() {
    let cases: Vec<Value> = serde_json::from_str(include_str!("data/rope_reference.json")).unwrap();
    assert!(cases.len() >= 5);
    for case in cases {
        let c = &case["case"];
        let head_dim = c["head_dim"].as_u64().unwrap() as usize;
        let cfg = ConfigJson {
            path: "config.json".into(),
            value: json!({
                "rope_theta": c["theta"],
                "rope_scaling": c["rs"],
                "max_position_embeddings": c["max_pos"],
            }),
        };
        let spec = RopeSpec::from_config(&cfg, 10000.0).unwrap();
        let rope = Rope::new(&spec, head_dim);
        let want = case["attention_scaling"].as_f64().unwrap() as f32;
        assert!(
            (rope.attention_scaling() - want).abs() <= 1e-6,
            "{c}: attention scaling {} vs {want}",
            rope.attention_scaling()
        );
        let inv: Vec<f32> = case["inv_freq"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(inv.len(), rope.inv_freq().len());
        for (i, (a, b)) in rope.inv_freq().iter().zip(&inv).enumerate() {
            assert!((a - b).abs() <= 2e-6 * b.abs(), "{c}: inv_freq[{i}] {a} vs {b}");
        }
    }
}
