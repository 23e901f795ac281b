//! Record digests: XXH3-128 (fast enough to check every record read at disk
//! speed on one core), written `xxh3-128:<32 hex digits>`.

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

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "xxh3-128:{:032x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_parts() {
        let d = Digest::of(b"hello world");
        assert_eq!(Digest::parse(&d.to_string()), Some(d));
        assert_eq!(Digest::of_parts([&b"hello "[..], &b"world"[..]]), d);
        assert_eq!(Digest::parse("md5:00"), None);
    }
}
