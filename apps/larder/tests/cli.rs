//! Black-box tests of the `larder` binary: the JSON interfaces external checks
//! rely on (docs/design.md §1), and clear errors (non-zero exit, no panic) on bad input.

use std::path::{Path, PathBuf};

use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

mod common;

use common::{fails, larder, ok_json};

fn reference(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(name).join("reference.json")).unwrap()).unwrap()
}

fn id_list(v: &Value) -> String {
    v.as_array().unwrap().iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")
}

/// A copy of a fixture folder to break on purpose.
fn copy_fixture(name: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap().flatten() {
        std::fs::copy(entry.path(), tmp.path().join(entry.file_name())).unwrap();
    }
    tmp
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, serde_json::to_string(&v).unwrap()).unwrap();
}

#[test]
fn forward_json_matches_reference_logits() {
    for name in [
        "qwen3_moe_tiny",
        "deepseek_v3_tiny",
        "deepseek_v3_fp8",
        "kimi_k2_tiny",
        "deepseek_v3_noq_yarn",
        "deepseek_v3_int4",
        "deepseek_v3_mxfp4",
        "gpt_oss_tiny",
        "gpt_oss_bf16",
    ] {
        forward_matches(name);
    }
}

fn forward_matches(name: &str) {
    let r = reference(name);
    let model = fixture(name);
    let ids = id_list(&r["prompt_ids"]);
    let v = ok_json(&["forward", "--model", model.to_str().unwrap(), "--ids", &ids, "--json"]);
    let logits = v["logits"].as_array().unwrap();
    assert_eq!(logits.len(), r["prompt_ids"].as_array().unwrap().len());
    let bytes = std::fs::read(model.join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let want: Vec<f32> = st
        .tensor("logits")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let vocab = logits[0].as_array().unwrap().len();
    for (p, row) in logits.iter().enumerate() {
        for (i, x) in row.as_array().unwrap().iter().enumerate() {
            let got = x.as_f64().unwrap() as f32;
            assert!((got - want[p * vocab + i]).abs() <= 1e-4, "{name}: position {p} token {i}");
        }
    }
}

#[test]
fn run_json_gives_greedy_ids_and_stats() {
    for name in [
        "qwen3_moe_tiny",
        "qwen2_moe_tiny",
        "mixtral_tiny",
        "llama_tiny",
        "deepseek_v3_tiny",
        "deepseek_v3_noq_yarn",
        "deepseek_v3_fp8",
        "kimi_k2_tiny",
    ] {
        let r = reference(name);
        let model = fixture(name);
        let v = ok_json(&[
            "run",
            "--model",
            model.to_str().unwrap(),
            "--ids",
            &id_list(&r["prompt_ids"]),
            "--max-new",
            "8",
            "--json",
        ]);
        assert_eq!(v["ids"], r["greedy_ids"], "{name}");
        assert!(v["text"].is_string());
        for key in ["prompt_tokens", "new_tokens", "prefill_s", "decode_s", "decode_tok_per_s"] {
            assert!(v["stats"][key].is_number(), "{name}: stats.{key}");
        }
    }
}

#[test]
fn run_prompt_and_chat_use_the_real_tokenizer() {
    for name in ["qwen3_moe_tok", "deepseek_v3_tok"] {
        prompt_and_chat(name);
    }
}

fn prompt_and_chat(name: &str) {
    let r = reference(name);
    let model = fixture(name);
    let m = model.to_str().unwrap();
    let v = ok_json(&[
        "run",
        "--model",
        m,
        "--prompt",
        r["text"].as_str().unwrap(),
        "--max-new",
        "8",
        "--json",
    ]);
    assert_eq!(v["ids"], r["greedy_ids"]);
    assert_eq!(v["text"], r["decode_text"]);
    assert_eq!(v["stats"]["prompt_tokens"], r["text_ids"].as_array().unwrap().len());

    let msgs = r["chat_messages"].as_array().unwrap();
    let v = ok_json(&[
        "run",
        "--model",
        m,
        "--chat",
        "--system",
        msgs[0]["content"].as_str().unwrap(),
        "--prompt",
        msgs[1]["content"].as_str().unwrap(),
        "--max-new",
        "2",
        "--json",
    ]);
    assert_eq!(v["stats"]["prompt_tokens"], r["chat_ids"].as_array().unwrap().len());

    // Streaming mode prints the text itself on stdout.
    let out = larder(&["run", "--model", m, "--prompt", r["text"].as_str().unwrap(), "--max-new", "8"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end_matches('\n'),
        r["decode_text"].as_str().unwrap()
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("tok/s"));
}

#[test]
fn sampling_is_seeded() {
    let m = fixture("qwen3_moe_tiny");
    let args = [
        "run",
        "--model",
        m.to_str().unwrap(),
        "--ids",
        "1,2,3",
        "--max-new",
        "10",
        "--temperature",
        "0.8",
        "--top-p",
        "0.9",
        "--top-k",
        "40",
        "--seed",
        "5",
        "--json",
    ];
    assert_eq!(ok_json(&args)["ids"], ok_json(&args)["ids"]);
}

#[test]
fn bad_inputs_give_clear_errors() {
    let tiny = fixture("qwen3_moe_tiny");
    let t = tiny.to_str().unwrap();
    assert!(fails(&["run", "--model", "/nonexistent/model", "--ids", "1"]).contains("/nonexistent/model"));
    assert!(fails(&["forward", "--model", t, "--ids", "1,99999", "--json"]).contains("99999"));
    assert!(fails(&["forward", "--model", t, "--ids", "1,x"]).contains("x"));
    assert!(fails(&["run", "--model", t, "--ids", "1", "--temperature", "-1"]).contains("temperature"));
    // No tokenizer: a text prompt cannot be used, and the error says so.
    assert!(fails(&["run", "--model", t, "--prompt", "hello"]).contains("tokenizer.json"));
    assert!(fails(&["run", "--model", fixture("qwen3_moe_tok").to_str().unwrap(), "--prompt", ""]).contains("empty prompt"));

    let unknown = copy_fixture("qwen3_moe_tiny");
    edit_config(unknown.path(), |v| v["model_type"] = "gpt_bogus".into());
    let err = fails(&["forward", "--model", unknown.path().to_str().unwrap(), "--ids", "1"]);
    assert!(err.contains("gpt_bogus") && err.contains("qwen3_moe"), "{err}");

    let kv = copy_fixture("qwen3_moe_tiny");
    edit_config(kv.path(), |v| v["num_key_value_heads"] = 3.into());
    assert!(fails(&["forward", "--model", kv.path().to_str().unwrap(), "--ids", "1"]).contains("num_key_value_heads"));

    let topk = copy_fixture("qwen3_moe_tiny");
    edit_config(topk.path(), |v| v["num_experts_per_tok"] = 99.into());
    assert!(fails(&["forward", "--model", topk.path().to_str().unwrap(), "--ids", "1"]).contains("num_experts_per_tok"));

    let shape = copy_fixture("qwen3_moe_tiny");
    edit_config(shape.path(), |v| v["moe_intermediate_size"] = 48.into());
    let err = fails(&["forward", "--model", shape.path().to_str().unwrap(), "--ids", "1"]);
    assert!(err.contains("gate_proj.weight") && err.contains("shape"), "{err}");

    let bad_json = copy_fixture("qwen3_moe_tiny");
    std::fs::write(bad_json.path().join("config.json"), "{ not json").unwrap();
    assert!(fails(&["forward", "--model", bad_json.path().to_str().unwrap(), "--ids", "1"]).contains("config.json"));

    let truncated = copy_fixture("qwen3_moe_tiny");
    let st = truncated.path().join("model.safetensors");
    let len = std::fs::metadata(&st).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&st).unwrap().set_len(len / 2).unwrap();
    let err = fails(&["forward", "--model", truncated.path().to_str().unwrap(), "--ids", "1"]);
    assert!(err.contains("model.safetensors") && err.contains("truncated"), "{err}");

    let garbage = copy_fixture("qwen3_moe_tiny");
    std::fs::write(garbage.path().join("model.safetensors"), b"definitely not safetensors").unwrap();
    assert!(fails(&["forward", "--model", garbage.path().to_str().unwrap(), "--ids", "1"]).contains("model.safetensors"));

    let missing_shard = copy_fixture("qwen3_moe_tok");
    std::fs::remove_file(missing_shard.path().join("model-00002-of-00002.safetensors")).unwrap();
    assert!(fails(&["forward", "--model", missing_shard.path().to_str().unwrap(), "--ids", "1"]).contains("model-00002-of-00002"));
}

#[test]
fn missing_tensor_is_named() {
    let dir = copy_fixture("qwen3_moe_tiny");
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let dropped = "model.layers.1.mlp.experts.5.down_proj.weight";
    let kept: Vec<(String, safetensors::tensor::TensorView)> = st.tensors().into_iter().filter(|(n, _)| n != dropped).collect();
    let out = safetensors::serialize(kept, None).unwrap();
    std::fs::write(&path, out).unwrap();
    assert!(fails(&["forward", "--model", dir.path().to_str().unwrap(), "--ids", "1"]).contains(dropped));
}

#[test]
fn help_explains_commands() {
    let out = larder(&["--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("forward") && text.contains("run"));
    let out = larder(&["run", "--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in ["--max-new", "--temperature", "--top-p", "--top-k", "--seed", "--chat", "--json"] {
        assert!(text.contains(flag), "run --help lacks {flag}");
    }
}

#[test]
fn bench_kernels_quick_json_has_the_documented_shape() {
    let v = ok_json(&["bench", "kernels", "--quick", "--no-candle", "--formats", "bf16,fp8", "--json"]);
    assert!(v["ram_gbps"].as_f64().unwrap() > 0.0);
    // The compute roofs: measured on x86-64 with AVX2 and FMA, an empty list elsewhere.
    let roofs = v["compute_roofs"].as_array().unwrap();
    for r in roofs {
        assert!(r["stream"].is_string() && r["ginstr_per_s"].as_f64().unwrap() > 0.0, "{r}");
    }
    let steps = roofs.iter().filter(|r| r["weight_gbps"].as_f64().is_some_and(|g| g > 0.0)).count();
    assert!(steps == 3 || roofs.is_empty(), "{roofs:?}");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2 * 2 * 2); // formats x rows x cold/hot
    for r in results {
        for key in ["dtype", "rows", "k", "n", "threads", "gbps", "ratio_to_ram"] {
            assert!(!r[key].is_null(), "missing {key} in {r}");
        }
        assert!(r.get("candle_gbps").is_some());
    }
    assert!(fails(&["bench", "kernels", "--quick", "--formats", "nope"]).contains("--formats"));
    // candle runs on the same dense weights, cold and hot; not on fp8.
    let v = ok_json(&["bench", "kernels", "--quick", "--formats", "f32,fp8", "--rows", "1", "--json"]);
    for r in v["results"].as_array().unwrap() {
        let dense = r["dtype"] == "f32";
        assert_eq!(r["candle_gbps"].as_f64().is_some_and(|g| g > 0.0), dense, "{r}");
    }
    // --path picks the measured path (scalar exists everywhere); unknown or
    // unavailable paths are errors.
    let v = ok_json(&[
        "bench",
        "kernels",
        "--quick",
        "--no-candle",
        "--formats",
        "f32",
        "--rows",
        "1",
        "--path",
        "scalar",
        "--json",
    ]);
    assert_eq!(v["path"], "scalar");
    assert!(fails(&["bench", "kernels", "--quick", "--path", "nope"]).contains("unknown kernel path"));
}

#[test]
fn speculative_run_flags_give_identical_greedy_ids() {
    let r = reference("qwen3_moe_tiny");
    let m = fixture("qwen3_moe_tiny");
    let m = m.to_str().unwrap();
    let ids = id_list(&r["prompt_ids"]);
    let plain = ok_json(&["run", "--model", m, "--ids", &ids, "--max-new", "24", "--json"]);
    let draft = fixture("mixtral_tiny");
    for extra in [
        vec!["--draft", "ngram"],
        vec!["--draft-model", draft.to_str().unwrap(), "--draft-max", "4"],
    ] {
        let mut args = vec!["run", "--model", m, "--ids", &ids, "--max-new", "24", "--json"];
        args.extend(&extra);
        let v = ok_json(&args);
        assert_eq!(v["ids"], plain["ids"], "{extra:?}");
        assert!(v["stats"]["speculative"]["target_steps"].as_u64().unwrap() >= 1, "{extra:?}");
    }
    let err = fails(&["run", "--model", m, "--ids", &ids, "--draft", "model"]);
    assert!(err.contains("--draft-model"), "{err}");
    let tok = fixture("qwen3_moe_tok");
    let other = fixture("deepseek_v3_tok");
    let err = fails(&[
        "run",
        "--model",
        tok.to_str().unwrap(),
        "--prompt",
        "hi",
        "--draft-model",
        other.to_str().unwrap(),
    ]);
    assert!(err.contains("vocabulary"), "{err}");
}

#[test]
fn run_chat_uses_the_gptoss_harmony_template() {
    // gpt-oss's tokenizer and harmony template over a synthetic checkpoint of
    // gpt-oss's vocabulary size (201,088: every harmony id is in range).
    let r: Value = serde_json::from_str(&std::fs::read_to_string(fixture("tokenizer_gptoss").join("expected.json")).unwrap()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("m");
    let m = model.to_str().unwrap();
    let synth = ["synth", "--preset", "tiny", "--layers", "1", "--vocab", "201088"];
    ok_json(&[&synth[..], &["--measure-tokens", "0", "--out", m, "--json"]].concat());
    for file in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
    ] {
        std::fs::copy(fixture("tokenizer_gptoss").join(file), model.join(file)).unwrap();
    }
    let prompt_tokens = |args: &[&str]| -> Value {
        let v = ok_json(&[&["run", "--model", m, "--max-new", "1", "--json"], args].concat());
        v["stats"]["prompt_tokens"].clone()
    };
    // A few corpus texts (each run loads the 28 MB tokenizer): upper-case
    // contractions, emoji, harmony tokens inside text.
    let corpus = r["corpus"].as_array().unwrap();
    for needle in ["DON'T SHOUT", "emoji:", "<|start|>user"] {
        let case = corpus.iter().find(|c| c["text"].as_str().unwrap().starts_with(needle)).unwrap();
        let text = case["text"].as_str().unwrap();
        assert_eq!(
            prompt_tokens(&["--prompt", text]),
            case["ids"].as_array().unwrap().len(),
            "{text:?}"
        );
    }
    // The template writes today's date; every YYYY-MM-DD is the same number
    // of o200k tokens (digit groups and dashes; checked for 2000-2099), so the
    // counts still match.
    let conv = r["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "system_and_user")
        .unwrap();
    let msgs = conv["messages"].as_array().unwrap();
    let system = msgs[0]["content"].as_str().unwrap();
    let user = msgs[1]["content"].as_str().unwrap();
    let chat = prompt_tokens(&["--chat", "--system", system, "--prompt", user]);
    assert_eq!(chat, conv["ids"].as_array().unwrap().len());
}
