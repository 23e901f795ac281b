//! larder-serve: an OpenAI-compatible HTTP server over the engine
//! (`GET /v1/models`, `GET /v1/models/{id}`, `POST /v1/chat/completions`,
//! `POST /v1/completions`, `POST /v1/responses`, `GET /v1/responses/{id}`,
//! `GET /health`, `GET /metrics`), which also speaks Anthropic's Messages
//! API (`POST /v1/messages`, `POST /v1/messages/count_tokens`).
//!
//! - [`api`] validates requests into generation jobs ([`chat_messages`]
//!   parses a chat's messages, [`tools`] its tools and the answer's tool
//!   calls and reasoning; [`fields`] reads scalar fields, for the agent
//!   APIs too); [`error`] shapes errors;
//! - [`messages`] (Anthropic Messages) and [`responses`] (OpenAI
//!   Responses, with its conversation store) parse their bodies into the
//!   same jobs and shape their answers; [`agent`] is what they share (the
//!   internal conversation, tools and tool calls, the stream driver);
//! - [`prepare`] renders, tokenizes and checks prompts off the engine
//!   thread (a bounded pool, small prompts in a lane of their own), so a
//!   large prompt never stalls the requests already running;
//! - [`worker`] maps prepared requests to jobs of larder-engine's
//!   [`EngineHandle`](larder_engine::EngineHandle) (the engine thread: up
//!   to `max_batch` requests decoding together, drafting or not, the KV
//!   budget, prefix reuse, the route trace) and their events back (a
//!   request with `n` choices as `n` jobs, their events merged), behind a
//!   queue of bounded depth (429 beyond it); a client that leaves cancels
//!   its jobs;
//! - [`logprobs`] spells generated tokens' logprobs in OpenAI's chat and
//!   completions shapes;
//! - [`http`] is the hyper 1 service: routing, API key, body limits and
//!   timeouts, JSON and server-sent-event responses; [`cors`] its opt-in
//!   CORS headers;
//! - [`defaults`]: the size values `larder serve`'s flags accept, the
//!   default KV budget and served model id.
//!
//! This file owns the server's life: it binds (and `/health` answers
//! "loading") before the engine is attached, and it shuts down gracefully:
//! stop accepting, let running requests finish within a grace period, then
//! end the streams still running with an error event and `[DONE]`.

pub mod agent;
pub mod api;
pub mod chat_messages;
pub mod cors;
pub mod defaults;
pub mod error;
pub mod exchange;
pub mod fields;
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod logprobs;
pub mod messages;
pub mod prepare;
pub mod response_store;
pub mod responses;
pub mod state;
pub mod tools;
pub mod worker;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use larder_engine::{Drafting, Engine, HandleConfig, SchedulerConfig, TraceConfig};
use tokio::sync::watch;

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    /// The model id clients must ask for.
    pub served_name: String,
    /// Require `Authorization: Bearer <key>` on /v1 endpoints (the scheme in
    /// any case). An empty key is refused at start.
    pub api_key: Option<String>,
    /// Requests queued or running before 429.
    pub queue_depth: usize,
    pub max_request_bytes: usize,
    /// Time allowed for a request body to arrive.
    pub body_timeout: Duration,
    /// Time allowed for a request's headers to arrive (slow clients are closed).
    pub header_timeout: Duration,
    /// On shutdown, how long running requests may take to finish before
    /// their streams are ended with an error event.
    pub shutdown_grace: Duration,
    /// Origins allowed by CORS (`*` for any); empty: no CORS headers.
    pub cors_origins: Vec<String>,
    /// Most requests decoding together (without a drafter).
    pub max_batch: usize,
    /// Bytes of sequence state (KV) all requests may hold together; a
    /// request whose worst case cannot fit is refused (`None`: unbounded).
    pub kv_budget: Option<usize>,
    /// The prefix cache's disk tier (`--state-dir`, `--state-quota`): finished
    /// conversations kept on disk across restarts (`None`: RAM only).
    pub state_dir: Option<larder_engine::DiskTierConfig>,
    /// Record every forward pass's routes into a trace file (`--trace`; `None`: no recording).
    pub trace: Option<TraceConfig>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8000,
            served_name: "larder".into(),
            api_key: None,
            queue_depth: 16,
            max_request_bytes: 1 << 20,
            body_timeout: Duration::from_secs(30),
            header_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(30),
            cors_origins: Vec::new(),
            max_batch: 8,
            kv_budget: None,
            state_dir: None,
            trace: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot install the SIGINT/SIGTERM handlers: {0}")]
    Signal(std::io::Error),
    /// The model failed to load (the loader's message, in full).
    #[error("{0}")]
    Load(String),
    /// An API key no client can send (see [`ServerConfig::check_api_key`]).
    #[error("the API key {0}")]
    ApiKey(&'static str),
}

impl ServerConfig {
    /// Refuses an API key that no client can send: an empty one (almost
    /// always an environment variable that is set but empty) or one with
    /// whitespace around it (a key read from a file with its newline; the
    /// server trims what clients send). Without a key the server is open,
    /// so an empty key is a mistake to say, not to guess about.
    pub fn check_api_key(&self) -> Result<(), ServeError> {
        match self.api_key.as_deref() {
            Some(key) if key.trim().is_empty() => Err(ServeError::ApiKey(
                "is empty (an environment variable set to nothing?): give a key, or leave it out to serve without one",
            )),
            Some(key) if key.trim() != key => Err(ServeError::ApiKey(
                "starts or ends with whitespace (read from a file with its newline?): clients cannot send it; remove it",
            )),
            _ => Ok(()),
        }
    }
}

/// The warning for a server that other machines can reach without an API
/// key (`None` when it listens on loopback only, or has a key).
pub fn exposure_warning(addr: SocketAddr, has_api_key: bool) -> Option<String> {
    let ip = addr.ip().to_canonical();
    if has_api_key || ip.is_loopback() {
        return None;
    }
    let interfaces = if ip.is_unspecified() {
        "every network interface"
    } else {
        "a network interface"
    };
    Some(format!(
        "[larder] warning: listening on {addr} ({interfaces}) without an API key: anyone who can reach this machine \
         can use the model; set --api-key KEY (or LARDER_API_KEY), or listen on 127.0.0.1"
    ))
}

/// How long streams ended at the close of the grace period get to flush.
const FLUSH: Duration = Duration::from_secs(3);

/// A loaded engine and the drafter every request decodes speculatively with
/// (resolved by [`Engine::drafting`]; an [`Engine`] alone drafts nothing).
pub struct Loaded {
    pub engine: Engine,
    pub drafting: Drafting,
}

impl From<Engine> for Loaded {
    fn from(engine: Engine) -> Self {
        Loaded {
            engine,
            drafting: Drafting::off(),
        }
    }
}

/// A running server (for embedding and tests): its address, and a way to stop it.
pub struct RunningServer {
    pub addr: SocketAddr,
    state: Arc<http::State>,
    handle: tokio::runtime::Handle,
    /// Sends the grace period: stop accepting and drain.
    stop: watch::Sender<Option<Duration>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RunningServer {
    /// Hands the loaded engine (and the drafter every request drafts with:
    /// [`Loaded`]) to the server: `/health` turns 200 and the API answers.
    /// A second engine is ignored; an engine thread that cannot start is
    /// logged and the server keeps answering 503.
    pub fn attach(&self, loaded: impl Into<Loaded>) {
        let Loaded { engine, drafting } = loaded.into();
        let c = &self.state.config;
        let config = worker::WorkerConfig {
            depth: c.queue_depth,
            drafting,
            handle: HandleConfig {
                scheduler: SchedulerConfig {
                    max_batch: c.max_batch.max(1),
                    kv_budget: c.kv_budget,
                    ..SchedulerConfig::default()
                },
                disk_tier: c.state_dir.clone(),
                trace: c.trace.clone(),
            },
        };
        match worker::Worker::start(engine, config) {
            Ok(w) => {
                let _ = self.state.worker.set(w);
            }
            Err(e) => tracing::error!("{e}"),
        }
    }

    /// Whether an engine is attached.
    pub fn is_loaded(&self) -> bool {
        self.state.worker.get().is_some()
    }

    /// Stops accepting, waits up to `grace` for running requests, ends the
    /// streams still running with an error event and `[DONE]`, and returns.
    pub fn shutdown(mut self, grace: Duration) {
        self.stop_and_join(grace);
    }

    fn stop_and_join(&mut self, grace: Duration) {
        let _ = self.stop.send(Some(grace));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // The connections are gone with the runtime: let the engine thread
        // end its jobs (cancelled, their clients gone) and write the trace.
        if let Some(worker) = Arc::get_mut(&mut self.state).and_then(|s| s.worker.take()) {
            worker.stop();
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.stop_and_join(Duration::ZERO);
    }
}

/// Binds and serves in background threads without a model: `/health`
/// answers 503 `{"status": "loading"}` and the API 503 until
/// [`RunningServer::attach`]. An API key no client can send is refused
/// first ([`ServerConfig::check_api_key`]).
pub fn bind(config: ServerConfig) -> Result<RunningServer, ServeError> {
    config.check_api_key()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("larder-http")
        .build()
        .map_err(ServeError::Runtime)?;
    let addr = format!("{}:{}", config.host, config.port);
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(&addr))
        .map_err(|source| ServeError::Bind {
            addr: addr.clone(),
            source,
        })?;
    let local = listener.local_addr().map_err(|source| ServeError::Bind { addr, source })?;
    let (abort_tx, abort) = watch::channel(false);
    let state = Arc::new(http::State {
        config,
        worker: Default::default(),
        ids: Default::default(),
        abort,
        connections: Default::default(),
        responses: Default::default(),
    });
    let (stop, stop_rx) = watch::channel(None);
    let handle = runtime.handle().clone();
    let serving = state.clone();
    let thread = std::thread::Builder::new()
        .name("larder-serve".into())
        .spawn(move || runtime.block_on(serve(listener, serving, stop_rx, abort_tx)))
        .map_err(ServeError::Runtime)?;
    Ok(RunningServer {
        addr: local,
        state,
        handle,
        stop,
        thread: Some(thread),
    })
}

/// Binds, attaches `engine`, and serves in background threads; returns once listening.
pub fn start(engine: Engine, config: ServerConfig) -> Result<RunningServer, ServeError> {
    let server = bind(config)?;
    server.attach(engine);
    Ok(server)
}

/// Serves until SIGINT or SIGTERM: binds first (printing the address, and a
/// warning when other machines can reach it without an API key), runs
/// `load` on its own thread meanwhile (the engine and the drafter every
/// request uses), then drains gracefully and returns `Ok` on a signal. A
/// failed load is `Err(ServeError::Load)`.
pub fn run<F>(config: ServerConfig, load: F) -> Result<(), ServeError>
where
    F: FnOnce() -> Result<(Engine, Drafting), String> + Send + 'static,
{
    let grace = config.shutdown_grace;
    let name = config.served_name.clone();
    let has_api_key = config.api_key.is_some();
    let server = bind(config)?;
    let handle = server.handle.clone();
    let loaded = handle.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).map_err(ServeError::Signal)?;
        let mut int = signal(SignalKind::interrupt()).map_err(ServeError::Signal)?;
        let mut stopped = Box::pin(async move {
            tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            }
        });
        tracing::info!("listening on http://{}", server.addr);
        eprintln!(
            "[larder] serving on http://{} (OpenAI-compatible: /v1/models, /v1/chat/completions, /v1/completions, /v1/responses; Anthropic: /v1/messages); loading the model",
            server.addr
        );
        if let Some(warning) = exposure_warning(server.addr, has_api_key) {
            eprintln!("{warning}");
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("larder-load".into())
            .spawn(move || {
                let _ = tx.send(load());
            })
            .map_err(ServeError::Runtime)?;
        let started = Instant::now();
        tokio::select! {
            r = rx => match r {
                Ok(Ok((engine, drafting))) => {
                    let mut ready = ready_line(&engine, &name, server.addr, started.elapsed().as_secs_f64());
                    if let Some(d) = drafting.name() {
                        ready.push_str(&format!("; drafting with {d}"));
                    }
                    if let Some(e) = engine.chat_template_error() {
                        eprintln!("[larder] warning: {e}; chat requests (/v1/chat/completions) fail with a 500 until it is fixed; completions work");
                    }
                    server.attach(Loaded { engine, drafting });
                    eprintln!("{ready}");
                }
                Ok(Err(e)) => return Err(ServeError::Load(e)),
                Err(_) => return Err(ServeError::Load("the model-loading thread stopped without a result".into())),
            },
            s = &mut stopped => {
                eprintln!("[larder] {s} while loading the model: exiting");
                return Ok(false);
            }
        }
        let s = stopped.await;
        eprintln!(
            "[larder] {s}: no new connections; running requests have {}s to finish",
            grace.as_secs_f64()
        );
        Ok(true)
    })?;
    server.shutdown(if loaded { grace } else { Duration::ZERO });
    eprintln!("[larder] stopped");
    Ok(())
}

/// The line saying the server is ready: what it serves (model id,
/// architecture), where experts live, and where to send requests.
fn ready_line(engine: &Engine, name: &str, addr: SocketAddr, secs: f64) -> String {
    let experts = match engine.store() {
        None => "experts in RAM".to_string(),
        Some(s) if s.cache().budget() == u64::MAX => "experts in RAM (read from the store as used)".to_string(),
        Some(s) => format!(
            "experts streamed via {} through a {} RAM cache",
            s.backend().name(),
            larder_engine::format_size(s.cache().budget())
        ),
    };
    format!(
        "[larder] ready in {secs:.1}s: serving `{name}` ({}, {experts}) on http://{addr} \
         (POST /v1/chat/completions, POST /v1/completions, POST /v1/responses, POST /v1/messages, GET /v1/models, GET /health, GET /metrics)",
        engine.model().spec().model_type
    )
}

/// Accepts until told to stop, then drains (see [`RunningServer::shutdown`]).
async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<http::State>,
    mut stop: watch::Receiver<Option<Duration>>,
    abort: watch::Sender<bool>,
) {
    let (closing_tx, closing) = watch::channel(false);
    let grace = loop {
        let conn = tokio::select! {
            c = listener.accept() => c,
            r = stop.changed() => break if r.is_ok() { (*stop.borrow()).unwrap_or_default() } else { Duration::ZERO },
        };
        let stream = match conn {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors or similar: back off instead of
                // spinning; connections already open keep being served.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        tokio::spawn(connection(stream, state.clone(), closing.clone()));
    };
    drop(listener);
    let _ = closing_tx.send(true);
    if !until_idle(&state, grace).await {
        let open = state.connections.load(Ordering::SeqCst);
        tracing::warn!("shutdown: {open} connection(s) still busy after the grace period; ending their streams");
        let _ = abort.send(true);
        until_idle(&state, FLUSH).await;
    }
}

/// Waits until no connection is open, or `limit` passes (false).
async fn until_idle(state: &http::State, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if state.connections.load(Ordering::SeqCst) == 0 {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One client connection; counted while open, closed gracefully (after
/// the request in progress) once the server is closing.
async fn connection(stream: tokio::net::TcpStream, state: Arc<http::State>, mut closing: watch::Receiver<bool>) {
    let _open = http::ConnectionGuard::new(state.clone());
    let header_timeout = state.config.header_timeout;
    let service = service_fn(move |req| http::handle(state.clone(), req));
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = closing.wait_for(|c| *c) => conn.as_mut().graceful_shutdown(),
    }
    let _ = conn.await;
}

#[cfg(test)]
mod tests {
    use super::{exposure_warning, ServerConfig};

    #[test]
    fn only_a_server_others_can_reach_without_a_key_is_warned_about() {
        for addr in ["0.0.0.0:8000", "[::]:8000", "192.168.1.5:8000", "[2001:db8::1]:8000"] {
            let warning = exposure_warning(addr.parse().unwrap(), false);
            assert!(warning.is_some_and(|w| w.contains("--api-key")), "{addr}");
            assert_eq!(exposure_warning(addr.parse().unwrap(), true), None, "{addr} with a key");
        }
        for addr in ["127.0.0.1:8000", "127.0.0.2:1", "[::1]:8000", "[::ffff:127.0.0.1]:8000"] {
            assert_eq!(exposure_warning(addr.parse().unwrap(), false), None, "{addr}");
        }
    }

    #[test]
    fn api_keys_no_client_can_send_are_refused() {
        let with = |key: &str| ServerConfig {
            api_key: Some(key.into()),
            ..ServerConfig::default()
        };
        for key in ["", " ", "\n", "k3y\n", " k3y"] {
            assert!(with(key).check_api_key().is_err(), "{key:?}");
        }
        assert!(with("k3y").check_api_key().is_ok());
        assert!(ServerConfig::default().check_api_key().is_ok());
    }
}
