//! Black-box tests of the first five minutes: errors that say each thing
//! once and name the path or flag at fault, a broken chat template that only
//! stops chats, and the one-line run summary.

use std::path::{Path, PathBuf};

mod common;

use common::{fails, larder, ok_json, post, served_address};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The fixture with a tokenizer and chat template these tests use.
fn fixture() -> PathBuf {
    common::fixture("qwen3_moe_tok")
}

/// A copy of the tiny fixture checkpoint in `dir`.
fn copy_fixture(dir: &Path) -> PathBuf {
    let model = dir.join("model");
    std::fs::create_dir_all(&model).unwrap();
    for entry in std::fs::read_dir(fixture()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), model.join(entry.file_name())).unwrap();
    }
    model
}

/// The fixture packed by `larder pack` into `dir/store`.
fn packed_fixture(dir: &Path) -> PathBuf {
    let store = dir.join("store");
    ok_json(&["pack", "--model", s(&fixture()), "--out", s(&store), "--json"]);
    store
}

/// The first phrase of at least 12 characters that appears twice in `text`,
/// both times starting a word (so "unexpected end" does not repeat "expected end").
fn repeated_phrase(text: &str) -> Option<&str> {
    const LEN: usize = 12;
    let word_start = |i: usize| i == 0 || text[..i].ends_with(|c: char| c.is_whitespace() || ":(\"'`".contains(c));
    let starts: Vec<usize> = text.char_indices().map(|(i, _)| i).filter(|&i| word_start(i)).collect();
    for (k, &i) in starts.iter().enumerate() {
        let Some(end) = text[i..].char_indices().nth(LEN).map(|(j, _)| i + j) else {
            break;
        };
        let phrase = &text[i..end];
        if starts[k + 1..].iter().any(|&j| text[j..].starts_with(phrase)) {
            return Some(phrase);
        }
    }
    None
}

fn says_once(err: &str) {
    let line = err.trim_end();
    assert!(!line.is_empty(), "no error message");
    if let Some(p) = repeated_phrase(line) {
        panic!("the error repeats {p:?}: {line}");
    }
}

/// Runs larder expecting a clean failure whose message says each thing once; returns stderr.
fn fails_saying_once(args: &[&str]) -> String {
    let err = fails(args);
    says_once(&err);
    err
}

#[test]
fn repeated_phrase_finds_repeats() {
    assert!(repeated_phrase("x: model folder not found: model folder not found").is_some());
    assert_eq!(repeated_phrase("a: unexpected end of input, expected end of block"), None);
    assert_eq!(repeated_phrase("cannot load model /a/b: not found"), None);
}

#[test]
fn missing_model_folder_is_said_once_with_its_path() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-such-model");
    let err = fails_saying_once(&["run", "--model", s(&missing), "--prompt", "hi"]);
    assert!(err.contains(s(&missing)), "{err}");
    assert!(err.contains("not found"), "{err}");
}

#[test]
fn missing_file_inside_a_store_is_said_once_with_its_path() {
    let tmp = tempfile::tempdir().unwrap();
    let store = packed_fixture(tmp.path());
    let spine = store.join("spine.safetensors");
    assert!(spine.exists(), "the store has no {}", spine.display());
    std::fs::remove_file(&spine).unwrap();
    let err = fails_saying_once(&["run", "--model", s(&store), "--ids", "1,2", "--max-new", "1"]);
    assert!(err.contains("spine.safetensors"), "{err}");
}

#[test]
fn a_bad_flag_is_said_once_with_the_flag() {
    let err = fails(&["run", "--model", s(&fixture()), "--io-depth", "0", "--prompt", "hi"]);
    says_once(err.lines().next().unwrap_or(""));
    assert!(err.contains("--io-depth"), "{err}");
}

/// Replaces the fixture copy's chat template with one that cannot compile.
fn break_template(model: &Path) -> PathBuf {
    let path = model.join("tokenizer_config.json");
    let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["chat_template"] = serde_json::json!("{% for m in messages %}{{ m.content ");
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    path
}

#[test]
fn a_broken_chat_template_only_stops_chats() {
    let tmp = tempfile::tempdir().unwrap();
    let model = copy_fixture(tmp.path());
    let config = break_template(&model);

    let doc = ok_json(&["run", "--model", s(&model), "--prompt", "Hello", "--max-new", "2", "--json"]);
    assert_eq!(doc["stats"]["new_tokens"], 2);

    let err = fails_saying_once(&["run", "--model", s(&model), "--chat", "--prompt", "Hello", "--max-new", "2"]);
    assert!(err.contains(s(&config)), "the error names the template's file: {err}");
    assert!(err.contains("chat template"), "{err}");
}

#[test]
fn a_chat_template_edited_inside_a_store_is_refused_at_load() {
    let tmp = tempfile::tempdir().unwrap();
    let store = packed_fixture(tmp.path());
    break_template(&store);
    let err = fails(&["run", "--model", s(&store), "--prompt", "Hello", "--max-new", "1"]);
    assert!(err.contains("tokenizer_config.json"), "{err}");
}

#[test]
fn run_summary_is_one_line() {
    let model = fixture();
    for extra in [&[][..], &["--ram-budget", "1MiB"][..]] {
        let mut args = vec!["run", "--model", s(&model), "--prompt", "Hello", "--max-new", "3"];
        args.extend_from_slice(extra);
        let out = larder(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("[larder]")).collect();
        assert_eq!(lines.len(), 1, "one summary line: {err}");
        assert!(lines[0].contains("3 new tokens") && lines[0].contains("tok/s"), "{err}");
        let streamed = !extra.is_empty();
        assert_eq!(lines[0].contains("experts streamed via"), streamed, "{err}");
    }
}

/// The `{"progress": task, ...}` lines `args` print on stderr, every update shown.
fn progress_lines(args: &[&str], task: &str) -> Vec<serde_json::Value> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_larder"))
        .args(args)
        .env("LARDER_PROGRESS_SECS", "0")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "larder {args:?}: {err}");
    serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("stdout stays one JSON document");
    err.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["progress"] == task)
        .collect()
}

/// Done only grows, the total never changes once known, and the last line is done == total.
fn counts_to_total(lines: &[serde_json::Value]) -> u64 {
    let last = lines.last().expect("progress lines");
    let total = last["total"].as_u64().unwrap();
    assert!(total > 0, "{last}");
    assert_eq!(last["done"], total, "{last}");
    let mut done = 0;
    for l in lines {
        assert_eq!(l["unit"], "bytes");
        let d = l["done"].as_u64().unwrap();
        assert!(d >= done && d <= total, "{l}");
        assert!(l["total"] == total || d == 0, "{l}");
        done = d;
    }
    total
}

#[test]
fn load_progress_counts_the_bytes_read_to_an_exact_total() {
    let model = fixture();
    let base = ["run", "--model", s(&model), "--ids", "1,2", "--max-new", "1", "--json"];
    let in_ram = counts_to_total(&progress_lines(&base, "load"));
    let mut args = base.to_vec();
    args.extend_from_slice(&["--ram-budget", "1MiB"]);
    let streamed = counts_to_total(&progress_lines(&args, "load"));
    assert!(streamed < in_ram, "streaming reads only the spine at load: {streamed} vs {in_ram}");
}

#[test]
fn pack_and_verify_progress_count_to_their_totals() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let packed = progress_lines(&["pack", "--model", s(&fixture()), "--out", s(&store), "--json"], "pack");
    counts_to_total(&packed);
    let verified = progress_lines(&["verify", s(&store), "--json"], "verify");
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(store.join("manifest.json")).unwrap()).unwrap();
    let spine = manifest["spine"].as_array().unwrap();
    let spine_files: u64 = spine.iter().map(|s| s["size"].as_u64().unwrap()).sum();
    let spine_tensors: u64 = spine
        .iter()
        .flat_map(|s| s["tensors"].as_array().unwrap())
        .map(|t| t["len"].as_u64().unwrap())
        .sum();
    assert!(spine_tensors > 0 && spine_files > spine_tensors);
    // pack writes records and spine tensors; verify checks records and whole spine files.
    let records = counts_to_total(&packed) - spine_tensors;
    assert_eq!(counts_to_total(&verified), records + spine_files);
    let run = ["run", "--model", s(&store), "--ids", "1,2", "--max-new", "1", "--json"];
    counts_to_total(&progress_lines(&run, "load"));
}

/// Starts `larder serve --port 0 ARGS`; returns the child and its stderr lines as they come.
fn spawn_serve(args: &[&str]) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_larder"))
        .args(["serve", "--port", "0"])
        .args(args)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, lines)
}

/// The stderr lines up to and including the first that contains `what` (panics after 60 s).
fn lines_until(lines: &std::sync::mpsc::Receiver<String>, what: &str) -> Vec<String> {
    let mut seen = Vec::new();
    while !seen.last().is_some_and(|l: &String| l.contains(what)) {
        match lines.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(l) => seen.push(l),
            Err(e) => panic!("no stderr line with {what:?} ({e}): {seen:?}"),
        }
    }
    seen
}

#[test]
fn serve_says_when_it_is_ready_and_a_broken_template_only_stops_chats() {
    let tmp = tempfile::tempdir().unwrap();
    let model = copy_fixture(tmp.path());
    break_template(&model);
    let (mut child, lines) = spawn_serve(&["--model", s(&model)]);
    let seen = lines_until(&lines, "ready");
    let ready = seen.last().unwrap().clone();
    let addr = served_address(&ready);
    let completion = post(
        &addr,
        "/v1/completions",
        r#"{"model": "model", "prompt": "Hello", "max_tokens": 2}"#,
    );
    let chat = post(
        &addr,
        "/v1/chat/completions",
        r#"{"model": "model", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}"#,
    );
    let _ = child.kill();
    let _ = child.wait();
    for what in ["`model`", "qwen3_moe", "experts in RAM", "/v1/chat/completions", "/v1/completions"] {
        assert!(ready.contains(what), "the ready line says {what}: {ready}");
    }
    assert!(
        seen.iter().any(|l| l.contains("warning") && l.contains("chat template")),
        "a warning about the template: {seen:?}"
    );
    assert!(completion.starts_with("HTTP/1.1 200"), "{completion}");
    assert!(!chat.starts_with("HTTP/1.1 200"), "{chat}");
}
