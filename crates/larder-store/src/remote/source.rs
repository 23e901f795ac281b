//! [`CheckpointSource`]: what a `SOURCE` argument names (a Hugging Face
//! repo id, an `http(s)://` base URL serving the hub layout, or a local
//! folder), the hub settings read from the environment ([`HubEnv`]) and
//! the URLs of the hub layout (`resolve/<revision>/<file>`, the API
//! listing), percent-encoded as the hub expects.

use std::path::{Path, PathBuf};

use super::error::RemoteError;

/// The hub used when `HF_ENDPOINT` is not set.
pub(crate) const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// The revision used when a source names none.
pub(crate) const DEFAULT_REVISION: &str = "main";

/// Hub settings from the environment: `HF_ENDPOINT` and `HF_TOKEN`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HubEnv {
    /// `HF_ENDPOINT` (default `DEFAULT_ENDPOINT`).
    pub endpoint: Option<String>,
    /// `HF_TOKEN`, sent as `Authorization: Bearer` to the hub endpoint only.
    pub token: Option<String>,
}

impl HubEnv {
    /// Reads `HF_ENDPOINT` and `HF_TOKEN` (empty values count as unset).
    pub fn from_process() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        HubEnv {
            endpoint: var("HF_ENDPOINT"),
            token: var("HF_TOKEN"),
        }
    }

    /// The endpoint without a trailing slash.
    pub fn endpoint(&self) -> String {
        self.endpoint
            .as_deref()
            .unwrap_or(DEFAULT_ENDPOINT)
            .trim_end_matches('/')
            .to_string()
    }
}

/// Where a checkpoint comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckpointSource {
    /// `org/name[@revision]` on the hub at `endpoint`.
    Hub { endpoint: String, repo: String, revision: String },
    /// `http(s)://host/path[@revision]`: a base URL serving
    /// `<base>/resolve/<revision>/<file>`.
    Http { base: String, revision: String },
    /// A local or mounted folder holding the checkpoint files.
    Local { path: PathBuf },
}

impl CheckpointSource {
    /// Parses a `SOURCE` argument. An existing folder wins over a repo id
    /// of the same spelling; an argument that is neither a URL, an
    /// existing path nor `org/name[@rev]` is an error saying which forms
    /// are accepted.
    pub fn parse(arg: &str, env: &HubEnv) -> Result<Self, RemoteError> {
        let bad = |reason: &str| RemoteError::BadSource {
            arg: arg.to_string(),
            reason: reason.to_string(),
        };
        if arg.starts_with("http://") || arg.starts_with("https://") {
            let (base, revision) = split_revision_url(arg);
            let host = base.split("://").nth(1).unwrap_or("");
            if host.is_empty() || host.starts_with('/') {
                return Err(bad("the URL has no host"));
            }
            return Ok(CheckpointSource::Http { base, revision });
        }
        if arg.contains("://") {
            return Err(bad("only http:// and https:// URLs are supported"));
        }
        let path = Path::new(arg);
        let looks_like_path = arg.starts_with('/') || arg.starts_with('.') || arg.starts_with('~');
        if path.exists() || looks_like_path {
            if !path.is_dir() {
                return Err(bad(
                    "not a folder (a local source is the folder holding config.json and the safetensors)",
                ));
            }
            return Ok(CheckpointSource::Local { path: path.to_path_buf() });
        }
        let (repo, revision) = match arg.split_once('@') {
            Some((repo, rev)) if !rev.is_empty() => (repo, rev),
            Some(_) => return Err(bad("empty revision after `@`")),
            None => (arg, DEFAULT_REVISION),
        };
        if !is_repo_id(repo) {
            return Err(bad(
                "expected a hub repo id `org/name[@revision]`, an http(s):// URL or an existing folder",
            ));
        }
        Ok(CheckpointSource::Hub {
            endpoint: env.endpoint(),
            repo: repo.to_string(),
            revision: revision.to_string(),
        })
    }
}

/// `https://host/a/b@rev` -> (`https://host/a/b`, `rev`); the revision is
/// taken from the last path segment only.
fn split_revision_url(arg: &str) -> (String, String) {
    let trimmed = arg.trim_end_matches('/');
    let last_slash = trimmed.rfind('/').unwrap_or(0);
    match trimmed[last_slash..].find('@') {
        Some(at) if last_slash + at + 1 < trimmed.len() => {
            let at = last_slash + at;
            (trimmed[..at].to_string(), trimmed[at + 1..].to_string())
        }
        _ => (trimmed.to_string(), DEFAULT_REVISION.to_string()),
    }
}

/// `org/name` with the characters the hub allows.
fn is_repo_id(s: &str) -> bool {
    let ok_part =
        |p: &str| !p.is_empty() && !p.starts_with(['.', '-']) && p.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    matches!(s.split_once('/'), Some((org, name)) if ok_part(org) && ok_part(name))
}

/// Percent-encodes `s` for a URL path; `/` is kept when `keep_slash`.
pub(crate) fn encode_path(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        let plain = b.is_ascii_alphanumeric() || b"-._~".contains(&b) || (keep_slash && b == b'/');
        if plain {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A file name from a listing or index is safe to fetch and later to
/// write under a store: relative, no `..`, no empty segment, no NUL.
pub(crate) fn check_file_name(name: &str) -> Result<(), String> {
    let bad = name.is_empty()
        || name.starts_with('/')
        || name.contains('\0')
        || name.contains('\\')
        || name.split('/').any(|seg| seg.is_empty() || seg == "." || seg == "..");
    if bad {
        return Err(format!("unsafe file name `{name}` (must be a relative path without `..`)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> HubEnv {
        HubEnv {
            endpoint: Some("http://hub.test/".into()),
            token: None,
        }
    }

    #[test]
    fn repo_ids_urls_and_folders() {
        let hub = |repo: &str, revision: &str| CheckpointSource::Hub {
            endpoint: "http://hub.test".into(),
            repo: repo.into(),
            revision: revision.into(),
        };
        assert_eq!(
            CheckpointSource::parse("Qwen/Qwen3-30B-A3B", &env()).unwrap(),
            hub("Qwen/Qwen3-30B-A3B", "main")
        );
        assert_eq!(CheckpointSource::parse("org/name@v1.0", &env()).unwrap(), hub("org/name", "v1.0"));
        assert_eq!(
            CheckpointSource::parse("https://mirror.test/org/name@abc/", &env()).unwrap(),
            CheckpointSource::Http {
                base: "https://mirror.test/org/name".into(),
                revision: "abc".into()
            }
        );
        assert_eq!(
            CheckpointSource::parse("http://mirror.test/org/name", &env()).unwrap(),
            CheckpointSource::Http {
                base: "http://mirror.test/org/name".into(),
                revision: "main".into()
            }
        );
        let dir = env!("CARGO_MANIFEST_DIR");
        assert_eq!(
            CheckpointSource::parse(dir, &env()).unwrap(),
            CheckpointSource::Local { path: dir.into() }
        );
        for bad in ["org", "a/b/c", "org/name@", "ftp://x/y", "./no-such-folder", "https://", "/org/x"] {
            let err = CheckpointSource::parse(bad, &env()).unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
        }
        assert_eq!(HubEnv::default().endpoint(), DEFAULT_ENDPOINT);
    }

    #[test]
    fn encoding_and_file_names() {
        assert_eq!(encode_path("refs/pr/1", false), "refs%2Fpr%2F1");
        assert_eq!(encode_path("sub dir/a+b.json", true), "sub%20dir/a%2Bb.json");
        assert!(check_file_name("model-00001-of-00002.safetensors").is_ok());
        assert!(check_file_name("sub/tokenizer.json").is_ok());
        for bad in ["", "/etc/passwd", "../x", "a/../b", "a//b", "a\\b"] {
            assert!(check_file_name(bad).is_err(), "{bad}");
        }
    }
}
