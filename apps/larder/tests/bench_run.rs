//! Black-box tests of `larder bench run MANIFEST`: the smoke manifest runs
//! and writes results.json (schema 1, every arm's ids equal the oracle's),
//! summary.md and three SVG charts; bad manifests fail with errors naming
//! the key and the file.

use std::path::{Path, PathBuf};

mod common;

use common::{fails, fixture, larder, ok_json};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn manifest(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/manifests").join(name)
}

#[test]
fn smoke_manifest_runs_and_writes_results() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let doc = ok_json(&["bench", "run", s(&manifest("smoke.toml")), "--out", s(&out), "--json"]);
    assert_eq!(doc["schema"], 1);
    assert_eq!(doc["scenario"]["name"], "smoke");
    assert_eq!(doc["all_ids_match"], true, "{doc}");
    assert_eq!(doc["oracle_arm"], "pread");
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    // Interleaved in manifest order, each a full bench decode report.
    assert_eq!(runs[0]["arm"], "pread");
    assert_eq!(runs[1]["arm"], "mmap-noprefetch");
    for r in runs {
        assert_eq!(r["ids_match"], true);
        assert_eq!(r["prompt_tokens"], 8);
        assert!(r["decode"]["decode_tok_per_s"].as_f64().unwrap() > 0.0);
        assert!(r["decode"]["ids_hash"].is_string());
        assert!(r["caches_dropped"].is_boolean());
    }
    assert!(doc["limits"]["ram_gbps_before"].as_f64().unwrap() > 0.0);
    assert!(doc["limits"]["ram_gbps_after"].as_f64().unwrap() > 0.0);
    assert!(doc["machine"]["cpus"].as_u64().unwrap() >= 1);
    let on_disk: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(on_disk, doc);
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("## Prompt 8 tokens"), "{summary}");
    assert!(summary.contains("| mmap-noprefetch |"), "{summary}");
    for svg in ["tok_per_s.svg", "hit_rate.svg", "ttft.svg"] {
        let text = std::fs::read_to_string(out.join(svg)).unwrap();
        assert!(text.contains("<svg"), "{svg}");
    }
    assert!(!out.join("results.json.tmp").exists());
}

/// Writes `body` as a manifest in `dir` and runs it, expecting a clean failure.
fn bad(dir: &Path, body: &str) -> String {
    let path = dir.join("bad.toml");
    std::fs::write(&path, body).unwrap();
    let err = fails(&["bench", "run", s(&path), "--out", s(&dir.join("out"))]);
    assert!(err.contains("bad.toml"), "the error should name the manifest: {err}");
    err
}

fn good_model() -> String {
    format!("[model]\npath = {:?}\n", s(&fixture("qwen3_moe_tiny")))
}

const SCENARIO: &str = "[scenario]\nname = \"t\"\n";
const WORKLOAD: &str = "[workload]\nprompt_tokens = [4]\nnew_tokens = 4\nlimit_records = 4\n";
const ARM: &str = "[[arm]]\nname = \"a\"\nram_budget = \"50%\"\nio = \"pread\"\n";

#[test]
fn bad_manifests_name_the_key_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = good_model();

    let e = bad(d, &format!("{SCENARIO}{model}{ARM}budget = \"1GiB\"\n{WORKLOAD}"));
    assert!(e.contains("unknown field") && e.contains("budget"), "{e}");

    let e = bad(d, &format!("{SCENARIO}[model]\npath = \"no/such/model\"\n{ARM}{WORKLOAD}"));
    assert!(e.contains("model.path") && e.contains("no/such/model"), "{e}");

    let e = bad(
        d,
        &format!("{SCENARIO}{model}[[arm]]\nname = \"a\"\nram_budget = \"64TiB\"\n{WORKLOAD}"),
    );
    assert!(e.contains("ram_budget") && e.contains("larger than the RAM available"), "{e}");

    let e = bad(
        d,
        &format!("{SCENARIO}{model}{ARM}oracle = true\n[[arm]]\nname = \"b\"\nram_budget = \"1MiB\"\noracle = true\n{WORKLOAD}"),
    );
    assert!(e.contains("oracle") && e.contains("a, b"), "{e}");

    let e = bad(d, &format!("[scenario]\nname = \"t\"\nrounds = 0\n{model}{ARM}{WORKLOAD}"));
    assert!(e.contains("scenario.rounds"), "{e}");

    let e = bad(d, &format!("{SCENARIO}{model}{WORKLOAD}"));
    assert!(e.contains("[[arm]]"), "{e}");

    let e = bad(
        d,
        &format!("{SCENARIO}{model}[[arm]]\nname = \"a\"\nram_budget = \"50%\"\nio = \"floppy\"\n{WORKLOAD}"),
    );
    assert!(e.contains("io") && e.contains("floppy"), "{e}");

    let e = bad(d, "[scenario\n");
    assert!(e.contains("manifest"), "{e}");

    let missing = d.join("none.toml");
    let out = larder(&["bench", "run", s(&missing)]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("none.toml"));
}
