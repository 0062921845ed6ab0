//! The kernel's coarse clocks: the time of the last timer tick (every 1 to 10 ms), cheaper to
//! read than the precise clocks. This is the system call only; the allocator reads its clocks
//! through the `sync` module's clock, which calls these.

/// Nanoseconds since the Unix epoch, from `CLOCK_REALTIME_COARSE` (elsewhere than Linux, the
/// precise system clock).
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

/// Nanoseconds of `CLOCK_MONOTONIC_COARSE`, the clock `Instant` reads precisely (elsewhere
/// than Linux, nanoseconds since the first call).
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
    // SAFETY: `clock_gettime` writes one `timespec` through the pointer, which points to a
    // live, writable local; the coarse clocks exist on every supported Linux. On an error
    // `ts` stays zeroed (a time of 0, which callers treat as "unknown, read precisely").
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}
