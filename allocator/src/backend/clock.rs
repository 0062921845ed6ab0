//! The kernel's coarse clocks (the last timer tick, every 1 to 10 ms; cheaper than precise ones):
//! the system call only, read through the `sync` module's clock.

/// Nanoseconds since the Unix epoch from `CLOCK_REALTIME_COARSE` (off Linux, the precise clock).
pub fn coarse_realtime_ns() -> u64 {
    #[cfg(target_os = "linux")]
    {
        read(libc::CLOCK_REALTIME_COARSE)
    }
    #[cfg(not(target_os = "linux"))]
    {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }
}

/// Nanoseconds of `CLOCK_MONOTONIC_COARSE`, `Instant`'s clock (off Linux, since the first call).
pub fn coarse_monotonic_ns() -> u64 {
    #[cfg(target_os = "linux")]
    {
        read(libc::CLOCK_MONOTONIC_COARSE)
    }
    #[cfg(not(target_os = "linux"))]
    {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        START
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_nanos() as u64
    }
}

#[cfg(target_os = "linux")]
fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes one `timespec` through a pointer to a live, writable local;
    // the coarse clocks exist on every supported Linux. On error `ts` stays zeroed (time 0, which
    // callers treat as "unknown, read precisely").
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}
