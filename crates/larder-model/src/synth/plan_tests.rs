//! Tests of [`super::plan`]: the recorder-built tensor list against the
//! hand-written lists synth had before (pinned in
//! tests/data/synth_plan_from_hand_lists.txt: every tensor's shard, name,
//! shape, dtype and initialisation, sorted, for every architecture x tiny
//! preset x experts format and latent experts), and recordings of the
//! real-size presets, whose byte totals must match synth's size accounting
//! without the recording holding weight bytes.

use std::path::Path;

use super::plan::{shards, TensorPlan};
use super::{ExpertsFormat, SynthSpec, ARCHITECTURES};

/// `label | shard name shape dtype init` lines, sorted per spec.
fn manifest(spec: &SynthSpec) -> Vec<String> {
    let label = format!("{} {:?} latent {:?}", spec.arch, spec.experts_format, spec.moe_latent_size);
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
    for (latent, format) in [(24, ExpertsFormat::Bf16), (32, ExpertsFormat::Int4), (32, ExpertsFormat::Mxfp4)] {
        let mut s = SynthSpec::preset("kimi_linear", "tiny", None).expect("tiny preset");
        s.moe_latent_size = Some(latent);
        s.set_experts_format(format).expect("format");
        specs.push(s);
    }
    specs
}

#[test]
fn recorded_plan_is_the_former_hand_written_list() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/synth_plan_from_hand_lists.txt");
    let want = std::fs::read_to_string(&path).expect("read pinned plan");
    let got: Vec<String> = tiny_specs().iter().flat_map(manifest).collect();
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
    for (arch, preset, format) in cases {
        let label = format!("{arch} {preset} {format:?}");
        let mut spec = SynthSpec::preset(arch, preset, None).expect("preset");
        spec.set_experts_format(format).expect("format");
        let plan = shards(&spec, Path::new(".")).unwrap_or_else(|e| panic!("{label}: {e}"));
        let experts: u64 = plan.iter().flatten().filter(|t| is_routed_expert(t)).map(TensorPlan::bytes).sum();
        assert_eq!(experts, spec.total_expert_bytes(), "{label}: recorded expert bytes");
        let total: u64 = plan.iter().flatten().map(TensorPlan::bytes).sum();
        assert_eq!(total, spec.total_bytes().expect("total"), "{label}");
        assert!(total > experts, "{label}");
    }
    if let Some(kib) = vm_hwm_kib() {
        eprintln!("peak resident memory after recording every real-size preset: {kib} KiB");
        assert!(kib < 1 << 20, "peak resident memory {kib} KiB while recording real-size presets");
    }
}

/// Routed experts' tensors (and gpt-oss's fused ones), not shared experts.
fn is_routed_expert(t: &TensorPlan) -> bool {
    (t.name.contains(".experts.") || t.name.contains(".mlp.experts.")) && !t.name.contains("shared_experts")
}
