//! Bounds on the sizes a config.json implies, checked once when the spec is
//! read ([`crate::arch::read_spec`], through `arch::finish`), so that nothing
//! downstream (the loaders, the recorder, `doctor`'s and `plan`'s size
//! estimates, the KV-cache arithmetic) meets a size whose element or byte
//! count overflows, or an absurd one:
//!
//! - every tensor the spec implies, derived sizes included (`num_heads x
//!   head_dim` rows), has at most [`MAX_TENSOR_ELEMENTS`] elements;
//! - every attention head is at most [`MAX_HEAD_DIM`] wide;
//! - a KDA convolution has no more taps than the context has positions
//!   (taps further back never see an input).
//!
//! Field values alone are already bounded by
//! [`MAX_CONFIG_INT`](crate::config::MAX_CONFIG_INT). These bounds keep
//! arithmetic sane; allocations are bounded by the data they hold: loaders
//! check a tensor's stored shape before taking it, and the recorder checks
//! requests against the checkpoint's shapes. Errors name the field (as most
//! architectures spell it) and the tensor.

use crate::config::{ConfigJson, MAX_HEAD_DIM, MAX_TENSOR_ELEMENTS};
use crate::error::ModelError;
use crate::spec::{ExpertKind, FfnSpec, KdaSpec, MixerSpec, MlaSpec, ModelSpec, MoeSpec};

/// Checks every bound of the module doc on `spec`, read from `cfg`.
pub(crate) fn check(cfg: &ConfigJson, spec: &ModelSpec) -> Result<(), ModelError> {
    let c = Checker { cfg, layer: None };
    let (h, vocab) = (spec.hidden_size, spec.vocab_size);
    c.tensor("vocab_size", vocab, "the embedding (and lm_head)", &[vocab, h])?;
    let rope_field = match spec.layers.iter().any(|l| l.mixer == MixerSpec::Gqa) {
        true => "head_dim",
        false => "qk_rope_head_dim",
    };
    c.head_dim(rope_field, spec.head_dim)?;
    for (l, layer) in spec.layers.iter().enumerate() {
        let c = Checker { cfg, layer: Some(l) };
        match &layer.mixer {
            MixerSpec::Gqa => gqa(&c, spec)?,
            MixerSpec::Mla(m) => mla(&c, m, spec)?,
            MixerSpec::Kda(k) => kda(&c, k, spec)?,
        }
        match &layer.ffn {
            FfnSpec::Dense { intermediate } => c.tensor("intermediate_size", *intermediate, "MLP projections", &[*intermediate, h])?,
            FfnSpec::Moe(m) => moe(&c, m, h, &spec.model_type)?,
        }
    }
    Ok(())
}

/// Grouped-query attention: q/o `[heads x head_dim, hidden]`, k/v `[kv_heads x head_dim, hidden]`.
fn gqa(c: &Checker<'_>, spec: &ModelSpec) -> Result<(), ModelError> {
    let (h, d) = (spec.hidden_size, spec.head_dim);
    c.tensor("num_attention_heads", spec.num_heads, "q_proj", &[spec.num_heads, d, h])?;
    c.tensor("num_key_value_heads", spec.num_kv_heads, "k_proj", &[spec.num_kv_heads, d, h])
}

/// Multi-head latent attention's projections and per-head dims.
fn mla(c: &Checker<'_>, m: &MlaSpec, spec: &ModelSpec) -> Result<(), ModelError> {
    let (h, heads, rank) = (spec.hidden_size, spec.num_heads, m.kv_lora_rank);
    c.head_dim("qk_nope_head_dim", m.qk_nope_head_dim)?;
    c.head_dim("qk_rope_head_dim", m.qk_rope_head_dim)?;
    c.head_dim("v_head_dim", m.v_head_dim)?;
    let qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    match m.q_lora_rank {
        Some(r) => {
            c.tensor("q_lora_rank", r, "q_a_proj", &[r, h])?;
            c.tensor("q_lora_rank", r, "q_b_proj", &[heads, qk, r])?;
        }
        None => c.tensor("num_attention_heads", heads, "q_proj", &[heads, qk, h])?,
    }
    let kv_a = rank + m.qk_rope_head_dim;
    c.tensor("kv_lora_rank", rank, "kv_a_proj_with_mqa", &[kv_a, h])?;
    c.tensor("kv_lora_rank", rank, "kv_b_proj", &[heads, m.qk_nope_head_dim + m.v_head_dim, rank])?;
    c.tensor("v_head_dim", m.v_head_dim, "o_proj", &[h, heads, m.v_head_dim])
}

/// Kimi Delta Attention: projections `[H x D, hidden]`, the convolutions
/// `[H x D, 1, K]` (no longer than the context), the state `[H, D, D]`.
fn kda(c: &Checker<'_>, k: &KdaSpec, spec: &ModelSpec) -> Result<(), ModelError> {
    let (h, d, taps) = (k.num_heads, k.head_dim, k.conv_kernel);
    c.head_dim("linear_attn_config.head_dim", d)?;
    let kernel = "linear_attn_config.short_conv_kernel_size";
    if taps > spec.max_position_embeddings {
        return Err(c.cfg.err(
            kernel,
            format!(
                "{taps} taps are more than the context's {} positions (model_max_length / max_position_embeddings): \
                 taps further back than the first position never see an input",
                spec.max_position_embeddings
            ),
        ));
    }
    c.tensor("linear_attn_config.num_heads", h, "q_proj", &[h, d, spec.hidden_size])?;
    c.tensor(kernel, taps, "q_conv1d, k_conv1d and v_conv1d", &[h, d, 1, taps])?;
    c.tensor("linear_attn_config.head_dim", d, "recurrent state", &[h, d, d])
}

/// A MoE block: the router, each routed expert (gpt-oss: the fused tensors
/// of all of them), the shared expert and the latent projections. Fields as
/// `model_type` spells them.
fn moe(c: &Checker<'_>, m: &MoeSpec, h: usize, model_type: &str) -> Result<(), ModelError> {
    let (e, i, w) = (m.num_experts, m.expert_intermediate, m.expert_width(h));
    let (experts, intermediate) = match model_type {
        "deepseek_v3" | "kimi_k2" => ("n_routed_experts", "moe_intermediate_size"),
        "mixtral" | "gpt_oss" => ("num_local_experts", "intermediate_size"),
        _ => ("num_experts", "moe_intermediate_size"),
    };
    c.tensor(experts, e, "router", &[e, h])?;
    c.tensor(intermediate, i, "routed experts", &[i, w])?;
    if let ExpertKind::GptOss { .. } = m.experts {
        c.tensor(experts, e, "fused gate_up_proj", &[e, w, 2, i])?;
    }
    if let Some(s) = &m.shared_expert {
        let field = match model_type {
            "qwen2_moe" => "shared_expert_intermediate_size",
            _ => "moe_intermediate_size",
        };
        c.tensor(field, s.intermediate, "shared expert", &[s.intermediate, h])?;
    }
    if let Some(latent) = m.latent {
        c.tensor(
            "routed_expert_hidden_size",
            latent.width,
            "routed_expert_down_proj",
            &[latent.width, h],
        )?;
    }
    Ok(())
}

/// Checks sizes against the bounds, with errors against `cfg`'s path
/// naming the layer (if any) the tensor belongs to.
struct Checker<'a> {
    cfg: &'a ConfigJson,
    layer: Option<usize>,
}

impl Checker<'_> {
    /// Tensor `what`, whose shape multiplies out of `factors` (field `field`
    /// is `value`), has at most [`MAX_TENSOR_ELEMENTS`] elements.
    fn tensor(&self, field: &str, value: usize, what: &str, factors: &[usize]) -> Result<(), ModelError> {
        let elements = factors.iter().try_fold(1u64, |n, &f| n.checked_mul(f as u64));
        if elements.is_some_and(|n| n <= MAX_TENSOR_ELEMENTS) {
            return Ok(());
        }
        let count = elements.map_or_else(|| "more than 2^64".to_string(), |n| n.to_string());
        let product = factors.iter().map(usize::to_string).collect::<Vec<_>>().join(" x ");
        let whose = self.layer.map_or_else(String::new, |l| format!("layer {l}'s "));
        let message = format!(
            "{value} gives {whose}{what} {product} = {count} elements (each), \
             more than the {MAX_TENSOR_ELEMENTS} (2^48) one tensor may have"
        );
        Err(self.cfg.err(field, message))
    }

    /// A head `dim` wide is at most [`MAX_HEAD_DIM`].
    fn head_dim(&self, field: &str, dim: usize) -> Result<(), ModelError> {
        if dim <= MAX_HEAD_DIM {
            return Ok(());
        }
        let message = format!("{dim} is too wide for a head (at most {MAX_HEAD_DIM})");
        Err(self.cfg.err(field, message))
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use serde_json::{json, Value};

    /// `read_spec`'s error for fixture `fixture`'s config.json patched with `patch`.
    fn refusal(fixture: &str, patch: Value) -> String {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
        let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(root.join(fixture).join("config.json")).unwrap()).unwrap();
        for (k, v) in patch.as_object().unwrap() {
            cfg[k] = v.clone();
        }
        let dir = std::env::temp_dir().join(format!(
            "larder-spec-limits-{fixture}-{}-{}",
            std::process::id(),
            cfg.to_string().len()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
        let err = crate::arch::read_spec(&dir).expect_err("a refusal").to_string();
        std::fs::remove_dir_all(dir).unwrap();
        err
    }

    #[test]
    fn each_bound_is_an_error_naming_its_field() {
        let cases = [
            ("qwen3_moe_tiny", json!({"head_dim": 1 << 17}), "`head_dim`: 131072 is too wide"),
            (
                "qwen3_moe_tiny",
                json!({"vocab_size": 1u64 << 31, "hidden_size": 1 << 20}),
                "`vocab_size`: 2147483648 gives",
            ),
            (
                "qwen3_moe_tiny",
                json!({"hidden_size": 1 << 20, "num_experts": 1u64 << 31}),
                "`num_experts`: 2147483648 gives layer 0's router",
            ),
            (
                "deepseek_v3_tiny",
                json!({"qk_nope_head_dim": 1 << 17}),
                "`qk_nope_head_dim`: 131072 is too wide",
            ),
        ];
        for (fixture, patch, want) in cases {
            let err = refusal(fixture, patch.clone());
            assert!(err.contains(want), "{fixture} {patch}: {err}");
        }
    }
}
