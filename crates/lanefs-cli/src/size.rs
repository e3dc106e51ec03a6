//! Human sizes: "512M", "4G", "64GiB", "1T", or plain bytes.

/// The size parser `lanefs bench` uses too (one grammar for every size option).
pub use lanefs_bench::cli::parse_size;

pub fn show(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("64GiB").unwrap(), 64 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("512m").unwrap(), 512 << 20);
        assert!(parse_size("G").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(show(1 << 30), "1 GiB");
        assert_eq!(show(1536 << 20), "1.5 GiB");
    }
}
