//! Byte sizes as users write them (`512MiB`, `96GiB`, `1.5G`, `4096`).

/// Parses a size: a number with an optional unit `B`, `K/KB/KiB`, `M/MB/MiB`,
/// `G/GB/GiB`, `T/TB/TiB` (case-insensitive). `KB`-style decimal units are
/// powers of 1000, `KiB` and bare `K` powers of 1024.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid size {text:?}: expected a number with an optional unit such as 512MiB or 8GiB"))?;
    let unit = unit.trim().to_ascii_lowercase();
    let mult: f64 = match unit.as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "kb" => 1e3,
        "m" | "mib" => 1024.0 * 1024.0,
        "mb" => 1e6,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "gb" => 1e9,
        "t" | "tib" => 1024f64.powi(4),
        "tb" => 1e12,
        _ => {
            return Err(format!(
                "invalid size {text:?}: unknown unit {unit:?} (use B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB)"
            ))
        }
    };
    let bytes = value * mult;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("invalid size {text:?}: out of range"));
    }
    Ok(bytes.round() as u64)
}

/// `1.50 GiB`-style rendering for messages.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("96GiB").unwrap(), 96 << 30);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("2 GB").unwrap(), 2_000_000_000);
        assert_eq!(parse_size("8k").unwrap(), 8192);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("5 parsecs").is_err());
        assert!(parse_size("-1G").is_err());
        assert_eq!(format_size(3 << 29), "1.50 GiB");
    }
}
