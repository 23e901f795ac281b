//! A loopback HTTP/1.1 file server for `larder bench pull`: serves one
//! folder at `http://127.0.0.1:PORT/resolve/<revision>/<file>` with HEAD, GET, byte ranges
//! (`Range: bytes=A-B`, answered 206 with `Content-Range`), a stable
//! `ETag` per file and keep-alive connections, one thread per connection.
//! Only what the benches need: the source of a pull at loopback speed, so
//! the pull's own cost is what is measured, or a source throttled to a
//! given rate over all connections (`bench lazy`: a remote link).

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes sent per write of a body.
const CHUNK: usize = 1 << 20;

/// Serves `dir` on a free loopback port until the process ends; its base URL.
pub fn serve(dir: &Path) -> std::io::Result<String> {
    serve_throttled(dir, None)
}

/// [`serve`], every body byte of every connection sharing one link of
/// `bytes_per_s` (`None`: unthrottled).
pub fn serve_throttled(dir: &Path, bytes_per_s: Option<f64>) -> std::io::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}", listener.local_addr()?);
    let dir = dir.to_path_buf();
    let link = Arc::new(Link {
        bytes_per_s,
        free_at: Mutex::new(Instant::now()),
    });
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (dir, link) = (dir.clone(), link.clone());
            std::thread::spawn(move || {
                let _ = connection(stream, &dir, &link);
            });
        }
    });
    Ok(url)
}

/// The link every body byte crosses: when it is next free.
struct Link {
    bytes_per_s: Option<f64>,
    free_at: Mutex<Instant>,
}

impl Link {
    /// Waits until `n` bytes have crossed the link after those before them.
    fn send(&self, n: usize) {
        let Some(rate) = self.bytes_per_s else { return };
        let done = {
            let mut free = self.free_at.lock().unwrap_or_else(|e| e.into_inner());
            let start = (*free).max(Instant::now());
            *free = start + Duration::from_secs_f64(n as f64 / rate);
            *free
        };
        std::thread::sleep(done.saturating_duration_since(Instant::now()));
    }
}

/// One request: method, file and requested range.
struct Request {
    head: bool,
    path: String,
    range: Option<(u64, Option<u64>)>,
}

/// Answers requests on `stream` until the client closes it.
fn connection(stream: TcpStream, dir: &Path, link: &Link) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    while let Some(req) = read_request(&mut reader)? {
        match open(dir, &req.path) {
            Some((file, size, etag)) => answer(&mut out, &req, &file, size, &etag, link)?,
            None => out.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")?,
        }
    }
    Ok(())
}

fn read_request(reader: &mut impl BufRead) -> std::io::Result<Option<Request>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut words = line.split_whitespace();
    let method = words.next().unwrap_or_default().to_string();
    let path = words.next().unwrap_or_default().to_string();
    let mut range = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = h.split_once(':') {
            if name.trim().eq_ignore_ascii_case("range") {
                range = parse_range(value.trim());
            }
        }
    }
    Ok(Some(Request {
        head: method == "HEAD",
        path,
        range,
    }))
}

/// `bytes=A-B` or `bytes=A-`.
fn parse_range(v: &str) -> Option<(u64, Option<u64>)> {
    let (a, b) = v.strip_prefix("bytes=")?.split_once('-')?;
    Some((a.parse().ok()?, if b.is_empty() { None } else { Some(b.parse().ok()?) }))
}

/// The file at URL path `path` (`/resolve/<revision>/<file>`, the layout
/// a base-URL source reads; any revision) under `dir` (no `..`), its size
/// and ETag.
fn open(dir: &Path, path: &str) -> Option<(File, u64, String)> {
    let rel = path.split('?').next()?.strip_prefix("/resolve/")?;
    let rel = rel.split_once('/')?.1;
    if rel.is_empty() || rel.split('/').any(|c| c == ".." || c.is_empty()) {
        return None;
    }
    let full: PathBuf = dir.join(rel);
    let file = File::open(&full).ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() {
        return None;
    }
    let etag = format!("\"{:x}-{:x}\"", meta.len(), meta.mtime_nsec() ^ meta.mtime());
    Some((file, meta.len(), etag))
}

fn answer(out: &mut TcpStream, req: &Request, file: &File, size: u64, etag: &str, link: &Link) -> std::io::Result<()> {
    let (status, start, end) = match req.range {
        Some((a, b)) => {
            let end = b.unwrap_or(size.saturating_sub(1)).min(size.saturating_sub(1));
            if a >= size || a > end {
                let msg = format!("HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{size}\r\nContent-Length: 0\r\n\r\n");
                return out.write_all(msg.as_bytes());
            }
            ("206 Partial Content", a, end + 1)
        }
        None => ("200 OK", 0, size),
    };
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nETag: {etag}\r\nAccept-Ranges: bytes\r\n",
        end - start
    );
    if req.range.is_some() {
        head.push_str(&format!("Content-Range: bytes {start}-{}/{size}\r\n", end - 1));
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes())?;
    if req.head {
        return Ok(());
    }
    // Throttled bodies go in smaller pieces, so connections share the link finely.
    let chunk = if link.bytes_per_s.is_some() { CHUNK / 16 } else { CHUNK };
    let mut buf = vec![0u8; chunk];
    let mut at = start;
    while at < end {
        let n = ((end - at) as usize).min(chunk);
        link.send(n);
        file.read_exact_at(&mut buf[..n], at)?;
        out.write_all(&buf[..n])?;
        at += n as u64;
    }
    Ok(())
}
