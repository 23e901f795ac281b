//! Context past 32k positions on a tiny MLA model with YaRN RoPE (random
//! weights over a DeepSeek-V3 config, one layer, one head): prefilled whole
//! or in uneven chunks and then decoded, the logits agree bit for bit; the
//! compact latent cache agrees with the expanded one within 1e-4, and holds
//! what it should (`kv_lora_rank + rope` floats per position).

use std::path::Path;

use larder_model::config::ConfigJson;
use larder_model::{DecoderModel, MlaCache, RandomSource};
use larder_tensor::Mat;
use serde_json::json;

/// Past 2^15, and the first 32k are the YaRN-extended range (original 16k).
const N: usize = 32768 + 48;

fn model(cache: MlaCache) -> DecoderModel {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/deepseek_v3_noq_yarn");
    let mut cfg = ConfigJson::read(&dir).unwrap();
    let v = &mut cfg.value;
    for (field, value) in [
        ("hidden_size", json!(8)),
        ("intermediate_size", json!(16)),
        ("num_hidden_layers", json!(1)),
        ("first_k_dense_replace", json!(1)),
        ("num_attention_heads", json!(1)),
        ("num_key_value_heads", json!(1)),
        ("kv_lora_rank", json!(4)),
        ("qk_nope_head_dim", json!(4)),
        ("qk_rope_head_dim", json!(4)),
        ("v_head_dim", json!(4)),
        ("vocab_size", json!(64)),
        ("max_position_embeddings", json!(65536)),
    ] {
        v[field] = value;
    }
    v["rope_parameters"]["original_max_position_embeddings"] = json!(16384);
    v["rope_parameters"]["factor"] = json!(4.0);
    let mut spec = larder_model::arch::spec_from_config(&cfg).unwrap();
    spec.mla_cache = cache;
    // Weights large enough that attention is far from uniform.
    DecoderModel::load(spec, &RandomSource::new(11, 0.5), None).unwrap()
}

fn ids() -> Vec<u32> {
    let mut x = 0x9e37_79b9u32;
    (0..N)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x % 64
        })
        .collect()
}

fn bits(m: &Mat, rows: std::ops::Range<usize>) -> Vec<u32> {
    rows.flat_map(|r| m.row(r).iter().map(|v| v.to_bits()).collect::<Vec<_>>())
        .collect()
}

#[test]
fn mla_past_32k_positions_chunked_equals_whole_and_compact_equals_expanded() {
    let ids = ids();
    let (compact, expanded) = (model(MlaCache::Compact), model(MlaCache::Expanded));
    assert_eq!(compact.kv_bytes_per_token(), (4 + 4) * 4, "latent + rope key");
    assert_eq!(expanded.kv_bytes_per_token(), (4 + 4 + 4) * 4, "key nope + rope, value");

    std::thread::scope(|scope| {
        // The expanded cache, prefilled in uneven chunks on the other core.
        let other = scope.spawn(|| {
            let mut state = expanded.new_state();
            let parts: Vec<Mat> = [1, 16383, 16000, N - 32384]
                .iter()
                .scan(0, |at, &len| {
                    *at += len;
                    Some(expanded.forward(&ids[*at - len..*at], &mut state, None).unwrap())
                })
                .collect();
            parts
        });

        // Compact: one pass over everything ...
        let mut state = compact.new_state();
        let whole = compact.forward(&ids, &mut state, None).unwrap();
        assert_eq!(state.bytes(), N * (4 + 4) * 4);
        // ... equals the last 4k positions again in two chunks, then the
        // last 8 token by token, bit for bit.
        state.rollback(28672).unwrap();
        let mut at = 28672;
        for len in [3000, N - 8 - 31672] {
            let part = compact.forward(&ids[at..at + len], &mut state, None).unwrap();
            assert_eq!(bits(&part, 0..len), bits(&whole, at..at + len), "chunk at {at}");
            at += len;
        }
        for p in N - 8..N {
            let row = compact.forward(&ids[p..p + 1], &mut state, None).unwrap();
            assert_eq!(bits(&row, 0..1), bits(&whole, p..p + 1), "decoded position {p}");
        }

        // Compact and expanded agree.
        let parts = other.join().unwrap();
        let mut worst = 0.0f32;
        let rows = parts.iter().flat_map(|m| (0..m.rows()).map(move |r| m.row(r)));
        for (r, row) in rows.enumerate() {
            for (a, b) in whole.row(r).iter().zip(row) {
                worst = worst.max((a - b).abs());
            }
        }
        eprintln!("compact vs expanded over {N} positions: max |logit diff| {worst:.2e}");
        assert!(worst <= 1e-4, "compact vs expanded: {worst}");
        let spread = whole.row(N - 1).iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(spread > 1e-2, "logits are not degenerate: {spread}");
    });
}
