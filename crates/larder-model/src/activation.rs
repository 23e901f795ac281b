//! How much memory a forward pass holds per row, and so how many prompt
//! rows one prefill pass may take ([`prefill_rows`]).
//!
//! A pass runs every row through layer L (attention, then one MoE step over
//! the union of the rows' experts) before layer L+1, so a prompt run in one
//! pass reads each routed expert at most once, whatever its length. What
//! bounds the pass is its activations: per row, the residual stream and its
//! normed copies, the mixer's projections, the router logits, the row's
//! kept output of each of its `top_k` routed experts (summed in canonical
//! order once all have run), and the temporaries of one expert call. KV
//! and recurrent state are not activations: they are the sequence's state
//! and are counted by the KV budget.
//!
//! [`activation_bytes_per_row`] is an upper estimate in f32 (every buffer a
//! row has live at the widest layer counted as if all were live at once); it
//! sizes prefill, it is not an allocator.

use crate::spec::{FfnSpec, MixerSpec, ModelSpec};

/// Bytes of f32 activations one row holds during a pass, at the widest
/// layer (an upper estimate; see the module docs).
pub fn activation_bytes_per_row(spec: &ModelSpec) -> u64 {
    let h = spec.hidden_size;
    // x, the mixer's input and output, the normed copies, the MoE output.
    let residual = 8 * h;
    let attn_res = spec.attn_res_block.map_or(0, |block| (spec.layers.len() / block.max(1) + 2) * h);
    let widest = spec
        .layers
        .iter()
        .map(|l| mixer_floats(spec, &l.mixer) + ffn_floats(spec, &l.ffn))
        .max();
    4 * (residual + attn_res + widest.unwrap_or(0)) as u64
}

/// The rows one prefill pass takes so its activations stay within
/// `limit_bytes` (at least 1): the whole prompt unless it is that long.
pub fn prefill_rows(spec: &ModelSpec, limit_bytes: u64) -> usize {
    let per_row = activation_bytes_per_row(spec).max(1);
    usize::try_from(limit_bytes / per_row).unwrap_or(usize::MAX).max(1)
}

/// Floats per row the token mixer holds: its projections and its output.
fn mixer_floats(spec: &ModelSpec, mixer: &MixerSpec) -> usize {
    let heads = spec.num_heads;
    match mixer {
        MixerSpec::Gqa => 2 * heads * spec.head_dim + 2 * spec.num_kv_heads * spec.head_dim,
        MixerSpec::Mla(m) => {
            let qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
            // q (and its low-rank input), kv_a, the latent, kv_b's expansion, the heads' output, the gate.
            m.q_lora_rank.unwrap_or(0)
                + heads * qk
                + 2 * (m.kv_lora_rank + m.qk_rope_head_dim)
                + heads * (m.qk_nope_head_dim + m.v_head_dim)
                + heads * m.v_head_dim
                + heads
        }
        // q, k, v before and after the convolution, gates, output and its gate.
        MixerSpec::Kda(k) => 10 * k.num_heads * k.head_dim + 2 * k.num_heads,
    }
}

/// Floats per row the feed-forward half holds.
fn ffn_floats(spec: &ModelSpec, ffn: &FfnSpec) -> usize {
    let h = spec.hidden_size;
    match ffn {
        FfnSpec::Dense { intermediate } => 2 * intermediate + h,
        FfnSpec::Moe(m) => {
            let w = m.expert_width(h);
            // The row's kept output of each routed expert, and the temporaries
            // of the expert call running now (its gathered input, gate, up and
            // output: at most one row's worth per row, when every row chose it).
            let routed = m.top_k * w + 2 * w + 2 * m.expert_intermediate;
            let shared = m.shared_expert.as_ref().map_or(0, |s| 2 * s.intermediate + h + 1);
            m.num_experts + 2 * w + routed + shared
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_follow_the_limit_and_are_never_zero() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/deepseek_v3_tiny");
        let spec = crate::arch::read_spec(&dir).expect("the deepseek_v3_tiny fixture");
        let per_row = activation_bytes_per_row(&spec);
        assert!(per_row > 4 * spec.hidden_size as u64);
        assert_eq!(prefill_rows(&spec, 0), 1);
        assert_eq!(prefill_rows(&spec, per_row * 300 + 1), 300);
        assert_eq!(
            prefill_rows(&spec, u64::MAX),
            usize::try_from(u64::MAX / per_row).unwrap_or(usize::MAX)
        );
    }
}
