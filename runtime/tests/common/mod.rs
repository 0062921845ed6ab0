//! Helpers shared by the runtime's integration tests.
#![allow(dead_code)]

pub mod faults;
pub mod foreign;

use std::sync::{Mutex, MutexGuard, OnceLock};

use rmm_allocator::backend::{self, Backend, BackendKind, SimBackend, SimConfig, SimMemoryMode};
use rmm_config::{Config, ConfigLoader};

/// Devices of the simulated backend these tests install (when not on a GPU).
pub const SIM_DEVICES: u32 = 4;
/// Memory of each simulated device.
pub const SIM_MEMORY: usize = 2 << 30;

static SIM: OnceLock<Option<&'static SimBackend>> = OnceLock::new();
static SERIAL: Mutex<()> = Mutex::new(());

/// Under `cargo test` the tests of one file share a process, and with it the per-device
/// resource table: each test takes this lock (under nextest each test is its own process).
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Installs the process-wide backend: the GPU when `RMM_BACKEND=cuda`, else a backed
/// simulated backend of [`SIM_DEVICES`] devices. Returns the simulated backend, if that is it.
pub fn sim() -> Option<&'static SimBackend> {
    *SIM.get_or_init(|| {
        if std::env::var("RMM_BACKEND").is_ok_and(|v| v.eq_ignore_ascii_case("cuda")) {
            backend::global().expect("RMM_BACKEND=cuda needs a CUDA driver and a GPU");
            return None;
        }
        let sim = SimBackend::leak(SimConfig {
            devices: SIM_DEVICES,
            capacity: SIM_MEMORY,
            mode: SimMemoryMode::Backed,
        })
        .expect("simulated backend");
        match backend::install_global(sim) {
            Ok(()) => Some(sim),
            Err(existing) => {
                assert_eq!(
                    existing.kind(),
                    BackendKind::Sim,
                    "another backend installed"
                );
                None
            }
        }
    })
}

/// The process-wide backend, installed by [`sim`].
pub fn backend() -> &'static dyn Backend {
    sim();
    backend::global().expect("backend")
}

/// Device count of the backend.
pub fn device_count() -> u32 {
    backend().device_count()
}

/// The first `n` devices (fewer on a machine that has fewer), as a `devices` list.
pub fn devices(n: u32) -> Vec<i64> {
    (0..n.min(device_count())).map(i64::from).collect()
}

/// A configuration from code only (no file, no environment), with `settings` applied.
pub fn config(settings: &[(&str, toml::Value)]) -> Config {
    let mut loader = ConfigLoader::new().no_file().no_env();
    for (key, value) in settings {
        loader = loader.set(*key, value.clone());
    }
    loader.load().expect("test configuration loads")
}

/// `devices = [0..n)`, `workers_per_device = w`, pool of 64 MiB, and `more`.
pub fn pooled(n: u32, w: i64, more: &[(&str, toml::Value)]) -> Config {
    let mut settings = vec![
        ("devices", toml::Value::from(devices(n))),
        ("workers_per_device", toml::Value::from(w)),
        ("pool.enabled", toml::Value::from(true)),
        ("pool.initial_size", toml::Value::from("64MiB")),
    ];
    settings.extend(more.iter().cloned());
    config(&settings)
}

/// One device, a pool of 256 MiB, two workers, spilling with a `limit` device limit, a `host`
/// pinned pool, a disk tier under `disk` when given, and `more` settings.
pub fn spilling(
    limit: &str,
    host: &str,
    disk: Option<&std::path::Path>,
    more: &[(&str, toml::Value)],
) -> Config {
    let mut settings = vec![
        ("devices", toml::Value::from(devices(1))),
        ("workers_per_device", toml::Value::from(2)),
        ("pool.enabled", toml::Value::from(true)),
        ("pool.initial_size", toml::Value::from("256MiB")),
        ("spill.enabled", toml::Value::from(true)),
        ("spill.device_memory_limit", toml::Value::from(limit)),
        ("spill.host_pool_size", toml::Value::from(host)),
    ];
    if let Some(d) = disk {
        settings.push((
            "spill.disk_directory",
            toml::Value::from(d.to_str().expect("a UTF-8 temporary path")),
        ));
    }
    settings.extend(more.iter().cloned());
    config(&settings)
}

/// Deterministic pseudo-random bytes (xorshift), so failures reproduce.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Live device allocations on `device` as the simulated device counts them (`None` on a GPU).
pub fn sim_live(device: u32) -> Option<usize> {
    sim().map(|s| s.live_allocations(device))
}

/// Reads a spillable buffer through the device for work on `stream`: brings it back if it
/// was spilled, then copies its bytes out.
pub fn read_on_device(
    b: &rmm_allocator::spill::SpillableBuffer,
    stream: rmm_allocator::StreamView,
) -> Vec<u8> {
    let guard = b.device_view(stream).unwrap();
    let mut out = vec![0u8; b.size()];
    rmm_allocator::synchronize_stream(b.device(), stream).unwrap();
    b.device().copy_to_host(&mut out, guard.ptr()).unwrap();
    out
}

/// Says on standard error that `test` checks nothing in this environment, and why, as one
/// `SKIP <test>: <why>` line (the nextest configuration shows these tests' output even when
/// they pass): a test that cannot run must never pass silently.
pub fn skip(test: &str, why: &str) {
    eprintln!("SKIP {test}: {why}");
}

/// Caps the size of files this process writes while alive (writes past it fail with EFBIG
/// instead of raising SIGXFSZ).
pub struct FileSizeCap {
    old: libc::rlimit,
}

impl FileSizeCap {
    /// Caps files at `bytes` until dropped.
    pub fn new(bytes: u64) -> FileSizeCap {
        let mut old = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: plain system calls on valid, owned structures.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut old), 0);
            let cap = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: old.rlim_max,
            };
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &cap), 0);
        }
        FileSizeCap { old }
    }
}

impl Drop for FileSizeCap {
    fn drop(&mut self) {
        // SAFETY: restores the limit read in `new`.
        unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &self.old) };
    }
}

/// The sizes of the spill files process `pid` holds open in `dir`: spill files have no name
/// (see `rmm_allocator::spill`'s disk tier), so they are found through the process's open
/// files (`/proc/<pid>/fd`), the names of which point into `dir`.
pub fn open_spill_files_of(pid: u32, dir: &std::path::Path) -> Vec<u64> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let fds = std::path::PathBuf::from(format!("/proc/{pid}/fd"));
    let Ok(entries) = std::fs::read_dir(&fds) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|target| target.parent() == Some(&*dir))
        })
        // Through the link: the file itself, which has no name.
        .filter_map(|fd| std::fs::metadata(fd.path()).ok().map(|m| m.len()))
        .collect()
}

/// The sizes of the spill files this process holds open in `dir` ([`open_spill_files_of`]).
pub fn open_spill_files(dir: &std::path::Path) -> Vec<u64> {
    open_spill_files_of(std::process::id(), dir)
}

/// The names in `dir`: none while spill files have no name and the probe at start-up is gone.
pub fn names_in(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}
