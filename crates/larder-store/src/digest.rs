//! Record digests: XXH3-128 (fast enough to check every record read at disk
//! speed on one core), written `xxh3-128:<32 hex digits>`.
//!
//! A record's digest is *bound* to its place: it is seeded with a 64-bit
//! hash of what the record is (store, layer, expert, components' dtypes,
//! shapes and layout; see [`crate::record`]), so the same bytes under another
//! expert id, dtype or store give another digest and a swapped record fails.

use std::fmt;

/// A 128-bit XXH3 digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest(pub u128);

impl Digest {
    /// Digest of the concatenation of `parts`.
    pub fn of_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Digest {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for p in parts {
            h.update(p);
        }
        Digest(h.digest128())
    }

    /// Digest of the concatenation of `parts`, seeded with `seed` (0 is the
    /// unseeded digest of [`of_parts`](Self::of_parts)).
    pub(crate) fn of_parts_seeded<'a>(seed: u64, parts: impl IntoIterator<Item = &'a [u8]>) -> Digest {
        let mut h = xxhash_rust::xxh3::Xxh3::with_seed(seed);
        for p in parts {
            h.update(p);
        }
        Digest(h.digest128())
    }

    /// The 64-bit seed that binds a digest to `what` (a description of the bytes' place).
    pub(crate) fn seed_of(what: &[u8]) -> u64 {
        xxhash_rust::xxh3::xxh3_64(what)
    }

    pub fn of(bytes: &[u8]) -> Digest {
        Digest(xxhash_rust::xxh3::xxh3_128(bytes))
    }

    /// Parses `xxh3-128:<hex>`.
    pub fn parse(s: &str) -> Option<Digest> {
        let hex = s.strip_prefix("xxh3-128:")?;
        if hex.len() != 32 {
            return None;
        }
        u128::from_str_radix(hex, 16).ok().map(Digest)
    }
}

/// GB/s one core checks record digests at: the best of a few passes over
/// `bytes` of data (out of cache when larger than the last-level cache), as
/// the planner charges every record read.
pub fn check_gbps(bytes: usize) -> f64 {
    let data: Vec<u8> = (0..bytes.max(1)).map(|i| (i * 131 % 251) as u8).collect();
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = std::time::Instant::now();
        std::hint::black_box(Digest::of_parts_seeded(7, [&data[..]]));
        best = best.min(t.elapsed().as_secs_f64());
    }
    data.len() as f64 / best.max(1e-9) / 1e9
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "xxh3-128:{:032x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_speed_is_a_positive_figure() {
        let g = check_gbps(1 << 20);
        assert!(g.is_finite() && g > 0.0);
    }

    #[test]
    fn roundtrip_and_parts() {
        let d = Digest::of(b"hello world");
        assert_eq!(Digest::parse(&d.to_string()), Some(d));
        assert_eq!(Digest::of_parts([&b"hello "[..], &b"world"[..]]), d);
        assert_eq!(Digest::parse("md5:00"), None);
        assert_eq!(Digest::of_parts_seeded(0, [&b"hello world"[..]]), d);
        let seeded = Digest::of_parts_seeded(Digest::seed_of(b"layer 1 expert 2"), [&b"hello world"[..]]);
        assert_ne!(seeded, d);
        assert_ne!(
            seeded,
            Digest::of_parts_seeded(Digest::seed_of(b"layer 1 expert 3"), [&b"hello world"[..]])
        );
    }
}
