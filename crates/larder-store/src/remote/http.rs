//! `HttpSource`: a checkpoint on the hub or under a base URL serving the
//! hub layout. Files are read at `<base>/resolve/<revision>/<file>` (the
//! revision pinned to the listed commit once the hub has listed it);
//! metadata comes from a HEAD that does not follow the hub's redirect to
//! its CDN, since the LFS size and sha256 (`X-Linked-Size`,
//! `X-Linked-Etag`) are on the redirect. Every range GET is checked: status
//! 206, the Content-Range asked for, the ETag first seen for the file
//! (and sent back as `If-Range`); a body cut short is resumed where it
//! stopped.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::Mutex;

use super::client::{header, Attempt, Client, RemoteOptions, Response, Transferred};
use super::error::RemoteError;
use super::listing::{self, is_sha256, ListedFile, Listing};
use super::source::{check_file_name, encode_path, CheckpointSource, HubEnv};
use super::{FileMeta, FileSource, StreamReport, StreamState};

/// A hub repo or hub-layout base URL.
pub(crate) struct HttpSource {
    client: Client,
    /// `{endpoint}/{repo}` or the base URL.
    base: String,
    /// `{endpoint}/api/models/{repo}` on the hub; `None` for a base URL.
    api: Option<String>,
    /// The revision asked for, then the listed commit.
    revision: Mutex<String>,
    listing: Mutex<Option<Listing>>,
    /// File -> the ETag its reads are pinned to.
    pins: Mutex<HashMap<String, String>>,
}

impl HttpSource {
    /// A source over `source` (a `Hub` or `Http` one). The token goes to
    /// the hub endpoint only, and to a base URL under it.
    pub(crate) fn new(source: &CheckpointSource, env: &HubEnv, options: &RemoteOptions) -> Result<Self, RemoteError> {
        let endpoint = env.endpoint();
        let (base, api, revision) = match source {
            CheckpointSource::Hub { endpoint, repo, revision } => (
                format!("{endpoint}/{repo}"),
                Some(format!("{endpoint}/api/models/{repo}")),
                revision.clone(),
            ),
            CheckpointSource::Http { base, revision } => (base.clone(), None, revision.clone()),
            CheckpointSource::Local { path } => {
                return Err(RemoteError::BadSource {
                    arg: path.display().to_string(),
                    reason: "a local folder is read with LocalSource".into(),
                })
            }
        };
        let token = env.token.clone().filter(|_| base.starts_with(&format!("{endpoint}/")));
        Ok(HttpSource {
            client: Client::new(options, token),
            base,
            api,
            revision: Mutex::new(revision),
            listing: Mutex::new(None),
            pins: Mutex::new(HashMap::new()),
        })
    }

    /// `<base>/resolve/<revision>/<file>`.
    pub(crate) fn file_url(&self, file: &str) -> String {
        let rev = lock(&self.revision).clone();
        format!("{}/resolve/{}/{}", self.base, encode_path(&rev, false), encode_path(file, true))
    }

    /// GETs a small file whole (listing JSON, an index), with retries.
    fn get_small(&self, url: &str) -> Result<Vec<u8>, RemoteError> {
        self.client.with_retries(url, || {
            let resp = match self.client.send(url, false, &[]) {
                Ok(r) => r,
                Err(e) => return self.client.transport(url, e),
            };
            if let Some(retry) = self.client.status(url, &resp, "-")? {
                return Ok(Attempt::Retry(retry));
            }
            let mut body = Vec::new();
            match resp.into_body().into_reader().take(64 << 20).read_to_end(&mut body) {
                Ok(_) => {
                    self.client.counters.add_bytes(body.len() as u64);
                    Ok(Attempt::Done(body))
                }
                Err(e) => Ok(Attempt::Retry(format!("body cut short: {e}"))),
            }
        })
    }

    fn list_hub(&self, api: &str) -> Result<Listing, RemoteError> {
        let rev = lock(&self.revision).clone();
        let url = format!("{api}/revision/{}?blobs=true", encode_path(&rev, false));
        let listing = listing::parse_hub_listing(&url, &self.get_small(&url)?)?;
        if let Some(commit) = &listing.commit {
            *lock(&self.revision) = commit.clone();
        }
        Ok(listing)
    }

    /// A base URL: the index's shards (or `model.safetensors`) plus the
    /// known small files that answer a HEAD.
    fn list_base(&self) -> Result<Listing, RemoteError> {
        let index_url = self.file_url(listing::INDEX_FILE);
        let mut names = match self.get_small(&index_url) {
            Ok(body) => {
                let mut n = listing::index_shards(&index_url, &body)?;
                n.push(listing::INDEX_FILE.to_string());
                n
            }
            Err(RemoteError::NotFound { .. }) => vec![listing::SINGLE_FILE.to_string()],
            Err(e) => return Err(e),
        };
        for small in listing::KNOWN_SMALL_FILES {
            match self.head(small) {
                Ok(_) => names.push(small.to_string()),
                Err(RemoteError::NotFound { .. }) if *small != "config.json" => {}
                Err(e) => return Err(e),
            }
        }
        let mut files = Vec::with_capacity(names.len());
        for name in names {
            let meta = self.head(&name)?;
            files.push(ListedFile {
                name,
                size: Some(meta.size),
                sha256: meta.sha256,
            });
        }
        Ok(Listing { commit: None, files })
    }

    /// HEAD `file` (redirect not followed), with retries.
    fn head(&self, file: &str) -> Result<FileMeta, RemoteError> {
        check_file_name(file).map_err(|reason| RemoteError::BadSource {
            arg: file.to_string(),
            reason,
        })?;
        let first = self.file_url(file);
        self.client.with_retries(&first, || {
            let mut url = first.clone();
            for _ in 0..MAX_RELATIVE_REDIRECTS {
                let resp = match self.client.send(&url, true, &[]) {
                    Ok(r) => r,
                    Err(e) => return self.client.transport(&url, e),
                };
                if let Some(retry) = self.client.status(&url, &resp, "-")? {
                    return Ok(Attempt::Retry(retry));
                }
                match relative_redirect(&url, &resp) {
                    Some(next) => url = next,
                    None => return meta_from_head(&url, &resp).map(Attempt::Done),
                }
            }
            Err(RemoteError::Transport {
                url: first.clone(),
                reason: format!("more than {MAX_RELATIVE_REDIRECTS} redirects within the hub"),
            })
        })
    }

    /// The listing entry for `file`, when a listing was fetched.
    fn listed(&self, file: &str) -> Option<ListedFile> {
        lock(&self.listing).as_ref().and_then(|l| l.get(file).cloned())
    }

    /// One checked range GET of `file` bytes `start..=end` out of `total`,
    /// resumed after transient failures from where the body stopped;
    /// `take` receives the bytes in order.
    fn fetch(
        &self,
        file: &str,
        start: u64,
        end: u64,
        total: Option<u64>,
        take: &mut dyn FnMut(&[u8]) -> Result<(), RemoteError>,
    ) -> Result<(), RemoteError> {
        let url = self.file_url(file);
        let mut next = start;
        self.client.with_retries(&url, || {
            let range = format!("bytes={next}-{end}");
            let mut headers = vec![("Range", range.clone())];
            let pinned = lock(&self.pins).get(file).cloned();
            if let Some(etag) = pinned.as_ref().filter(|e| !e.starts_with("W/")) {
                headers.push(("If-Range", etag.clone()));
            }
            let resp = match self.client.send(&url, false, &headers) {
                Ok(r) => r,
                Err(e) => return self.client.transport(&url, e),
            };
            if let Some(retry) = self.client.status(&url, &resp, &range)? {
                return Ok(Attempt::Retry(retry));
            }
            self.check_range_response(file, &url, &resp, pinned, (next, end, total), &range)?;
            let want = end + 1 - next;
            let mut reader = resp.into_body().into_reader().take(want);
            let mut buf = vec![0u8; (want as usize).min(1 << 20)];
            loop {
                let n = match reader.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Ok(Attempt::Retry(format!("body failed at byte {next}: {e}"))),
                };
                self.client.counters.add_bytes(n as u64);
                take(&buf[..n])?;
                next += n as u64;
            }
            if next <= end {
                return Ok(Attempt::Retry(format!("short body: stopped at byte {next} of {range}")));
            }
            Ok(Attempt::Done(()))
        })
    }

    /// Status 206, ETag equal to the pinned one (pinning it if first), and
    /// `Content-Range: bytes start-end/total` as asked.
    fn check_range_response(
        &self,
        file: &str,
        url: &str,
        resp: &Response,
        pinned: Option<String>,
        (start, end, total): (u64, u64, Option<u64>),
        range: &str,
    ) -> Result<(), RemoteError> {
        let etag = header(resp, "etag");
        if let (Some(pinned), Some(got)) = (&pinned, &etag) {
            if pinned != got {
                return Err(RemoteError::FileChanged {
                    url: url.to_string(),
                    file: file.to_string(),
                    pinned: pinned.clone(),
                    got: got.clone(),
                });
            }
        }
        if resp.status().as_u16() != 206 {
            return Err(RemoteError::RangeIgnored { url: url.to_string() });
        }
        let bad = |reason: String| RemoteError::BadRange {
            url: url.to_string(),
            range: range.to_string(),
            reason,
        };
        let content_range = header(resp, "content-range").ok_or_else(|| bad("no Content-Range header".into()))?;
        let (got_start, got_end, got_total) =
            parse_content_range(&content_range).ok_or_else(|| bad(format!("bad Content-Range `{content_range}`")))?;
        if (got_start, got_end) != (start, end) {
            return Err(bad(format!("server sent `{content_range}`")));
        }
        if let (Some(t), Some(got)) = (total, got_total) {
            if t != got {
                return Err(bad(format!("file is {got} bytes, expected {t} (`{content_range}`)")));
            }
        }
        if let (None, Some(etag)) = (pinned, etag) {
            lock(&self.pins).entry(file.to_string()).or_insert(etag);
        }
        Ok(())
    }
}

impl FileSource for HttpSource {
    fn list_files(&self) -> Result<Listing, RemoteError> {
        let listing = match &self.api {
            Some(api) => self.list_hub(api)?,
            None => self.list_base()?,
        };
        *lock(&self.listing) = Some(listing.clone());
        Ok(listing)
    }

    fn file_meta(&self, file: &str) -> Result<FileMeta, RemoteError> {
        let mut meta = self.head(file)?;
        if let Some(listed) = self.listed(file) {
            let url = self.file_url(file);
            let mismatch = |reason: String| RemoteError::ListingMismatch {
                url: url.clone(),
                file: file.to_string(),
                reason,
            };
            if let Some(size) = listed.size.filter(|s| *s != meta.size) {
                return Err(mismatch(format!("served {} bytes, listed {size}", meta.size)));
            }
            match (&listed.sha256, &meta.sha256) {
                (Some(l), Some(m)) if l != m => return Err(mismatch(format!("served sha256 {m}, listed {l}"))),
                (Some(l), None) => meta.sha256 = Some(l.clone()),
                _ => {}
            }
        }
        Ok(meta)
    }

    fn read_range(&self, file: &str, offset: u64, len: u64) -> Result<Vec<u8>, RemoteError> {
        // Capacity grows with the bytes that arrive beyond 64 MiB: `len`
        // comes from an index and is not trusted with an allocation.
        let mut out = Vec::with_capacity(len.min(64 << 20) as usize);
        self.read_range_into(file, offset, len, &mut out)?;
        Ok(out)
    }

    fn read_range_into(&self, file: &str, offset: u64, len: u64, out: &mut Vec<u8>) -> Result<(), RemoteError> {
        out.clear();
        if len == 0 {
            return Ok(());
        }
        let end = offset.checked_add(len - 1).ok_or_else(|| RemoteError::BadSource {
            arg: file.to_string(),
            reason: format!("range {offset}+{len} overflows"),
        })?;
        let total = self.listed(file).and_then(|f| f.size);
        self.fetch(file, offset, end, total, &mut |bytes| {
            out.extend_from_slice(bytes);
            Ok(())
        })
    }

    fn stream_file(&self, file: &str, sink: &mut dyn Write, state: &mut StreamState) -> Result<StreamReport, RemoteError> {
        let meta = self.file_meta(file)?;
        if state.offset < meta.size {
            self.fetch(file, state.offset, meta.size - 1, Some(meta.size), &mut |bytes| {
                sink.write_all(bytes).map_err(|source| RemoteError::Sink {
                    file: file.to_string(),
                    offset: state.offset,
                    source,
                })?;
                state.consume(bytes);
                Ok(())
            })?;
        }
        let got = state.sha256_hex();
        if let Some(expected) = meta.sha256.as_ref().filter(|e| **e != got) {
            return Err(RemoteError::Sha256Mismatch {
                url: self.file_url(file),
                file: file.to_string(),
                expected: expected.clone(),
                got,
            });
        }
        Ok(StreamReport {
            size: meta.size,
            verified: meta.sha256.is_some(),
            sha256: got,
        })
    }

    fn transferred(&self) -> Transferred {
        self.client.counters.snapshot()
    }
}

/// Relative redirects followed by a metadata HEAD (a renamed repo).
const MAX_RELATIVE_REDIRECTS: usize = 5;

/// The next URL when `resp` is a redirect within the same host (the hub
/// answers that way for renamed repos) that carries no LFS headers; a
/// redirect to another host (the hub's CDN) is where the metadata is.
fn relative_redirect(url: &str, resp: &Response) -> Option<String> {
    if !resp.status().is_redirection() || header(resp, "x-linked-size").is_some() {
        return None;
    }
    let location = header(resp, "location")?;
    let path = location.strip_prefix('/')?;
    if path.starts_with('/') {
        return None;
    }
    let scheme_end = url.find("://")? + 3;
    let host_end = url[scheme_end..].find('/').map_or(url.len(), |i| scheme_end + i);
    Some(format!("{}/{path}", &url[..host_end]))
}

/// Size, LFS sha256, ETag and commit from a HEAD response (2xx, or the
/// hub's redirect to its CDN).
fn meta_from_head(url: &str, resp: &Response) -> Result<FileMeta, RemoteError> {
    let number = |name: &str| header(resp, name).and_then(|v| v.parse::<u64>().ok());
    let redirect = resp.status().is_redirection();
    let size = number("x-linked-size")
        .or_else(|| if redirect { None } else { number("content-length") })
        .ok_or_else(|| RemoteError::BadRange {
            url: url.to_string(),
            range: "HEAD".into(),
            reason: "no X-Linked-Size or Content-Length: the file's size is unknown".into(),
        })?;
    let sha256 = header(resp, "x-linked-etag")
        .map(|e| e.trim_start_matches("W/").trim_matches('"').to_ascii_lowercase())
        .filter(|e| is_sha256(e));
    Ok(FileMeta {
        size,
        sha256,
        etag: header(resp, "etag"),
        commit: header(resp, "x-repo-commit"),
    })
}

/// `bytes a-b/total` (total may be `*`).
fn parse_content_range(v: &str) -> Option<(u64, u64, Option<u64>)> {
    let rest = v.strip_prefix("bytes ")?;
    let (span, total) = rest.split_once('/')?;
    let (a, b) = span.split_once('-')?;
    let total = if total.trim() == "*" {
        None
    } else {
        Some(total.trim().parse().ok()?)
    };
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?, total))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::parse_content_range;

    #[test]
    fn content_range() {
        assert_eq!(parse_content_range("bytes 0-9/100"), Some((0, 9, Some(100))));
        assert_eq!(parse_content_range("bytes 5-9/*"), Some((5, 9, None)));
        assert_eq!(parse_content_range("bytes */100"), None);
        assert_eq!(parse_content_range("items 0-1/2"), None);
    }
}
