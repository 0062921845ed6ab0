//! The one unit convention of `rmm`'s output: binary units for sizes (KiB, MiB, GiB: powers of
//! 1024, as CUDA, `nvidia-smi` and RMM report device memory) and for bandwidths (GiB/s). JSON
//! keeps raw numbers: bytes and seconds.

use crate::table::NONE;

const GIB: f64 = (1u64 << 30) as f64;

/// `bytes` in binary units (`"1.50 GiB"`, `"256 B"`).
pub fn bytes(bytes: u64) -> String {
    rmm::allocator::fmt_bytes(usize::try_from(bytes).unwrap_or(usize::MAX))
}

/// `bytes` in binary units, or [`NONE`] for zero (nothing to show, e.g. nothing spilled).
pub fn bytes_or_none(n: u64) -> String {
    if n == 0 { NONE.into() } else { bytes(n) }
}

/// Bytes per second in GiB/s; `None` without bytes or time.
pub fn gib_per_second(bytes: u64, seconds: f64) -> Option<f64> {
    (bytes > 0 && seconds > 0.0 && seconds.is_finite()).then(|| bytes as f64 / seconds / GIB)
}

/// `"128.0 MiB at 5.2 GiB/s"`, `"128.0 MiB"` without a time, [`NONE`] when nothing moved.
pub fn bytes_at_rate(n: u64, seconds: f64) -> String {
    match (n, gib_per_second(n, seconds)) {
        (0, _) => NONE.into(),
        (n, Some(r)) => format!("{} at {r:.1} GiB/s", bytes(n)),
        (n, None) => bytes(n),
    }
}

/// A duration for a table: milliseconds below a second (`"812.4 ms"`), seconds above
/// (`"2.29 s"`).
pub fn duration(seconds: f64) -> String {
    if seconds < 1.0 {
        format!("{:.1} ms", seconds * 1e3)
    } else {
        format!("{seconds:.2} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_rates_are_binary_and_zero_shows_nothing() {
        assert_eq!(bytes(3 << 30), "3.00 GiB");
        assert_eq!(bytes_or_none(0), NONE);
        assert_eq!(bytes_at_rate(0, 1.0), NONE);
        assert_eq!(bytes_at_rate(2 << 30, 0.5), "2.00 GiB at 4.0 GiB/s");
        assert_eq!(bytes_at_rate(1 << 30, 0.0), "1.00 GiB");
        assert_eq!(gib_per_second(1 << 30, 0.0), None);
        assert_eq!(duration(0.0125), "12.5 ms");
        assert_eq!(duration(2.2866), "2.29 s");
    }
}
