//! `LoadOptions::mla_cache`: the compact latent cache (default) and the
//! expanded one give the same greedy tokens; each response's stats report
//! the KV bytes per token the model says its cache holds.

mod common;
use common::fixture;
use larder_engine::{Engine, GenerateOptions, LoadOptions};
use larder_model::MlaCache;

#[test]
fn compact_and_expanded_mla_caches_agree_and_report_their_size() {
    for name in ["deepseek_v3_tiny", "kimi_k2_tiny", "kimi_linear_tiny"] {
        let model = fixture(name);
        let prompt: Vec<u32> = (0..24u32).map(|i| (i * 37 + 3) % 100).collect();
        let opts = GenerateOptions {
            max_new: 6,
            stop_at_eos: false,
            ..GenerateOptions::default()
        };
        let run = |mla_cache| {
            let engine = Engine::load_with(
                &model,
                &LoadOptions {
                    mla_cache,
                    ..LoadOptions::default()
                },
            )
            .unwrap();
            let g = engine.generate(&prompt, &opts, &mut |_| true).unwrap();
            assert_eq!(
                g.stats.state_bytes_per_position,
                engine.model().kv_bytes_per_token(),
                "{name} {mla_cache:?}"
            );
            (g.ids, g.stats.state_bytes_per_position)
        };
        let (compact_ids, compact_bytes) = run(MlaCache::Compact);
        let (expanded_ids, expanded_bytes) = run(MlaCache::Expanded);
        assert_eq!(compact_ids, expanded_ids, "{name}: greedy tokens");
        assert!(
            compact_bytes < expanded_bytes,
            "{name}: {compact_bytes} vs {expanded_bytes} bytes per token"
        );
    }
}
