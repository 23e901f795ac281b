//! The server's settings as `larder serve` gives them: the size values its
//! flags accept (`--max-request-bytes`, `--kv-budget`), the default KV budget
//! when none is given, and the model id it serves under by default.

use std::path::Path;

use larder_engine::{ExpertMode, LoadOptions};

/// `--max-request-bytes` range: 1 KiB ..= 1 GiB.
pub const BODY_MIN: u64 = 1 << 10;
/// See [`BODY_MIN`].
pub const BODY_MAX: u64 = 1 << 30;

/// A `--max-request-bytes` value: a size in BODY_MIN..=BODY_MAX.
pub fn body_size(s: &str) -> Result<u64, String> {
    let n = larder_engine::parse_size(s)?;
    if !(BODY_MIN..=BODY_MAX).contains(&n) {
        return Err(format!("{n} bytes is not in 1KiB..=1GiB"));
    }
    Ok(n)
}

/// A `--kv-budget` value: a size of at least 1 MiB.
pub fn kv_size(s: &str) -> Result<u64, String> {
    let n = larder_engine::parse_size(s)?;
    if n < 1 << 20 {
        return Err(format!("{n} bytes is under the least budget of 1MiB"));
    }
    Ok(n)
}

/// The default `--kv-budget`: half of what `available` (MemAvailable at start) leaves after the expert cache's
/// budget (`cache`: 0 when experts are in RAM), at least 64 MiB. The other half is left for the spine, experts
/// held in RAM and everything else on the machine.
pub fn default_kv_budget(available: u64, cache: u64) -> u64 {
    (available.saturating_sub(cache) / 2).max(64 << 20)
}

/// [`default_kv_budget`] for a model loaded with `load`, from MemAvailable
/// now (`None` where it cannot be read: no budget).
pub fn kv_budget_for(load: &LoadOptions) -> Option<u64> {
    let cache = match &load.experts {
        ExpertMode::Stream(o) => o.ram_budget,
        _ => 0,
    };
    Some(default_kv_budget(larder_engine::mem_available()?, cache))
}

/// The model id served by default: the model folder's name (a lazy SOURCE,
/// `org/name` or a URL, when `lazy`, by its last part), else `larder`.
pub fn served_name(model: &Path, lazy: bool) -> String {
    std::fs::canonicalize(model)
        .ok()
        .or_else(|| lazy.then(|| model.to_path_buf()))
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "larder".into())
}

#[cfg(test)]
mod tests {
    use super::default_kv_budget;

    #[test]
    fn kv_default_is_half_of_what_the_cache_leaves() {
        assert_eq!(default_kv_budget(8 << 30, 2 << 30), 3 << 30);
        assert_eq!(default_kv_budget(8 << 30, 0), 4 << 30);
        assert_eq!(default_kv_budget(1 << 30, 4 << 30), 64 << 20);
    }
}
