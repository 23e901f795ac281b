//! A test hub: a tokio/hyper HTTP server on 127.0.0.1:0 serving a folder in
//! the Hugging Face hub layout (`/api/models/{repo}/revision/{rev}` listing
//! with `blobs=true` fields, `/{repo}/resolve/{rev}/{file}` with Range,
//! ETag, `X-Linked-Etag` / `X-Linked-Size` for `.safetensors` files, an
//! optional bearer token, an optional redirect of LFS files to `/cdn/`),
//! with faults injected per request and a log of what was served.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Frame;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use sha2::{Digest, Sha256};

pub const REPO: &str = "larder-test/qwen3-moe-tiny";
/// The repo's former name: its resolve URLs answer a relative 307 to
/// [`REPO`]'s, as the hub does for renamed repos.
pub const OLD_REPO: &str = "larder-test/old-name";
pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// Which kind of request a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Head,
    Get,
    Api,
}

/// One injected fault, used by the next matching request.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Answer with this status and no body.
    Status(u16),
    /// Send `after` bytes, stall for `pause`, then the rest.
    Slow { after: usize, pause: Duration },
    /// Send `after` bytes, then reset the connection.
    Reset { after: usize },
    /// Send only `len` bytes with an honest Content-Length but a
    /// Content-Range claiming the whole range.
    Short { len: usize },
    /// Change the file (its last byte, and so its ETag) before answering.
    Change,
    /// Flip byte `at` of the body sent (clamped to its last byte), as a
    /// bad link or proxy would: the file, its ETag and sha256 unchanged.
    Flip { at: usize },
}

/// What the server answered, per request.
#[derive(Clone, Debug)]
pub struct Served {
    pub op: Op,
    pub path: String,
    pub range: Option<String>,
    pub status: u16,
    pub body_bytes: usize,
}

pub struct State {
    files: Mutex<BTreeMap<String, (Vec<u8>, u32)>>,
    faults: Mutex<HashMap<(Op, String), VecDeque<Fault>>>,
    pub token: Mutex<Option<String>>,
    pub wrong_sha: Mutex<Vec<String>>,
    pub redirect_lfs: Mutex<bool>,
    pub no_etag: Mutex<bool>,
    pub log: Mutex<Vec<Served>>,
}

pub struct HubServer {
    pub url: String,
    pub state: Arc<State>,
    _runtime: tokio::runtime::Runtime,
}

impl HubServer {
    /// Serves every file of `dir` (not recursive).
    pub fn start(dir: &Path) -> HubServer {
        let mut files = BTreeMap::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            if e.metadata().unwrap().is_file() {
                files.insert(e.file_name().to_string_lossy().into_owned(), (std::fs::read(e.path()).unwrap(), 0));
            }
        }
        let state = Arc::new(State {
            files: Mutex::new(files),
            faults: Mutex::new(HashMap::new()),
            token: Mutex::new(None),
            wrong_sha: Mutex::new(Vec::new()),
            redirect_lfs: Mutex::new(false),
            no_etag: Mutex::new(false),
            log: Mutex::new(Vec::new()),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))))
            .unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let st = state.clone();
        runtime.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let st = st.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| handle(st.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        HubServer {
            url,
            state,
            _runtime: runtime,
        }
    }

    pub fn fault(&self, op: Op, file: &str, fault: Fault) {
        self.state
            .faults
            .lock()
            .unwrap()
            .entry((op, file.to_string()))
            .or_default()
            .push_back(fault);
    }

    pub fn file(&self, name: &str) -> Vec<u8> {
        self.state.files.lock().unwrap()[name].0.clone()
    }

    pub fn sha256(&self, name: &str) -> String {
        hex(&Sha256::digest(self.file(name)))
    }

    pub fn log(&self) -> Vec<Served> {
        self.state.log.lock().unwrap().clone()
    }

    /// Body bytes the server sent for data GETs of `file`.
    pub fn sent(&self, file: &str) -> usize {
        self.log()
            .iter()
            .filter(|s| s.op == Op::Get && s.path.ends_with(&format!("/{file}")))
            .map(|s| s.body_bytes)
            .sum()
    }

    pub fn clear_log(&self) {
        self.state.log.lock().unwrap().clear();
    }
}

/// The checkpoint the test hub serves by default.
pub fn fixture() -> std::path::PathBuf {
    crate::fixture("qwen3_moe_tiny")
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

type Body = BoxBody<Bytes, std::io::Error>;

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

fn reply(status: u16, headers: &[(&str, String)], body: Body) -> Response<Body> {
    let mut r = Response::builder().status(StatusCode::from_u16(status).unwrap());
    for (k, v) in headers {
        r = r.header(*k, v);
    }
    r.body(body).unwrap()
}

fn error(status: u16, code: &str) -> Response<Body> {
    reply(status, &[("X-Error-Code", code.to_string())], full(code.to_string()))
}

async fn handle(st: Arc<State>, req: Request<hyper::body::Incoming>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let range = req.headers().get("range").and_then(|v| v.to_str().ok()).map(str::to_string);
    let (resp, op, sent) = route(&st, &req, &path).await;
    st.log.lock().unwrap().push(Served {
        op,
        path,
        range,
        status: resp.status().as_u16(),
        body_bytes: sent,
    });
    Ok(resp)
}

/// Checks the token; `None` when the request may proceed.
fn auth(st: &State, req: &Request<hyper::body::Incoming>) -> Option<Response<Body>> {
    let want = st.token.lock().unwrap().clone()?;
    let got = req.headers().get("authorization").and_then(|v| v.to_str().ok());
    match got {
        None => Some(error(401, "RepoNotFound")),
        Some(g) if g == format!("Bearer {want}") => None,
        Some(_) => Some(error(403, "Forbidden")),
    }
}

async fn route(st: &Arc<State>, req: &Request<hyper::body::Incoming>, path: &str) -> (Response<Body>, Op, usize) {
    let op = if path.starts_with("/api/") {
        Op::Api
    } else if req.method() == hyper::Method::HEAD {
        Op::Head
    } else {
        Op::Get
    };
    if let Some(cdn) = path.strip_prefix("/cdn/") {
        return serve_file(st, req, cdn, true).await;
    }
    if let Some(r) = auth(st, req) {
        return (r, op, 0);
    }
    let api_prefix = format!("/api/models/{REPO}/revision/");
    let resolve_prefix = format!("/{REPO}/resolve/");
    if let Some(rev) = path.strip_prefix(&api_prefix) {
        if let Some(Fault::Status(s)) = take_fault(st, Op::Api, "") {
            return (error(s, "Injected"), op, 0);
        }
        if rev != "main" && rev != COMMIT {
            return (error(404, "RevisionNotFound"), op, 0);
        }
        return (full_json(listing(st)), op, 0);
    }
    if path.starts_with("/api/models/") {
        return (error(404, "RepoNotFound"), op, 0);
    }
    if let Some(rest) = path.strip_prefix(&format!("/{OLD_REPO}/")) {
        let location = format!("/{REPO}/{rest}");
        return (reply(307, &[("Location", location)], full("")), op, 0);
    }
    let Some(rest) = path.strip_prefix(&resolve_prefix) else {
        return (error(404, "RepoNotFound"), op, 0);
    };
    let Some((rev, file)) = rest.split_once('/') else {
        return (error(404, "EntryNotFound"), op, 0);
    };
    if rev != "main" && rev != COMMIT {
        return (error(404, "RevisionNotFound"), op, 0);
    }
    serve_file(st, req, file, false).await
}

fn full_json(v: serde_json::Value) -> Response<Body> {
    reply(200, &[("Content-Type", "application/json".into())], full(v.to_string()))
}

fn listing(st: &State) -> serde_json::Value {
    let files = st.files.lock().unwrap();
    let siblings: Vec<_> = files
        .iter()
        .map(|(name, (bytes, _))| {
            let mut s = serde_json::json!({"rfilename": name, "size": bytes.len(), "blobId": "0"});
            if name.ends_with(".safetensors") {
                s["lfs"] = serde_json::json!({"sha256": hex(&Sha256::digest(bytes)), "size": bytes.len(), "pointerSize": 134});
            }
            s
        })
        .collect();
    serde_json::json!({"id": REPO, "sha": COMMIT, "siblings": siblings})
}

fn take_fault(st: &State, op: Op, file: &str) -> Option<Fault> {
    st.faults.lock().unwrap().get_mut(&(op, file.to_string()))?.pop_front()
}

/// `bytes=a-b` or `bytes=a-` against `size`: Ok(Some((a, b))), Ok(None)
/// without a Range header, Err(()) when not satisfiable.
fn parse_range(v: Option<&str>, size: usize) -> Result<Option<(usize, usize)>, ()> {
    let Some(v) = v else { return Ok(None) };
    let spec = v.strip_prefix("bytes=").ok_or(())?;
    let (a, b) = spec.split_once('-').ok_or(())?;
    let a: usize = a.parse().map_err(|_| ())?;
    let b: usize = if b.is_empty() {
        size.saturating_sub(1)
    } else {
        b.parse().map_err(|_| ())?
    };
    if a >= size || b < a {
        return Err(());
    }
    Ok(Some((a, b.min(size - 1))))
}

async fn serve_file(st: &Arc<State>, req: &Request<hyper::body::Incoming>, file: &str, cdn: bool) -> (Response<Body>, Op, usize) {
    let head = req.method() == hyper::Method::HEAD;
    let op = if head { Op::Head } else { Op::Get };
    // With the CDN redirect on, faults belong to the request serving the
    // bytes (the CDN one), not to the redirect.
    let redirects = !cdn && file.ends_with(".safetensors") && *st.redirect_lfs.lock().unwrap();
    let fault = if redirects { None } else { take_fault(st, op, file) };
    if let Some(Fault::Status(s)) = fault {
        return (error(s, "Injected"), op, 0);
    }
    if let Some(Fault::Change) = fault {
        if let Some((bytes, version)) = st.files.lock().unwrap().get_mut(file) {
            let last = bytes.len() - 1;
            bytes[last] ^= 0xff;
            *version += 1;
        }
    }
    let Some((bytes, version)) = st.files.lock().unwrap().get(file).cloned() else {
        return (error(404, "EntryNotFound"), op, 0);
    };
    let sha = hex(&Sha256::digest(&bytes));
    let lfs = file.ends_with(".safetensors");
    let etag = if cdn {
        format!("\"cdn-{version}-{}\"", &sha[..16])
    } else {
        format!("\"{}-{version}\"", &sha[..16])
    };
    let mut headers = vec![("X-Repo-Commit", COMMIT.to_string())];
    if !*st.no_etag.lock().unwrap() {
        headers.push(("ETag", etag.clone()));
    }
    if lfs && !cdn {
        let linked = if st.wrong_sha.lock().unwrap().iter().any(|f| f == file) {
            "f".repeat(64)
        } else {
            sha.clone()
        };
        headers.push(("X-Linked-Etag", format!("\"{linked}\"")));
        headers.push(("X-Linked-Size", bytes.len().to_string()));
        if *st.redirect_lfs.lock().unwrap() {
            headers.push(("Location", format!("/cdn/{file}")));
            return (reply(302, &headers, full("")), op, 0);
        }
    }
    let if_range = req.headers().get("if-range").and_then(|v| v.to_str().ok());
    let range_header = req.headers().get("range").and_then(|v| v.to_str().ok());
    let range = match parse_range(range_header, bytes.len()) {
        Ok(r) if if_range.is_none_or(|t| t == etag) => r,
        Ok(_) => None,
        Err(()) => {
            headers.push(("Content-Range", format!("bytes */{}", bytes.len())));
            return (reply(416, &headers, full("")), op, 0);
        }
    };
    let (status, start, end) = match range {
        Some((a, b)) => {
            headers.push(("Content-Range", format!("bytes {a}-{b}/{}", bytes.len())));
            (206, a, b + 1)
        }
        None => (200, 0, bytes.len()),
    };
    headers.push(("Accept-Ranges", "bytes".into()));
    let body = Bytes::from(bytes[start..end].to_vec());
    if head {
        headers.push(("Content-Length", bytes.len().to_string()));
        return (reply(200, &headers, full("")), op, 0);
    }
    body_with_fault(status, headers, body, fault, op)
}

fn body_with_fault(
    status: u16,
    mut headers: Vec<(&'static str, String)>,
    body: Bytes,
    fault: Option<Fault>,
    op: Op,
) -> (Response<Body>, Op, usize) {
    let len = body.len();
    match fault {
        Some(Fault::Flip { at }) if len > 0 => {
            let mut bad = body.to_vec();
            bad[at.min(len - 1)] ^= 0x01;
            (reply(status, &headers, full(bad)), op, len)
        }
        Some(Fault::Short { len: short }) => {
            let short = short.min(len);
            (reply(status, &headers, full(body.slice(..short))), op, short)
        }
        Some(Fault::Slow { after, pause }) => {
            let after = after.min(len);
            headers.push(("Content-Length", len.to_string()));
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(2);
            let head = body.slice(..after);
            let tail = body.slice(after..);
            tokio::spawn(async move {
                let _ = tx.send(Ok(Frame::data(head))).await;
                tokio::time::sleep(pause).await;
                let _ = tx.send(Ok(Frame::data(tail))).await;
            });
            let stream = tokio_stream(rx);
            (reply(status, &headers, stream), op, len)
        }
        Some(Fault::Reset { after }) => {
            let after = after.min(len);
            headers.push(("Content-Length", len.to_string()));
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(2);
            let head = body.slice(..after);
            tokio::spawn(async move {
                let _ = tx.send(Ok(Frame::data(head))).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
                let _ = tx.send(Err(std::io::Error::other("injected reset"))).await;
            });
            (reply(status, &headers, tokio_stream(rx)), op, after)
        }
        _ => (reply(status, &headers, full(body)), op, len),
    }
}

/// A body fed by a channel.
fn tokio_stream(mut rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>) -> Body {
    futures_lite_stream(move |cx| rx.poll_recv(cx)).boxed()
}

/// A `Stream` from a poll function (no futures crate needed).
fn futures_lite_stream<T, F>(f: F) -> PollStream<F>
where
    F: FnMut(&mut std::task::Context<'_>) -> std::task::Poll<Option<T>>,
{
    PollStream(f)
}

pub struct PollStream<F>(F);

impl<F> hyper::body::Body for PollStream<F>
where
    F: FnMut(&mut std::task::Context<'_>) -> std::task::Poll<Option<Result<Frame<Bytes>, std::io::Error>>> + Unpin,
{
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        (self.0)(cx)
    }
}
