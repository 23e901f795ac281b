//! Opt-in CORS (`--cors-origin`): which origins may call the API from a
//! browser, the headers every reply to them carries, and the extra headers
//! of a preflight (`OPTIONS` with `Access-Control-Request-Method`). With no
//! origin configured, no CORS header is ever sent.

use hyper::header::{HeaderMap, HeaderValue};

/// Checks one `--cors-origin` value: `*`, or `scheme://host[:port]` with no
/// path (what browsers send in `Origin`).
pub fn parse_origin(s: &str) -> Result<String, String> {
    if s == "*" {
        return Ok(s.to_string());
    }
    let rest = s
        .strip_prefix("http://")
        .or_else(|| s.strip_prefix("https://"))
        .ok_or_else(|| format!("{s:?} is not an origin: write `*` or scheme://host[:port], e.g. http://localhost:3000"))?;
    let ok = !rest.is_empty()
        && rest
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'));
    if !ok {
        return Err(format!(
            "{s:?} is not an origin (no path, query or trailing slash): write scheme://host[:port], e.g. http://localhost:3000"
        ));
    }
    Ok(s.to_string())
}

/// The `Access-Control-Allow-Origin` value for a request from `origin`,
/// if that origin is allowed.
fn allow_origin(allowed: &[String], origin: Option<&str>) -> Option<HeaderValue> {
    if allowed.iter().any(|a| a == "*") {
        return Some(HeaderValue::from_static("*"));
    }
    let origin = origin?;
    allowed
        .iter()
        .any(|a| a == origin)
        .then(|| HeaderValue::from_str(origin).ok())
        .flatten()
}

/// Adds the CORS headers to a reply for a request with `request` headers;
/// `methods` is the route's `Allow` list, used for preflights.
pub fn decorate(allowed: &[String], request: &HeaderMap, methods: Option<&'static str>, reply: &mut HeaderMap) {
    if allowed.is_empty() {
        return;
    }
    let origin = request.get("origin").and_then(|v| v.to_str().ok());
    let Some(value) = allow_origin(allowed, origin) else {
        return;
    };
    if value != "*" {
        reply.append("vary", HeaderValue::from_static("Origin"));
    }
    reply.insert("access-control-allow-origin", value);
    reply.insert("access-control-expose-headers", HeaderValue::from_static("retry-after"));
    let preflight = request.contains_key("access-control-request-method");
    if let (true, Some(methods)) = (preflight, methods) {
        reply.insert("access-control-allow-methods", HeaderValue::from_static(methods));
        let headers = request
            .get("access-control-request-headers")
            .cloned()
            .unwrap_or_else(|| HeaderValue::from_static("authorization, content-type"));
        reply.insert("access-control-allow-headers", headers);
        reply.insert("access-control-max-age", HeaderValue::from_static("600"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_checked() {
        assert!(parse_origin("*").is_ok());
        assert!(parse_origin("http://localhost:3000").is_ok());
        assert!(parse_origin("https://[::1]:8080").is_ok());
        for bad in ["localhost", "http://a/", "http://a/path", "ftp://a", "http://"] {
            assert!(parse_origin(bad).is_err(), "{bad}");
        }
    }
}
