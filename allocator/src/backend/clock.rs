//! The allocator's clocks: the kernel's coarse clocks (the last timer tick, far cheaper than the
//! precise ones), the precise real-time clock, and a *ticking* coarse clock: while a [`Ticker`]
//! lives, a thread stores the coarse time every [`TICK`], so a hot path reads one atomic.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

/// Nanoseconds since the Unix epoch, from the precise system clock.
pub(crate) fn realtime_ns() -> u64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    d.as_secs()
        .wrapping_mul(1_000_000_000)
        .wrapping_add(u64::from(d.subsec_nanos()))
}

/// How often the clock thread stores the time (the coarse clock moves every 1 to 10 ms).
pub(crate) const TICK: Duration = Duration::from_millis(1);

static NOW_NS: AtomicU64 = AtomicU64::new(0);
static TICKING: AtomicBool = AtomicBool::new(false);
/// (adaptors alive, clock thread running).
static STATE: Mutex<(usize, bool)> = Mutex::new((0, false));

/// The coarse time in nanoseconds, as recently as [`TICK`] (plus scheduling delays).
#[inline(always)]
pub(crate) fn ticking_monotonic_ns() -> u64 {
    if TICKING.load(Ordering::Relaxed) {
        NOW_NS.load(Ordering::Relaxed)
    } else {
        coarse_monotonic_ns()
    }
}

/// Keeps the clock thread running while it lives (one per tracking adaptor).
pub(crate) struct Ticker(());

impl Ticker {
    /// Starts the clock thread, unless one runs.
    pub(crate) fn start() -> Ticker {
        let mut state = STATE.lock();
        state.0 += 1;
        if !state.1 {
            NOW_NS.store(coarse_monotonic_ns(), Ordering::Relaxed);
            let spawned = std::thread::Builder::new()
                .name("rmm-tracking-clock".into())
                .spawn(tick);
            state.1 = spawned.is_ok();
            TICKING.store(state.1, Ordering::Relaxed);
        }
        Ticker(())
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        STATE.lock().0 -= 1;
    }
}

fn tick() {
    loop {
        NOW_NS.store(coarse_monotonic_ns(), Ordering::Relaxed);
        std::thread::sleep(TICK);
        let mut state = STATE.lock();
        if state.0 == 0 {
            // The last adaptor is gone; the next one starts a new thread.
            state.1 = false;
            TICKING.store(false, Ordering::Relaxed);
            return;
        }
    }
}

/// Nanoseconds since the Unix epoch from `CLOCK_REALTIME_COARSE` (off Linux, the precise clock).
pub(crate) fn coarse_realtime_ns() -> u64 {
    #[cfg(target_os = "linux")]
    {
        read(libc::CLOCK_REALTIME_COARSE)
    }
    #[cfg(not(target_os = "linux"))]
    {
        realtime_ns()
    }
}

/// Nanoseconds of `CLOCK_MONOTONIC_COARSE`, `Instant`'s clock (off Linux, since the first call).
pub(crate) fn coarse_monotonic_ns() -> u64 {
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
    // SAFETY: `clock_gettime` writes one `timespec` into a live local; on error it stays zeroed
    // (time 0, which callers treat as "unknown, read precisely").
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}
