//! A runtime on one device never starts rayon's thread pool: its switches run each device's
//! step on the calling thread. (A test binary of its own: rayon's pool is process-wide.)

mod common;

use common::{config, devices};
use rmm_runtime::Runtime;

#[test]
fn starting_and_switching_on_one_device_starts_no_rayon_threads() {
    common::sim();
    let plain = || {
        config(&[
            ("devices", toml::Value::from(devices(1))),
            ("workers_per_device", toml::Value::from(1)),
            ("spill.enabled", toml::Value::from(true)),
        ])
    };
    let rt = Runtime::start(&plain()).unwrap();
    rt.reinitialize(&config(&[
        ("devices", toml::Value::from(devices(1))),
        ("workers_per_device", toml::Value::from(1)),
        ("pool.enabled", toml::Value::from(true)),
        ("pool.initial_size", toml::Value::from("64MiB")),
        ("spill.enabled", toml::Value::from(true)),
    ]))
    .unwrap();
    rt.reinitialize(&plain()).unwrap();
    // Building the global pool succeeds only if nothing started it.
    assert!(
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build_global()
            .is_ok(),
        "rayon's global pool was started by a runtime on one device"
    );
    drop(rt);
}
