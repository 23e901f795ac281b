//! Tests of [`super::plan`]: the recorder-built tensor list against the
//! hand-written lists synth had before (pinned in
//! tests/data/synth_plan_from_hand_lists.txt: every tensor's shard, name,
//! shape, dtype and initialisation, sorted, for every architecture x tiny
//! preset x experts format and latent experts; the latent-expert lines were
//! re-pinned when they took K3's names, `routed_expert_{down,up}_proj` and
//! `routed_expert_norm`, and the `kimi_k3` lines were pinned when it was
//! added, checked against fixtures/kimi_k3_tiny's tensor list by
//! tests/synth_kimi_k3.rs; `LARDER_SYNTH_PLAN_WRITE=1` rewrites the file),
//! and recordings of the real-size presets, whose byte totals must match
//! synth's size accounting without the recording holding weight bytes
//! (Kimi K3's released geometry included: its expert record is
//! 17,547,264 bytes).

use std::path::Path;

use super::plan::{shards, TensorPlan};
use super::{ExpertsFormat, SynthSpec, ARCHITECTURES};

/// `label | shard name shape dtype init` lines, sorted per spec.
fn manifest(spec: &SynthSpec) -> Vec<String> {
    let norm = if spec.latent_moe_use_norm { " norm" } else { "" };
    let label = format!(
        "{} {:?} latent {:?}{norm}",
        spec.arch, spec.experts_format, spec.routed_expert_hidden_size
    );
    let plan = shards(spec, Path::new(".")).unwrap_or_else(|e| panic!("{label}: {e}"));
    let mut lines: Vec<String> = plan
        .iter()
        .enumerate()
        .flat_map(|(i, v)| v.iter().map(move |t| (i, t)))
        .map(|(i, t)| format!("{label} | {i} {} {:?} {} {:?}", t.name, t.shape, t.dtype.name(), t.kind))
        .collect();
    lines.sort();
    lines
}

fn tiny_specs() -> Vec<SynthSpec> {
    let mut specs = Vec::new();
    for arch in ARCHITECTURES {
        for &format in ExpertsFormat::for_arch(arch) {
            let mut s = SynthSpec::preset(arch, "tiny", None).expect("tiny preset");
            s.set_experts_format(format).expect("format");
            specs.push(s);
        }
    }
    for (latent, norm, format) in [
        (24, false, ExpertsFormat::Bf16),
        (32, true, ExpertsFormat::Int4),
        (32, true, ExpertsFormat::Mxfp4),
    ] {
        let mut s = SynthSpec::preset("kimi_linear", "tiny", None).expect("tiny preset");
        s.routed_expert_hidden_size = Some(latent);
        s.latent_moe_use_norm = norm;
        s.set_experts_format(format).expect("format");
        specs.push(s);
    }
    specs
}

#[test]
fn recorded_plan_is_the_former_hand_written_list() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/synth_plan_from_hand_lists.txt");
    let got: Vec<String> = tiny_specs().iter().flat_map(manifest).collect();
    if std::env::var_os("LARDER_SYNTH_PLAN_WRITE").is_some() {
        std::fs::write(&path, got.iter().map(|l| format!("{l}\n")).collect::<String>()).expect("write pinned plan");
    }
    let want = std::fs::read_to_string(&path).expect("read pinned plan");
    let want: Vec<&str> = want.lines().collect();
    let differ: Vec<_> = got.iter().zip(&want).filter(|(g, w)| g != w).take(10).collect();
    assert!(
        differ.is_empty() && got.len() == want.len(),
        "{} vs {} lines: {differ:#?}",
        got.len(),
        want.len()
    );
}

/// Resident-set high-water mark in KiB (Linux), if readable.
fn vm_hwm_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn real_size_presets_record_without_weight_bytes() {
    let mut cases = vec![("gpt_oss", "20b", ExpertsFormat::Mxfp4), ("gpt_oss", "120b", ExpertsFormat::Mxfp4)];
    cases.extend([("gpt_oss", "20b", ExpertsFormat::Bf16), ("gpt_oss", "120b", ExpertsFormat::Bf16)]);
    for arch in ["qwen3_moe", "deepseek_v3", "kimi_linear"] {
        for &format in ExpertsFormat::for_arch(arch) {
            cases.push((arch, "k3-mini", format));
        }
    }
    cases.extend([("kimi_k3", "k3", ExpertsFormat::Mxfp4), ("kimi_k3", "k3", ExpertsFormat::Bf16)]);
    for (arch, preset, format) in cases {
        let label = format!("{arch} {preset} {format:?}");
        let mut spec = SynthSpec::preset(arch, preset, None).expect("preset");
        spec.set_experts_format(format).expect("format");
        let plan = shards(&spec, Path::new(".")).unwrap_or_else(|e| panic!("{label}: {e}"));
        let experts: u64 = plan.iter().flatten().filter(|t| is_routed_expert(t)).map(TensorPlan::bytes).sum();
        assert_eq!(experts, spec.total_expert_bytes(), "{label}: recorded expert bytes");
        // One expert's record, as recorded: its tensors' bytes (gpt-oss's
        // experts are fused per layer, so only the total is checked there).
        if let Some(record) = plan.iter().flatten().find_map(|t| expert_prefix(&t.name)) {
            let one: u64 = plan
                .iter()
                .flatten()
                .filter(|t| expert_prefix(&t.name) == Some(record))
                .map(TensorPlan::bytes)
                .sum();
            assert_eq!(one, spec.expert_bytes() as u64, "{label}: one expert record ({record})");
        }
        let total: u64 = plan.iter().flatten().map(TensorPlan::bytes).sum();
        assert_eq!(total, spec.total_bytes().expect("total"), "{label}");
        assert!(total > experts, "{label}");
    }
    if let Some(kib) = vm_hwm_kib() {
        eprintln!("peak resident memory after recording every real-size preset: {kib} KiB");
        assert!(kib < 1 << 20, "peak resident memory {kib} KiB while recording real-size presets");
    }
}

/// Kimi K3 as released: 896 experts of 3 MXFP4 matrices [3072, 3584] /
/// [3584, 3072], each 3 x (3072 x 3584 / 2 codes + 3072 x 112 scales) =
/// 17,547,264 bytes (docs/kimi_k3_reference.md §2.3), 16 of them per token
/// in each of 92 MoE layers; 24 MLA layers of 93, the last one included.
#[test]
fn k3_preset_has_the_released_geometry() {
    let spec = SynthSpec::preset("kimi_k3", "k3", None).expect("k3 preset");
    assert_eq!(spec.expert_bytes(), 17_547_264);
    assert_eq!((spec.layers, spec.moe_layers(), spec.experts, spec.top_k), (93, 92, 896, 16));
    assert_eq!(spec.total_expert_bytes(), 1_446_456_066_048, "all routed experts (§3)");
    let cfg = spec.config();
    let text = &cfg["text_config"];
    let full: Vec<u64> = (1..=23).map(|i| 4 * i).chain([93]).collect();
    assert_eq!(text["linear_attn_config"]["full_attn_layers"], serde_json::json!(full));
    assert_eq!(text["linear_attn_config"]["kda_layers"].as_array().map(Vec::len), Some(69));
    for (field, value) in [
        ("hidden_size", serde_json::json!(7168)),
        ("moe_intermediate_size", serde_json::json!(3072)),
        ("routed_expert_hidden_size", serde_json::json!(3584)),
        ("intermediate_size", serde_json::json!(33792)),
        ("num_shared_experts", serde_json::json!(2)),
        ("attn_res_block_size", serde_json::json!(12)),
        ("bos_token_id", serde_json::json!(163_584)),
        ("eos_token_id", serde_json::json!(163_586)),
        ("pad_token_id", serde_json::json!(163_839)),
    ] {
        assert_eq!(text[field], value, "text_config.{field}");
    }
    assert_eq!(cfg["media_placeholder_token_id"], 163_605);
    // A shrunk checkpoint keeps the per-expert geometry.
    let mut small = spec.clone();
    (small.layers, small.experts) = (5, 64);
    assert_eq!(small.expert_bytes(), 17_547_264);
    assert_eq!(small.total_expert_bytes(), 4 * 64 * 17_547_264);
}

/// `….experts.E` of routed expert `E`'s tensor name (not a fused or shared expert's).
fn expert_prefix(name: &str) -> Option<&str> {
    let at = name.find(".experts.")? + ".experts.".len();
    let digits = name[at..].bytes().take_while(u8::is_ascii_digit).count();
    (digits > 0 && !name.contains("shared_experts")).then(|| &name[..at + digits])
}

/// Routed experts' tensors (and gpt-oss's fused ones), not shared experts.
fn is_routed_expert(t: &TensorPlan) -> bool {
    (t.name.contains(".experts.") || t.name.contains(".mlp.experts.")) && !t.name.contains("shared_experts")
}
