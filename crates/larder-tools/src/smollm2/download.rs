//! Downloading one file over HTTPS (ureq, rustls, the system's trusted CAs) into the cache: connect,
//! read and whole-body timeouts, three retries with backoff on transient
//! errors, a sha256 checked while the bytes arrive, and a `.part` name
//! renamed into place only once the digest matches. `file://` URLs (mirrors
//! on disk, tests) are copied with the same check.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::wheel::hex;

/// Attempts per download (the first and three retries).
const ATTEMPTS: u32 = 4;

/// What a download is doing, for progress display.
#[derive(Debug, Clone, Copy)]
pub enum DownloadEvent<'a> {
    /// Bytes received so far (and the total, when the server says).
    Bytes { done: u64, total: Option<u64> },
    /// An attempt failed transiently; the next one starts after the wait (the line says so).
    Retrying { line: &'a str },
}

/// Why a download failed, in one line (the URL is named by the caller).
#[derive(Debug)]
pub struct DownloadError {
    pub reason: String,
}

impl std::fmt::Display for DownloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for DownloadError {}

/// One attempt's failure and whether another attempt may succeed.
struct Failure {
    reason: String,
    transient: bool,
}

fn local(reason: String) -> Failure {
    Failure { reason, transient: false }
}

fn classify(e: ureq::Error) -> Failure {
    use ureq::Error as E;
    let (reason, transient) = match &e {
        E::StatusCode(code) => (format!("HTTP status {code}"), *code == 429 || *code >= 500),
        E::HostNotFound => ("host not found (DNS failed: offline?)".to_string(), false),
        E::ConnectionFailed => ("connection failed (offline or blocked?)".to_string(), true),
        E::Timeout(t) => (format!("timed out ({t})"), true),
        // rustls reports certificate and handshake failures as InvalidData I/O errors.
        E::Io(io) if io.kind() == std::io::ErrorKind::InvalidData => (format!("TLS error: {io}"), false),
        // The resolver's failure arrives as an uncategorised I/O error; only its text tells it apart.
        E::Io(io) if io.to_string().contains("lookup address") => (format!("DNS lookup failed (offline?): {io}"), false),
        E::Io(io) => (format!("I/O error: {io}"), true),
        E::Tls(m) => (format!("TLS error: {m}"), false),
        E::Rustls(r) => (format!("TLS error: {r}"), false),
        other => (other.to_string(), false),
    };
    Failure { reason, transient }
}

/// An agent trusting the system's certificate store (so TLS-inspecting proxies whose CA the
/// system trusts work), with timeouts against stalls.
fn agent() -> ureq::Agent {
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::PlatformVerifier)
        .build();
    ureq::Agent::config_builder()
        .tls_config(tls)
        .timeout_resolve(Some(Duration::from_secs(15)))
        .timeout_connect(Some(Duration::from_secs(15)))
        .timeout_recv_response(Some(Duration::from_secs(30)))
        .timeout_per_read(Some(Duration::from_secs(30)))
        .timeout_recv_body(Some(Duration::from_secs(1800)))
        .user_agent(concat!("larder/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

/// Copies `body` into `part`, hashing as it goes; `progress(done, total)`.
fn save(mut body: impl Read, part: &Path, total: Option<u64>, progress: &mut dyn FnMut(u64, Option<u64>)) -> Result<String, Failure> {
    let mut file = File::create(part).map_err(|e| local(format!("cannot create {}: {e}", part.display())))?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(Failure {
                    reason: format!("download interrupted after {done} bytes: {e}"),
                    transient: true,
                })
            }
        };
        hash.update(&buf[..n]);
        file.write_all(&buf[..n])
            .map_err(|e| local(format!("cannot write {}: {e}", part.display())))?;
        done += n as u64;
        progress(done, total);
    }
    file.sync_all()
        .map_err(|e| local(format!("cannot write {}: {e}", part.display())))?;
    if let Some(t) = total.filter(|t| *t != done) {
        return Err(Failure {
            reason: format!("download ended after {done} of {t} bytes"),
            transient: true,
        });
    }
    Ok(hex(&hash.finalize()))
}

fn attempt(url: &str, part: &Path, progress: &mut dyn FnMut(u64, Option<u64>)) -> Result<String, Failure> {
    if let Some(path) = url.strip_prefix("file://") {
        let f = File::open(path).map_err(|e| local(format!("cannot open {path}: {e}")))?;
        let total = f.metadata().ok().map(|m| m.len());
        return save(f, part, total, progress);
    }
    let resp = agent().get(url).call().map_err(classify)?;
    let total = resp
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    save(resp.into_body().into_reader(), part, total, progress)
}

/// Downloads `url` to `dest` (via `dest.part`), checking the sha256; retries
/// transient failures (connection, timeouts, HTTP 5xx/429) with backoff.
pub fn download(url: &str, dest: &Path, sha256: &str, events: &mut dyn FnMut(DownloadEvent)) -> Result<(), DownloadError> {
    let part = PathBuf::from(format!("{}.part", dest.display()));
    let mut last = String::new();
    for n in 0..ATTEMPTS {
        if n > 0 {
            let wait = Duration::from_secs(1 << (n - 1));
            let line = format!("[larder] download of {url} failed ({last}); retrying in {}s", wait.as_secs());
            events(DownloadEvent::Retrying { line: &line });
            std::thread::sleep(wait);
        }
        match attempt(url, &part, &mut |done, total| events(DownloadEvent::Bytes { done, total })) {
            Ok(got) if got == sha256 => {
                return std::fs::rename(&part, dest).map_err(|e| DownloadError {
                    reason: format!("cannot rename {} to {}: {e}", part.display(), dest.display()),
                });
            }
            Ok(got) => {
                let _ = std::fs::remove_file(&part);
                return Err(DownloadError {
                    reason: format!("the file has sha256 {got}, expected {sha256}"),
                });
            }
            Err(f) => {
                let _ = std::fs::remove_file(&part);
                last = f.reason;
                if !f.transient {
                    break;
                }
            }
        }
    }
    Err(DownloadError { reason: last })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_urls_are_copied_and_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src.bin");
        std::fs::write(&src, b"hello").unwrap();
        let url = format!("file://{}", src.display());
        let sha = hex(&Sha256::digest(b"hello"));
        let mut seen = 0;
        let dest = tmp.path().join("dest.bin");
        download(&url, &dest, &sha, &mut |ev| {
            if let DownloadEvent::Bytes { done, total } = ev {
                seen = done;
                assert_eq!(total, Some(5));
            }
        })
        .unwrap();
        assert_eq!((std::fs::read(&dest).unwrap(), seen), (b"hello".to_vec(), 5));

        let other = tmp.path().join("other.bin");
        let err = download(&url, &other, &"0".repeat(64), &mut |_| {}).unwrap_err();
        assert!(err.reason.contains("sha256"), "{err}");
        assert!(
            !other.exists() && !tmp.path().join("other.bin.part").exists(),
            "nothing partial is left"
        );

        let err = download("file:///nonexistent/x", &other, &sha, &mut |_| {}).unwrap_err();
        assert!(err.reason.contains("/nonexistent/x"), "{err}");
    }
}
