//! Black-box tests of the server's fail-closed behaviour (issue 17), each on
//! the real server on a random loopback port: sampling defaults from
//! generation_config.json and fresh seeds, 413 before the body is read,
//! HEAD/OPTIONS/CORS, `GET /v1/models/{id}`, "loading" before the engine is
//! attached, errors without server paths (5xx logged in full), and the
//! graceful shutdown that ends running streams with an error event, a
//! stream whose generation fails midway ending with an error event and
//! `[DONE]`, and a lazy source that is down answered 503 with Retry-After.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use larder_engine::Engine;
use larder_model::{load_mlp, Mlp};
use larder_model::{ExpertProvider, ModelError, RandomSource, WeightView};
use larder_serve::{bind, start, RunningServer, ServerConfig};
use serde_json::{json, Value};

mod common;
use common::*;

fn serve(model: &Path, config: ServerConfig) -> RunningServer {
    serve_engine(Engine::load(model).unwrap(), config)
}

/// `engine` on a loopback port as model "tiny", with `config`'s other settings.
fn serve_engine(engine: Engine, config: ServerConfig) -> RunningServer {
    start(
        engine,
        ServerConfig {
            port: 0,
            served_name: "tiny".into(),
            ..config
        },
    )
    .unwrap()
}

/// The text of a 16-token completion with `extra` request fields.
fn ids_of(a: std::net::SocketAddr, extra: Value) -> String {
    let mut body = json!({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 16, "ignore_eos": true});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let r = post(a, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["choices"][0]["text"].as_str().unwrap().to_string()
}

#[test]
fn sampling_defaults_follow_generation_config_and_unseeded_requests_vary() {
    // A copy of the tokenizer fixture whose generation_config.json asks for hot sampling.
    let hot = fixture_copy("qwen3_moe_tok", "hot");
    let path = hot.join("generation_config.json");
    let mut g: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    g["do_sample"] = json!(false); // vLLM does not consult do_sample
    g["temperature"] = json!(1.8);
    g["top_p"] = json!(1.0);
    std::fs::write(&path, g.to_string()).unwrap();
    let hot_srv = serve(&hot, ServerConfig::default());
    let plain_srv = serve(&fixture("qwen3_moe_tok"), ServerConfig::default());
    let (h, p) = (hot_srv.addr, plain_srv.addr);

    // No sampling in generation_config.json: an omitted temperature is OpenAI's 1.0.
    let greedy = ids_of(p, json!({"temperature": 0}));
    assert_eq!(ids_of(p, json!({"seed": 3})), ids_of(p, json!({"seed": 3, "temperature": 1.0})));
    // The file's temperature: an omitted temperature is the file's.
    let by_default = ids_of(h, json!({"seed": 7}));
    assert_eq!(by_default, ids_of(h, json!({"seed": 7, "temperature": 1.8})));
    assert_ne!(by_default, greedy, "the file's temperature was not applied");
    // The request's own fields still override.
    assert_eq!(ids_of(h, json!({"temperature": 0})), greedy);
    // Seeded requests stay reproducible; unseeded ones draw fresh seeds.
    assert_eq!(ids_of(h, json!({"seed": 7})), by_default);
    let unseeded: Vec<String> = (0..4).map(|_| ids_of(h, json!({}))).collect();
    assert!(
        unseeded.iter().any(|t| t != &unseeded[0]),
        "every unseeded request sampled the same text: {unseeded:?}"
    );
    let _ = std::fs::remove_dir_all(&hot);
}

#[test]
fn over_size_bodies_get_413_before_the_body_is_read() {
    let srv = serve(
        &fixture("qwen3_moe_tiny"),
        ServerConfig {
            max_request_bytes: 4096,
            ..ServerConfig::default()
        },
    );
    // A huge Content-Length and only a few bytes: the reply comes at once.
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100000000\r\n\r\n{\"mo")
        .unwrap();
    let mut raw = Vec::new();
    let t = Instant::now();
    let _ = s.read_to_end(&mut raw);
    let reply = parse_reply(&String::from_utf8_lossy(&raw));
    assert_eq!(reply.status, 413, "{:?} after {:?}", String::from_utf8_lossy(&raw), t.elapsed());
    assert_eq!(reply.json()["error"]["code"], "request_too_large");
    assert!(t.elapsed() < Duration::from_secs(3), "413 waited for the body");
    // A chunked body is capped while it is read.
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let chunk = "x".repeat(3000);
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n{:x}\r\n{chunk}\r\n",
        chunk.len(),
        chunk.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    assert_eq!(parse_reply(&String::from_utf8_lossy(&raw)).status, 413);
}

#[test]
fn head_options_and_opt_in_cors() {
    let plain = serve(&fixture("qwen3_moe_tiny"), ServerConfig::default());
    let a = plain.addr;
    for path in ["/health", "/metrics", "/v1/models", "/v1/models/tiny"] {
        let r = send(a, "HEAD", path, &[], "");
        assert_eq!(r.status, 200, "HEAD {path}: {}", r.headers);
        assert!(r.body.is_empty(), "HEAD {path} sent a body");
        let r = send(a, "OPTIONS", path, &[], "");
        assert_eq!(r.status, 204, "OPTIONS {path}");
        assert_eq!(r.header("allow").as_deref(), Some("GET, HEAD, OPTIONS"));
    }
    let r = send(a, "OPTIONS", "/v1/chat/completions", &[("origin", "http://app.example")], "");
    assert_eq!((r.status, r.header("allow").as_deref()), (204, Some("POST, OPTIONS")));
    assert_eq!(r.header("access-control-allow-origin"), None, "CORS is off by default");
    let r = send(a, "HEAD", "/v1/completions", &[], "");
    assert_eq!((r.status, r.header("allow").as_deref()), (405, Some("POST, OPTIONS")));

    let cors = serve(
        &fixture("qwen3_moe_tiny"),
        ServerConfig {
            cors_origins: vec!["http://app.example".into()],
            api_key: Some("k".into()),
            ..ServerConfig::default()
        },
    );
    let a = cors.addr;
    let preflight = [
        ("origin", "http://app.example"),
        ("access-control-request-method", "POST"),
        ("access-control-request-headers", "authorization, content-type"),
    ];
    // The preflight carries no API key and still succeeds.
    let r = send(a, "OPTIONS", "/v1/chat/completions", &preflight, "");
    assert_eq!(r.status, 204, "{}", r.headers);
    assert_eq!(r.header("access-control-allow-origin").as_deref(), Some("http://app.example"));
    assert_eq!(r.header("access-control-allow-methods").as_deref(), Some("POST, OPTIONS"));
    assert!(r.header("access-control-allow-headers").unwrap().contains("authorization"));
    let auth = [("origin", "http://app.example"), ("authorization", "Bearer k")];
    let r = send(a, "GET", "/v1/models", &auth, "");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin").as_deref(), Some("http://app.example"));
    let r = send(
        a,
        "GET",
        "/v1/models",
        &[("origin", "http://evil.example"), ("authorization", "Bearer k")],
        "",
    );
    assert_eq!(r.header("access-control-allow-origin"), None, "an unlisted origin got CORS");
}

#[test]
fn models_by_id() {
    let srv = serve(&fixture("qwen3_moe_tiny"), ServerConfig::default());
    let r = send(srv.addr, "GET", "/v1/models/tiny", &[], "");
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!((v["id"].as_str(), v["object"].as_str()), (Some("tiny"), Some("model")));
    let r = send(srv.addr, "GET", "/v1/models/gpt-4", &[], "");
    assert_eq!(r.status, 404);
    let e = &r.json()["error"];
    assert_eq!(
        (e["code"].as_str(), e["param"].as_str()),
        (Some("model_not_found"), Some("model")),
        "{e}"
    );
    assert!(e["message"].as_str().unwrap().contains("gpt-4"));
}

#[test]
fn health_says_loading_until_the_engine_is_attached() {
    let srv = bind(ServerConfig {
        port: 0,
        served_name: "tiny".into(),
        ..ServerConfig::default()
    })
    .unwrap();
    let a = srv.addr;
    let r = send(a, "GET", "/health", &[], "");
    assert_eq!((r.status, r.json()), (503, json!({"status": "loading"})));
    let r = post(a, "/v1/completions", &json!({"model": "tiny", "prompt": [1], "max_tokens": 1}));
    assert_eq!(r.status, 503);
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("loading"), "{}", r.body);
    assert_eq!(send(a, "GET", "/v1/models", &[], "").status, 503);
    assert!(!srv.is_loaded());
    srv.attach(Engine::load(&fixture("qwen3_moe_tiny")).unwrap());
    assert_eq!(send(a, "GET", "/health", &[], "").json(), json!({"status": "ok"}));
    let r = post(a, "/v1/completions", &json!({"model": "tiny", "prompt": [1], "max_tokens": 1}));
    assert_eq!(r.status, 200, "{}", r.body);
}

/// Everything the server logs, for the tests that check what it logged.
static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        LOG.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An expert provider whose storage has failed, naming a server path.
struct BrokenExperts;

const SECRET: &str = "/srv/secret-larder-store/drive-0/layer-000.experts";

impl ExpertProvider for BrokenExperts {
    fn with_experts(
        &self,
        _layer: usize,
        _ids: &[usize],
        _run: &mut dyn FnMut(usize, &Mlp) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        Err(ModelError::Io {
            path: SECRET.into(),
            source: std::io::Error::other("input/output error"),
        })
    }
}

#[test]
fn errors_name_no_server_paths_and_5xx_are_logged_in_full() {
    let _ = tracing_subscriber::fmt()
        .with_writer(|| Capture)
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .try_init();
    let dir = fixture("qwen3_moe_tiny");
    // No tokenizer: a text prompt is refused without the model's path.
    let srv = serve(&dir, ServerConfig::default());
    let r = post(
        srv.addr,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": "hi", "max_tokens": 1}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    let dir_text = std::fs::canonicalize(&dir).unwrap().display().to_string();
    assert!(!r.body.contains("fixtures") && !r.body.contains(&dir_text), "{}", r.body);
    // A store error while generating: 500 with no path, logged in full.
    let engine = Engine::load_with_experts(&dir, Some(Arc::new(BrokenExperts))).unwrap();
    let broken = serve_engine(engine, ServerConfig::default());
    for stream in [false, true] {
        let r = post(
            broken.addr,
            "/v1/completions",
            &json!({"model": "tiny", "prompt": [5, 6], "max_tokens": 2, "stream": stream}),
        );
        assert!(
            !r.body.contains("secret-larder-store"),
            "a server path reached the client: {}",
            r.body
        );
        assert!(r.body.contains("server log"), "{}", r.body);
        if !stream {
            assert_eq!(r.status, 500);
        }
    }
    let log = String::from_utf8_lossy(&LOG.lock().unwrap()).into_owned();
    assert!(
        log.contains("ERROR") && log.contains(SECRET),
        "the 5xx was not logged in full: {log}"
    );
}

/// Starts a streaming completion of `max_tokens` and waits for its first
/// bytes; the thread returns the whole reply.
fn streaming(a: std::net::SocketAddr, max_tokens: usize) -> std::thread::JoinHandle<Reply> {
    let body = json!({"model": "tiny", "prompt": [5, 6, 7], "max_tokens": max_tokens, "ignore_eos": true, "stream": true}).to_string();
    let mut s = TcpStream::connect(a).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 64];
    s.read_exact(&mut first).unwrap(); // generation is running
    std::thread::spawn(move || {
        let mut all = first.to_vec();
        let _ = s.read_to_end(&mut all);
        parse_reply(&String::from_utf8_lossy(&all))
    })
}

#[test]
fn shutdown_lets_requests_finish_then_ends_streams_with_an_error_event() {
    let model = long_model("shutdown");
    // Within the grace period a running stream finishes normally.
    let srv = serve(&model, ServerConfig::default());
    let reader = streaming(srv.addr, 40);
    srv.shutdown(Duration::from_secs(20));
    let ev = events(&reader.join().unwrap().body);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
    let last: Value = serde_json::from_str(&ev[ev.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length", "{last}");
    // Past it, the stream ends with an error event and [DONE].
    let srv = serve(&model, ServerConfig::default());
    let a = srv.addr;
    let reader = streaming(a, 8000);
    let t = Instant::now();
    srv.shutdown(Duration::from_millis(500));
    assert!(t.elapsed() < Duration::from_secs(10), "shutdown took {:?}", t.elapsed());
    let reply = reader.join().unwrap();
    let ev = events(&reply.body);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"), "{}", reply.body);
    let err: Value = serde_json::from_str(&ev[ev.len() - 2]).unwrap();
    assert_eq!(err["error"]["code"], "server_shutdown", "{err}");
    assert!(TcpStream::connect(a).is_err(), "still accepting after shutdown");
    let _ = std::fs::remove_dir_all(&model);
}

/// Experts that work (random weights of the fixture's shapes) for the
/// first `calls` layer steps, then fail as a drive would, naming a path.
struct FailingLater {
    calls: AtomicUsize,
    ok_calls: usize,
    weights: RandomSource,
}

impl ExpertProvider for FailingLater {
    fn with_experts(
        &self,
        layer: usize,
        ids: &[usize],
        run: &mut dyn FnMut(usize, &Mlp) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) >= self.ok_calls {
            return Err(ModelError::Io {
                path: SECRET.into(),
                source: std::io::Error::other("input/output error"),
            });
        }
        for (i, &e) in ids.iter().enumerate() {
            // qwen3_moe_tiny: hidden 64, moe_intermediate 32.
            let at = WeightView::new(&self.weights).pp(format!("l{layer}.e{e}"));
            let mlp = load_mlp(&at, ["gate", "up", "down"], 64, 32)?;
            run(i, &mlp)?;
        }
        Ok(())
    }
}

#[test]
fn a_stream_that_fails_midway_ends_with_an_error_event_then_done() {
    // 3 MoE layers: the prompt's pass and 3 decode steps work, the 5th pass fails.
    let experts = FailingLater {
        calls: AtomicUsize::new(0),
        ok_calls: 3 * 4,
        weights: RandomSource::new(7, 0.1),
    };
    let engine = Engine::load_with_experts(&fixture("qwen3_moe_tiny"), Some(Arc::new(experts))).unwrap();
    let srv = serve_engine(engine, ServerConfig::default());
    let body = json!({"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 40, "ignore_eos": true, "stream": true}).to_string();
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    assert!(raw.ends_with("0\r\n\r\n"), "the chunked body did not end cleanly: {raw:?}");
    let reply = parse_reply(&raw);
    assert_eq!(reply.status, 200, "{raw}");
    // One frame per token (text, or a keep-alive comment for a token without text).
    let frames: Vec<&str> = reply.body.split("\n\n").filter(|f| !f.is_empty()).collect();
    let tokens = frames.iter().take_while(|f| !f.contains("\"error\"")).count();
    assert_eq!(tokens, 4, "the tokens before the failure: {frames:?}");
    let ev = events(&reply.body);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"), "{}", reply.body);
    let error: Value = serde_json::from_str(&ev[ev.len() - 2]).unwrap();
    assert_eq!(error["error"]["type"], "server_error", "{error}");
    assert!(error["error"]["message"].as_str().unwrap().contains("server log"), "{error}");
    assert!(
        !reply.body.contains("secret-larder-store"),
        "a server path reached the client: {}",
        reply.body
    );
}

/// Experts a lazy cache cannot fetch: its source is down.
struct SourceDown;

impl ExpertProvider for SourceDown {
    fn with_experts(
        &self,
        layer: usize,
        ids: &[usize],
        _run: &mut dyn FnMut(usize, &Mlp) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        Err(ModelError::Provider(Box::new(larder_store::StoreError::SourceUnavailable {
            message: format!(
                "layer {layer} expert {}: not in the lazy cache yet, and the source is unreachable",
                ids[0]
            ),
            retry_after_s: 17,
        })))
    }
}

#[test]
fn a_request_needing_an_expert_from_a_source_that_is_down_gets_503_with_retry_after() {
    let dir = fixture("qwen3_moe_tiny");
    let engine = Engine::load_with_experts(&dir, Some(Arc::new(SourceDown))).unwrap();
    let srv = serve_engine(engine, ServerConfig::default());
    let r = post(
        srv.addr,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": [5, 6], "max_tokens": 2}),
    );
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.header("retry-after").as_deref(), Some("17"), "{}", r.headers);
    assert_eq!(r.json()["error"]["code"], "source_unavailable", "{}", r.body);
    // Streamed: the error event carries the same code, then [DONE].
    let r = post(
        srv.addr,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": [5, 6], "max_tokens": 2, "stream": true}),
    );
    assert!(r.body.contains("source_unavailable") && r.body.contains("[DONE]"), "{}", r.body);
}
