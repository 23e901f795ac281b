//! The HTTP client every remote read goes through: one `ureq::Agent`
//! (connection pool, rustls with the platform's trusted CAs, timeouts),
//! the bearer token, the retry loop (exponential backoff with jitter,
//! bounded attempts) and the sorting of responses and transport failures
//! into done / retry / fail-now. It also counts requests, retries and body
//! bytes received ([`Transferred`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::error::{auth_hint, not_found_what, RemoteError};

/// How often and how patiently transient failures (connect errors,
/// timeouts, resets, short bodies, HTTP 408/429/5xx) are retried.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Attempts per request, the first included (at least 1).
    pub attempts: u32,
    /// Wait before the first retry; doubled per retry up to `max_delay`.
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 6,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (0-based): the doubled delay
    /// scaled by a jitter factor in [0.5, 1) so parallel readers that
    /// failed together do not come back together.
    pub(crate) fn delay(&self, retry: u32) -> Duration {
        let doubled = self.base_delay.saturating_mul(1u32 << retry.min(20));
        let capped = doubled.min(self.max_delay);
        capped.mul_f64(0.5 + 0.5 * jitter_unit())
    }
}

/// A number in [0, 1) that differs per call and per thread (no RNG
/// dependency: xxh3 of the clock, the thread and a counter).
fn jitter_unit() -> f64 {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let thread = format!("{:?}", std::thread::current().id());
    let seed = format!("{nanos}:{thread}:{}", CALLS.fetch_add(1, Ordering::Relaxed));
    (xxhash_rust::xxh3::xxh3_64(seed.as_bytes()) >> 11) as f64 / (1u64 << 53) as f64
}

/// Client settings.
#[derive(Clone, Debug)]
pub struct RemoteOptions {
    pub retry: RetryPolicy,
    /// TCP + TLS connect timeout.
    pub connect_timeout: Duration,
    /// Longest wait for response headers and for each read of a body: a
    /// stalled body fails (and is resumed) after this long.
    pub read_timeout: Duration,
    /// Range requests in flight at once in `read_ranges`.
    pub parallel: usize,
    /// Longest one request may take, its retries included (`None`: the
    /// retry policy alone decides). Each attempt's connect and read
    /// timeouts are capped at it too. Lazy serving sets it, so a request
    /// needing an expert from a source that is down fails in seconds.
    pub deadline: Option<Duration>,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            retry: RetryPolicy::default(),
            connect_timeout: Duration::from_secs(15),
            read_timeout: Duration::from_secs(30),
            parallel: 8,
            deadline: None,
        }
    }
}

/// What a source has moved so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transferred {
    /// HTTP requests sent (retries included).
    pub requests: u64,
    /// Retries after transient failures.
    pub retries: u64,
    /// Body bytes received and kept (bytes of a rejected response are
    /// never read).
    pub bytes: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    requests: AtomicU64,
    retries: AtomicU64,
    bytes: AtomicU64,
}

impl Counters {
    pub(crate) fn add_bytes(&self, n: u64) {
        self.bytes.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Transferred {
        Transferred {
            requests: self.requests.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }
}

/// One attempt's outcome when it did not fail for good.
pub(crate) enum Attempt<T> {
    Done(T),
    /// Transient: try again (the reason is kept for the final error).
    Retry(String),
}

pub(crate) type Response = ureq::http::Response<ureq::Body>;

/// The agent, token, retry policy and counters of one source.
pub(crate) struct Client {
    agent: ureq::Agent,
    token: Option<String>,
    pub(crate) options: RemoteOptions,
    pub(crate) counters: Counters,
}

impl Client {
    pub(crate) fn new(options: &RemoteOptions, token: Option<String>) -> Self {
        let tls = ureq::tls::TlsConfig::builder()
            .root_certs(ureq::tls::RootCerts::PlatformVerifier)
            .build();
        let cap = |t: Duration| options.deadline.map_or(t, |d| t.min(d));
        let agent = ureq::Agent::config_builder()
            .tls_config(tls)
            .http_status_as_error(false)
            .timeout_resolve(Some(cap(options.connect_timeout)))
            .timeout_connect(Some(cap(options.connect_timeout)))
            .timeout_recv_response(Some(cap(options.read_timeout)))
            .timeout_per_read(Some(cap(options.read_timeout)))
            .user_agent(concat!("larder/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Client {
            agent,
            token,
            options: options.clone(),
            counters: Counters::default(),
        }
    }

    /// Sends one GET (redirects followed; the token is not forwarded to
    /// another host) or, with `head`, one HEAD without following
    /// redirects (the hub's LFS headers are on the redirect itself).
    pub(crate) fn send(&self, url: &str, head: bool, headers: &[(&str, String)]) -> Result<Response, ureq::Error> {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        let mut req = if head {
            self.agent.head(url).config().max_redirects(0).build()
        } else {
            self.agent.get(url)
        };
        if let Some(token) = &self.token {
            req = req.header("Authorization", format!("Bearer {token}"));
        }
        for (name, value) in headers {
            req = req.header(*name, value);
        }
        req.call()
    }

    /// Runs `attempt` until it is done, fails for good, or the policy's
    /// attempts are spent (then [`RemoteError::GaveUp`] naming `url`).
    pub(crate) fn with_retries<T>(
        &self,
        url: &str,
        mut attempt: impl FnMut() -> Result<Attempt<T>, RemoteError>,
    ) -> Result<T, RemoteError> {
        let attempts = self.options.retry.attempts.max(1);
        let started = std::time::Instant::now();
        let mut last = String::new();
        for n in 0..attempts {
            if n > 0 {
                let delay = self.options.retry.delay(n - 1);
                if let Some(deadline) = self.options.deadline.filter(|d| started.elapsed() + delay > *d) {
                    return Err(RemoteError::GaveUp {
                        url: url.to_string(),
                        attempts: n,
                        last: format!("{last} (no time left for another within the {:.0?} deadline)", deadline),
                    });
                }
                self.counters.retries.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(delay);
            }
            match attempt()? {
                Attempt::Done(v) => return Ok(v),
                Attempt::Retry(reason) => last = reason,
            }
        }
        Err(RemoteError::GaveUp {
            url: url.to_string(),
            attempts,
            last,
        })
    }

    /// Sorts a failed send: transient failures are retried, the rest end
    /// the read with an error naming `url`.
    pub(crate) fn transport<T>(&self, url: &str, e: ureq::Error) -> Result<Attempt<T>, RemoteError> {
        use ureq::Error as E;
        let retry = |r: String| Ok(Attempt::Retry(r));
        match e {
            E::Timeout(t) => retry(format!("timed out ({t})")),
            E::ConnectionFailed => retry("connection failed".into()),
            E::Io(io) if io.kind() == std::io::ErrorKind::InvalidData => Err(transport_err(url, format!("TLS error: {io}"))),
            E::Io(io) => retry(format!("I/O error: {io}")),
            E::Protocol(p) => retry(format!("HTTP protocol error: {p}")),
            E::HostNotFound => Err(transport_err(url, "host not found (DNS failed: offline or wrong endpoint?)".into())),
            other => Err(transport_err(url, other.to_string())),
        }
    }

    /// Checks a response's status: `Ok(None)` for 2xx (and 3xx when
    /// redirects were not followed), `Ok(Some(reason))` for a transient
    /// status, an error naming `url` and what to do otherwise.
    pub(crate) fn status(&self, url: &str, resp: &Response, range: &str) -> Result<Option<String>, RemoteError> {
        let status = resp.status().as_u16();
        let code = header(resp, "x-error-code");
        match status {
            200..=399 => Ok(None),
            401 | 403 => Err(RemoteError::Unauthorized {
                url: url.to_string(),
                status,
                hint: auth_hint(code.as_deref(), self.token.is_some()),
            }),
            404 => Err(RemoteError::NotFound {
                url: url.to_string(),
                what: not_found_what(code.as_deref()).to_string(),
            }),
            416 => Err(RemoteError::RangeNotSatisfiable {
                url: url.to_string(),
                range: range.to_string(),
            }),
            408 | 429 | 500..=599 => Ok(Some(format!("HTTP {status}"))),
            _ => Err(RemoteError::Status {
                url: url.to_string(),
                status,
            }),
        }
    }
}

fn transport_err(url: &str, reason: String) -> RemoteError {
    RemoteError::Transport {
        url: url.to_string(),
        reason,
    }
}

/// A response header as text, if present and printable.
pub(crate) fn header(resp: &Response, name: &str) -> Option<String> {
    resp.headers().get(name).and_then(|v| v.to_str().ok()).map(|v| v.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_caps_and_jitters() {
        let p = RetryPolicy {
            attempts: 5,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(350),
        };
        for _ in 0..50 {
            let d0 = p.delay(0).as_millis();
            let d1 = p.delay(1).as_millis();
            let d5 = p.delay(5).as_millis();
            assert!((50..100).contains(&d0), "{d0}");
            assert!((100..200).contains(&d1), "{d1}");
            assert!((175..350).contains(&d5), "{d5}");
        }
        let a: Vec<_> = (0..8).map(|_| p.delay(3)).collect();
        assert!(a.windows(2).any(|w| w[0] != w[1]), "jitter varies");
    }
}
