//! `larder synth --routing uniform|local|skewed|mixed` and the `--routing-*`
//! knobs through the CLI: on a small qwen3_moe (64 experts, top-8, 8 layers)
//! each preset's measured statistics (`routing_stats` of `--json`) move the
//! way the preset says against uniform's, and bad knob values are refused
//! with errors naming the flag.

use std::path::Path;

use serde_json::Value;

mod common;

use common::{fails, ok_json};

/// `routing_stats` of a synth with `--routing routing` plus `extra`.
fn stats(dir: &Path, routing: &str, extra: &[&str]) -> Value {
    let out = dir.join(format!("{routing}{}", extra.join("")));
    let mut args = vec![
        "synth",
        "--arch",
        "qwen3_moe",
        "--preset",
        "tiny",
        "--experts",
        "64",
        "--top-k",
        "8",
        "--layers",
        "8",
        "--vocab",
        "8192",
        "--measure-tokens",
        "256",
        "--routing",
        routing,
        "--out",
        out.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    let report = ok_json(&args);
    let s = report["routing_stats"].clone();
    assert_eq!(s["tokens"], 256, "{routing}: {s}");
    s
}

fn f(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} missing in {v}"))
}

fn recall(v: &Value) -> Vec<f64> {
    v["lookahead_recall"]
        .as_array()
        .expect("lookahead_recall")
        .iter()
        .map(|p| p[1].as_f64().unwrap())
        .collect()
}

#[test]
fn presets_move_the_measured_statistics_the_right_way() {
    let tmp = tempfile::tempdir().unwrap();
    let uniform = stats(tmp.path(), "uniform", &[]);
    let local = stats(tmp.path(), "local", &[]);
    let skewed = stats(tmp.path(), "skewed", &[]);
    let mixed = stats(tmp.path(), "mixed", &[]);
    let all = format!("uniform {uniform}\nlocal {local}\nskewed {skewed}\nmixed {mixed}");

    // Uniform: consecutive overlap near k/E, next-layer lookahead nearly perfect.
    assert!(f(&uniform, "consecutive_overlap") < 0.2, "{all}");
    let ru = recall(&uniform);
    assert_eq!(ru.len(), 3, "{all}");
    assert!(ru[0] > 0.95, "{all}");

    // Skewed: heat in the hottest 30% well above uniform's.
    assert!(f(&skewed, "hot_30") > f(&uniform, "hot_30") + 0.25, "{all}");
    assert!(f(&skewed, "hot_30") > 0.75, "{all}");
    // Local: reuse within two tokens and LRU hits well above uniform's.
    assert!(f(&local, "reuse_within_2") > f(&uniform, "reuse_within_2") + 0.4, "{all}");
    assert!(f(&local, "lru_hit_40") > 0.85, "{all}");
    // Mixed: both, against uniform.
    assert!(f(&mixed, "hot_30") > f(&uniform, "hot_30") + 0.2, "{all}");
    assert!(f(&mixed, "reuse_within_2") > f(&uniform, "reuse_within_2") + 0.3, "{all}");

    // Realistic presets: depth-1 recall near 70%, below uniform's, falling with depth.
    for (name, s) in [("local", &local), ("skewed", &skewed), ("mixed", &mixed)] {
        let r = recall(s);
        assert!(r[0] > 0.6 && r[0] < 0.8 && r[0] < ru[0] - 0.15, "{name}: {all}");
        assert!(r[2] < r[0], "{name}: recall falls with depth: {all}");
    }

    // A knob overrides its preset's default: more drift, less recall.
    let drifted = stats(tmp.path(), "uniform", &["--routing-drift", "0.5"]);
    assert!(recall(&drifted)[0] < ru[0] - 0.2, "drift 0.5: {drifted}\n{all}");
}

#[test]
fn bad_routing_knobs_are_refused_naming_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("m");
    for (flag, value) in [
        ("--routing-skew", "-1"),
        ("--routing-skew", "9"),
        ("--routing-locality", "1"),
        ("--routing-locality", "nan"),
        ("--routing-drift", "3"),
        ("--routing-drift", "x"),
    ] {
        let arg = format!("{flag}={value}");
        let err = fails(&["synth", "--preset", "tiny", &arg, "--out", out.to_str().unwrap()]);
        assert!(err.contains(flag), "{flag} {value}: {err}");
    }
    let err = fails(&["synth", "--preset", "tiny", "--routing", "zipf", "--out", out.to_str().unwrap()]);
    assert!(err.contains("--routing"), "{err}");
    assert!(!out.join("config.json").exists(), "nothing written");
}
