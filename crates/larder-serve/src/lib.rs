//! larder-serve: an OpenAI-compatible HTTP server over the engine
//! (`GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/completions`,
//! `GET /health`, `GET /metrics`).
//!
//! - [`api`] validates requests into generation jobs and shapes errors;
//! - [`worker`] runs generation on one dedicated engine thread with a FIFO
//!   queue of bounded depth (429 beyond it), cancelling when clients leave;
//! - [`http`] is the hyper 1 service: routing, API key, body limits and
//!   timeouts, JSON and server-sent-event responses.

pub mod api;
pub mod http;
pub mod worker;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use larder_engine::Engine;

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    /// The model id clients must ask for.
    pub served_name: String,
    /// Require `Authorization: Bearer <key>` on /v1 endpoints.
    pub api_key: Option<String>,
    /// Requests queued or running before 429.
    pub queue_depth: usize,
    pub max_request_bytes: usize,
    /// Time allowed for a request body to arrive.
    pub body_timeout: Duration,
    /// Time allowed for a request's headers to arrive (slow clients are closed).
    pub header_timeout: Duration,
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
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// A running server (for embedding and tests): its address, and a way to stop it.
pub struct RunningServer {
    pub addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Binds and serves in background threads; returns once listening.
pub fn start(engine: Engine, config: ServerConfig) -> Result<RunningServer, ServeError> {
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
    let worker = worker::Worker::start(engine, config.queue_depth);
    let state = Arc::new(http::State {
        config,
        worker,
        ids: Default::default(),
    });
    let (tx, rx) = tokio::sync::oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("larder-serve".into())
        .spawn(move || runtime.block_on(accept_loop(listener, state, rx)))
        .map_err(ServeError::Runtime)?;
    Ok(RunningServer {
        addr: local,
        shutdown: Some(tx),
        thread: Some(thread),
    })
}

/// Serves until the process ends.
pub fn run(engine: Engine, config: ServerConfig) -> Result<(), ServeError> {
    let server = start(engine, config)?;
    tracing::info!("listening on http://{}", server.addr);
    eprintln!(
        "[larder] serving on http://{} (OpenAI-compatible: /v1/models, /v1/chat/completions, /v1/completions)",
        server.addr
    );
    loop {
        std::thread::park();
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, state: Arc<http::State>, mut stop: tokio::sync::oneshot::Receiver<()>) {
    loop {
        let conn = tokio::select! {
            c = listener.accept() => c,
            _ = &mut stop => return,
        };
        let stream = match conn {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors or similar: back off instead of
                // spinning; connections already open keep being served.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let header_timeout = state.config.header_timeout;
            let service = service_fn(move |req| http::handle(state.clone(), req));
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
