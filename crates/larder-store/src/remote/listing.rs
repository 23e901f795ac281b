//! File listings: what a source holds. The hub answers
//! `GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true` with
//! `{"sha": <commit>, "siblings": [{"rfilename", "size", "lfs": {"sha256",
//! "size"}}]}` (`lfs` only for LFS files; `size` and `lfs` only with
//! `blobs=true`); a plain base URL has no listing API, so its files are the
//! shards named by `model.safetensors.index.json` (or `model.safetensors`
//! alone) plus the known small files that exist.

use std::collections::BTreeSet;

use serde::Deserialize;

use super::error::RemoteError;
use super::source::check_file_name;

/// Small files a checkpoint may ship beside its safetensors; probed on a
/// plain base URL (`config.json` is required, the rest optional).
pub(crate) const KNOWN_SMALL_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "tiktoken.model",
];

/// The sharded checkpoint index a plain base URL must serve (or a single
/// [`SINGLE_FILE`]).
pub(crate) const INDEX_FILE: &str = "model.safetensors.index.json";
pub(crate) const SINGLE_FILE: &str = "model.safetensors";

/// One file of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedFile {
    /// Path relative to the repo root.
    pub name: String,
    /// Size in bytes, when the listing says.
    pub size: Option<u64>,
    /// Lowercase hex sha256 of the content (the hub's LFS oid), when known.
    pub sha256: Option<String>,
}

/// What a source holds at one revision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// The commit the revision resolved to (hub only); reads after the
    /// listing use it, so every file comes from the same commit.
    pub commit: Option<String>,
    pub files: Vec<ListedFile>,
}

impl Listing {
    pub fn get(&self, name: &str) -> Option<&ListedFile> {
        self.files.iter().find(|f| f.name == name)
    }
}

#[derive(Deserialize)]
struct HubRepoInfo {
    sha: Option<String>,
    siblings: Vec<HubSibling>,
}

#[derive(Deserialize)]
struct HubSibling {
    rfilename: String,
    size: Option<u64>,
    lfs: Option<HubLfs>,
}

#[derive(Deserialize)]
struct HubLfs {
    sha256: String,
    size: u64,
}

/// Parses the hub's repo-info JSON (fetched from `url`).
pub(crate) fn parse_hub_listing(url: &str, body: &[u8]) -> Result<Listing, RemoteError> {
    let bad = |reason: String| RemoteError::BadListing {
        url: url.to_string(),
        reason,
    };
    let info: HubRepoInfo = serde_json::from_slice(body).map_err(|e| bad(format!("not the hub's repo JSON: {e}")))?;
    let mut files = Vec::with_capacity(info.siblings.len());
    for s in info.siblings {
        check_file_name(&s.rfilename).map_err(bad)?;
        let (size, sha256) = match s.lfs {
            Some(lfs) => {
                if !is_sha256(&lfs.sha256) {
                    return Err(bad(format!("`{}`: lfs.sha256 `{}` is not a sha256", s.rfilename, lfs.sha256)));
                }
                if s.size.is_some_and(|n| n != lfs.size) {
                    return Err(bad(format!("`{}`: size and lfs.size differ", s.rfilename)));
                }
                (Some(lfs.size), Some(lfs.sha256.to_ascii_lowercase()))
            }
            None => (s.size, None),
        };
        files.push(ListedFile {
            name: s.rfilename,
            size,
            sha256,
        });
    }
    Ok(Listing { commit: info.sha, files })
}

#[derive(Deserialize)]
struct SafetensorsIndex {
    weight_map: std::collections::BTreeMap<String, String>,
}

/// The shard names a `model.safetensors.index.json` (fetched from `url`)
/// points at, each once, in name order.
pub(crate) fn index_shards(url: &str, body: &[u8]) -> Result<Vec<String>, RemoteError> {
    let bad = |reason: String| RemoteError::BadListing {
        url: url.to_string(),
        reason,
    };
    let index: SafetensorsIndex = serde_json::from_slice(body).map_err(|e| bad(format!("not a safetensors index (`weight_map`): {e}")))?;
    let shards: BTreeSet<String> = index.weight_map.into_values().collect();
    if shards.is_empty() {
        return Err(bad("weight_map names no shard".into()));
    }
    for s in &shards {
        check_file_name(s).map_err(bad)?;
    }
    Ok(shards.into_iter().collect())
}

/// 64 hex digits.
pub(crate) fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_listing_with_blobs() {
        let sha = "a".repeat(64);
        let body = format!(
            r#"{{"id":"o/n","sha":"c0ffee","siblings":[
                {{"rfilename":"config.json","blobId":"x","size":12}},
                {{"rfilename":"model.safetensors","size":99,"lfs":{{"sha256":"{sha}","size":99,"pointerSize":134}}}}]}}"#
        );
        let l = parse_hub_listing("u", body.as_bytes()).unwrap();
        assert_eq!(l.commit.as_deref(), Some("c0ffee"));
        assert_eq!(l.get("config.json").unwrap().size, Some(12));
        assert_eq!(l.get("model.safetensors").unwrap().sha256.as_deref(), Some(sha.as_str()));
        let err = parse_hub_listing("http://x/api", br#"{"siblings":[{"rfilename":"../x"}]}"#).unwrap_err();
        assert!(
            err.to_string().contains("http://x/api") && err.to_string().contains("../x"),
            "{err}"
        );
        assert!(parse_hub_listing("u", b"[]").is_err());
    }

    #[test]
    fn index_names_each_shard_once() {
        let body = br#"{"metadata":{},"weight_map":{"a":"s2.safetensors","b":"s1.safetensors","c":"s2.safetensors"}}"#;
        assert_eq!(index_shards("u", body).unwrap(), vec!["s1.safetensors", "s2.safetensors"]);
        assert!(index_shards("u", br#"{"weight_map":{}}"#).is_err());
        assert!(index_shards("u", br#"{"weight_map":{"a":"/abs"}}"#).is_err());
    }
}
