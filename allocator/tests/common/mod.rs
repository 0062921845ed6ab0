//! Helpers shared by the allocator's integration tests.
#![allow(dead_code)]

use rmm_allocator::Device;
use rmm_allocator::backend::{self, BackendKind, SimBackend, SimConfig, SimMemoryMode};

/// Device 0 of the process-wide backend (`RMM_BACKEND` picks it: sim in CI, cuda on a GPU).
pub fn device() -> Device {
    Device::new(0).expect("device 0 of the process-wide backend")
}

/// A simulated device of its own, of `capacity` bytes, whose memory is addresses only
/// (unbacked): for tests of sizes and placement, whatever `RMM_BACKEND` says.
pub fn unbacked_sim(capacity: usize) -> (&'static SimBackend, Device) {
    let b = SimBackend::leak(SimConfig {
        devices: 1,
        capacity,
        mode: SimMemoryMode::Unbacked,
    })
    .expect("a simulated device");
    (
        b,
        Device::on(b, 0).expect("device 0 of the simulated backend"),
    )
}

/// True when the process-wide backend is the simulated device.
pub fn on_sim() -> bool {
    backend::global().expect("backend").kind() == BackendKind::Sim
}

/// Deterministic pseudo-random bytes (xorshift), so failures reproduce.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

pub const GIB: usize = 1 << 30;
pub const MIB: usize = 1 << 20;

/// Says on standard error that `test` checks nothing in this environment, and why, as one
/// `SKIP <test>: <why>` line (the nextest configuration shows these tests' output even when
/// they pass): a test that cannot run must never pass silently.
pub fn skip(test: &str, why: &str) {
    eprintln!("SKIP {test}: {why}");
}
