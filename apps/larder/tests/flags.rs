//! Flags fail closed (issue 17, "Flags validated"): every count, size and
//! thread flag has a documented range and a value outside it is refused
//! with an error naming the flag; `LARDER_KERNEL` naming a path this CPU
//! lacks, or no path at all, is an error; NaN weights stop `run` and
//! `forward` with an error naming the layer; a `--ram-budget` smaller than
//! one expert record is refused (0, no cache, is accepted).

use std::path::Path;
use std::process::Command;

mod common;

use common::{fails, fixture, larder, ok_json};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Expects `larder args` to fail, naming `flag` and a range.
fn refused(args: &[&str], flag: &str) {
    let err = fails(args);
    assert!(err.contains(flag), "larder {args:?}: the error should name {flag}: {err}");
    assert!(
        err.contains("out of range") || err.contains("use "),
        "larder {args:?}: no range in: {err}"
    );
}

/// `larder run --model M --ids 1,2 --max-new 2 EXTRA --json` succeeds with 2 new ids.
fn runs_two_tokens(m: &str, extra: &[&str]) {
    let args = [&["run", "--model", m, "--ids", "1,2", "--max-new", "2"][..], extra, &["--json"]].concat();
    let v = ok_json(&args);
    assert_eq!(v["ids"].as_array().unwrap().len(), 2, "larder {args:?}");
}

#[test]
fn model_flags_out_of_range_are_refused_naming_the_flag() {
    let model = fixture("qwen3_moe_tiny");
    let m = s(&model);
    for cmd in ["run", "forward"] {
        for (flag, value) in [
            ("--io-depth", "100000"),
            ("--io-depth", "0"),
            ("--prefetch", "100000"),
            ("--prefetch", "65"),
        ] {
            refused(&[cmd, "--model", m, "--ids", "1,2", "--ram-budget", "0", flag, value], flag);
        }
    }
    for (flag, value) in [
        ("--max-new", "0"),
        ("--draft-max", "0"),
        ("--draft-max", "65"),
        ("--top-k", "99999999"),
    ] {
        refused(&["run", "--model", m, "--ids", "1,2", flag, value], flag);
    }
    refused(&["forward", "--model", m, "--ids", "1,2", "--top", "0"], "--top");
    // The ends of the ranges run.
    runs_two_tokens(m, &["--ram-budget", "0", "--io-depth", "256", "--prefetch", "64"]);
    runs_two_tokens(m, &["--io-depth", "1", "--prefetch", "0"]);
}

#[test]
fn bench_and_synth_flags_out_of_range_are_refused_naming_the_flag() {
    let model = fixture("qwen3_moe_tiny");
    let m = s(&model);
    for (flag, value) in [("--threads", "0"), ("--threads", "100000"), ("--rows", "0")] {
        refused(&["bench", "kernels", "--quick", flag, value], flag);
    }
    let err = fails(&["bench", "kernels", "--quick", "--shapes", "512x100000"]);
    assert!(err.contains("--shapes") && err.contains("65536"), "{err}");
    for (flag, value) in [("--depth", "100000"), ("--batch", "0"), ("--records", "0")] {
        refused(&["bench", "io", "--store", m, flag, value], flag);
    }
    for (flag, value) in [
        ("--new", "1"),
        ("--prompt-tokens", "0"),
        ("--io-depth", "100000"),
        ("--prefetch", "100000"),
    ] {
        refused(&["bench", "decode", "--model", m, flag, value], flag);
    }
    let out = tempfile::tempdir().unwrap();
    let o = s(out.path());
    for (flag, value) in [
        ("--layers", "0"),
        ("--layers", "5000"),
        ("--experts", "0"),
        ("--top-k", "0"),
        ("--vocab", "1"),
        ("--measure-tokens", "100000"),
        ("--experts-gib", "0"),
        ("--experts-gib", "NaN"),
    ] {
        refused(&["synth", "--out", o, flag, value], flag);
    }
}

#[test]
fn help_documents_the_ranges() {
    for (args, want) in [
        (&["run", "--help"][..], "1 to 256"),
        (&["run", "--help"][..], "0 to 64"),
        (&["bench", "kernels", "--help"][..], "1 to 1024"),
        (&["bench", "io", "--help"][..], "1 to 256"),
        (&["synth", "--help"][..], "1 to 4096"),
    ] {
        let out = larder(args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(want), "larder {args:?} should document {want:?}: {text}");
    }
}

fn larder_with_kernel(value: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_larder"))
        .env("LARDER_KERNEL", value)
        .args(args)
        .output()
        .unwrap()
}

/// A kernel path this CPU cannot run.
fn missing_path() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        "neon"
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        "avx2"
    }
}

#[test]
fn larder_kernel_naming_a_missing_or_unknown_path_is_an_error() {
    let model = fixture("qwen3_moe_tiny");
    let args = ["forward", "--model", s(&model), "--ids", "1,2", "--json"];
    let available: Vec<&str> = larder_tensor::kernels::KernelPath::available().iter().map(|p| p.name()).collect();
    let missing = missing_path();
    let out = larder_with_kernel(missing, &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "LARDER_KERNEL={missing} should fail: {err}");
    assert!(err.contains(&format!("LARDER_KERNEL={missing}")), "{err}");
    for have in &available {
        assert!(err.contains(have), "the error should list {have}: {err}");
    }
    #[cfg(target_arch = "x86_64")]
    if !is_x86_feature_detected!("avx512f") {
        let out = larder_with_kernel("avx512", &args);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("LARDER_KERNEL=avx512"));
    }
    let err = fails(&["bench", "kernels", "--quick", "--path", missing]);
    assert!(err.contains("--path") && err.contains(available[0]), "{err}");
    let out = larder_with_kernel("fastest-please", &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an unknown LARDER_KERNEL should fail: {err}");
    assert!(err.contains("LARDER_KERNEL") && err.contains("scalar, avx2, avx512, neon"), "{err}");
    // Paths this CPU has are honoured, and give the same logits.
    let reference = larder_with_kernel("", &args);
    assert!(reference.status.success());
    for have in &available {
        let out = larder_with_kernel(have, &args);
        assert!(
            out.status.success(),
            "LARDER_KERNEL={have}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A copy of `name` whose tensor `tensor` has its first value set to NaN.
fn with_nan(name: &str, tensor: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap().flatten() {
        std::fs::copy(entry.path(), tmp.path().join(entry.file_name())).unwrap();
    }
    let path = tmp.path().join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let t = &header[tensor];
    let at = 8 + n + t["data_offsets"][0].as_u64().unwrap() as usize;
    let nan: &[u8] = match t["dtype"].as_str().unwrap() {
        "BF16" => &[0xc0, 0x7f],
        "F16" => &[0x00, 0x7e],
        "F32" => &[0x00, 0x00, 0xc0, 0x7f],
        d => panic!("{tensor}: dtype {d}"),
    };
    bytes[at..at + nan.len()].copy_from_slice(nan);
    std::fs::write(&path, bytes).unwrap();
    tmp
}

#[test]
fn nan_weights_stop_run_and_forward_naming_the_layer() {
    let dir = with_nan("qwen3_moe_tiny", "model.layers.1.self_attn.o_proj.weight");
    let m = s(dir.path());
    for args in [
        vec!["run", "--model", m, "--ids", "1,2,3", "--max-new", "4"],
        vec!["run", "--model", m, "--ids", "1,2,3", "--max-new", "4", "--json"],
        vec!["forward", "--model", m, "--ids", "1,2,3", "--json"],
        vec!["forward", "--model", m, "--ids", "1,2,3", "--ram-budget", "0"],
    ] {
        let err = fails(&args);
        assert!(err.contains("non-finite") && err.contains("layer 1"), "larder {args:?}: {err}");
        assert!(!err.contains("layer 0"), "{err}");
    }
    // The untouched fixture still runs.
    ok_json(&["forward", "--model", s(&fixture("qwen3_moe_tiny")), "--ids", "1,2,3", "--json"]);
}

#[test]
fn ram_budget_below_one_record_is_refused_and_zero_means_no_cache() {
    let model = fixture("qwen3_moe_tiny");
    let m = s(&model);
    let err = fails(&["run", "--model", m, "--ids", "1,2", "--ram-budget", "1"]);
    assert!(err.contains("--ram-budget") && err.contains("smallest usable budget is"), "{err}");
    let smallest: String = err
        .split("smallest usable budget is ")
        .nth(1)
        .unwrap()
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    let below = (smallest.parse::<u64>().unwrap() - 1).to_string();
    fails(&["run", "--model", m, "--ids", "1,2", "--ram-budget", &below, "--io", "pread"]);
    for budget in ["0", smallest.as_str()] {
        runs_two_tokens(m, &["--ram-budget", budget, "--io", "pread"]);
    }
}
