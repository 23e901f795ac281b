//! Decode speed of one MLA layer with DeepSeek-V3's attention shape (128
//! heads, nope 128, rope 64, v 128, kv_lora_rank 512; hidden 1024 and a
//! direct `q_proj` to keep the setup small) over caches of 1k to 16k positions, compact vs
//! expanded. Ignored by default (a measurement, not a check); run with
//! `cargo test --release -p larder-model --test mla_decode_speed -- --ignored --nocapture`.

use std::sync::OnceLock;
use std::time::Instant;

use larder_model::{KvLayer, MlaCache};
use larder_model::{MlaAttention, QueryProj};
use larder_model::{Rope, RopeScaling, RopeSpec};
use larder_tensor::{Linear, Mat, WeightDType, WeightMatrix};

const HEADS: usize = 128;
const NOPE: usize = 128;
const ROPE: usize = 64;
const V: usize = 128;
const RANK: usize = 512;
const HIDDEN: usize = 1024;

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
        })
        .collect()
}

fn linear(rows: usize, cols: usize, seed: u64) -> Linear {
    Linear::new(
        WeightMatrix::from_f32(WeightDType::BF16, rows, cols, &values(rows * cols, seed)),
        None,
    )
}

fn layer(cache: MlaCache) -> MlaAttention {
    MlaAttention {
        q: QueryProj::Direct(linear(HEADS * (NOPE + ROPE), HIDDEN, 1)),
        kv_a: linear(RANK + ROPE, HIDDEN, 2),
        kv_norm: vec![1.0; RANK],
        kv_b: linear(HEADS * (NOPE + V), RANK, 3),
        o_proj: linear(HIDDEN, HEADS * V, 4),
        num_heads: HEADS,
        nope: NOPE,
        rope_dim: ROPE,
        v_dim: V,
        kv_lora_rank: RANK,
        softmax_scale: 0.07,
        interleave: true,
        rotary: true,
        latent_norm_eps: 1e-6,
        output_gate: None,
        cache,
        absorbed: OnceLock::new(),
    }
}

/// Milliseconds per decoded token at context `ctx` (best of `steps`).
fn decode_ms(cache: MlaCache, ctx: usize, steps: usize) -> f64 {
    let a = layer(cache);
    a.absorbed();
    let (k, v) = (a.key_dim(), a.value_dim());
    let mut kv = KvLayer::new(k, v);
    let (key, value) = (values(k, 5), values(v, 6));
    for _ in 0..ctx {
        kv.push(&key, &value);
    }
    let rope = Rope::new(
        &RopeSpec {
            theta: 10000.0,
            scaling: RopeScaling::None,
        },
        ROPE,
    );
    let x = Mat::from_vec(1, HIDDEN, values(HIDDEN, 7));
    let mut best = f64::INFINITY;
    for s in 0..steps {
        let t = Instant::now();
        std::hint::black_box(a.forward(&x, ctx + s, &rope, &mut kv));
        best = best.min(t.elapsed().as_secs_f64() * 1e3);
    }
    best
}

#[test]
#[ignore]
fn compact_decode_is_not_slower_than_expanded_at_long_context() {
    for ctx in [1024, 4096, 8192, 16384] {
        let c = decode_ms(MlaCache::Compact, ctx, 5);
        let e = decode_ms(MlaCache::Expanded, ctx, 5);
        eprintln!("context {ctx}: compact {c:.1} ms/token, expanded {e:.1} ms/token (one layer, 128 heads)");
    }
}
