//! Streaming experts changes when bytes arrive, never what is computed:
//! logits and greedy ids are bit-identical between the in-RAM path, direct
//! streaming from safetensors and packed stores on 1, 2 and 3 drives, for
//! every I/O backend, with a cache too small to hold one expert, one that
//! holds a few (eviction under pressure), and one that holds everything,
//! with and without prefetching of predicted experts.

mod common;
use common::check_direct_and_packed;

const PROMPT: &[u32] = &[262, 406, 39, 423, 313, 87, 465, 12, 99, 7];

#[test]
fn direct_and_packed_streaming_are_bit_identical_to_in_ram() {
    for name in [
        "qwen3_moe_tiny",
        "qwen2_moe_tiny",
        "mixtral_tiny",
        "deepseek_v3_tiny",
        "kimi_k2_tiny",
        "deepseek_v3_fp8",
        // compressed-tensors 4-bit experts: packed + scale (+ weight_shape) per projection.
        "deepseek_v3_int4",
        "deepseek_v3_mxfp4",
    ] {
        check_direct_and_packed(name, PROMPT, 3);
    }
}

/// gpt-oss: each expert is slice `[e]` of per-layer fused tensors (MXFP4:
/// six extents, blocks, scales and bias of gate_up and down; unquantized:
/// four, input-major weights transposed when the expert is built).
#[test]
fn gpt_oss_streaming_is_bit_identical_to_in_ram() {
    check_direct_and_packed("gpt_oss_tiny", PROMPT, 3);
    check_direct_and_packed("gpt_oss_bf16", PROMPT, 3);
}
