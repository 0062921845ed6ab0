//! `ConfigLoader::from_config`: the running configuration with a change, nothing else.

mod common;

use common::{load, load_env};
use rmm_config::{Config, ConfigLoader, DeviceOverride, Devices, Size, Source};

/// A configuration far from the defaults in every section.
fn busy() -> Config {
    load(
        r#"
devices = "all"
workers_per_device = 2
[pool]
enabled = true
initial_size = "1.5 GB"
maximum_size = 0.3
[logging]
enabled = true
directory = "logs dir"
[limits]
device_memory_limit = "none"
[spill]
enabled = true
device_memory_limit = "12.5%"
host_pool_size = "none"
disk_directory = "/tmp/spill"
[stats]
enabled = true
[device.7]
spill.device_memory_limit = "1KiB"
limits.device_memory_limit = "none"
"#,
    )
    .unwrap()
}

#[test]
fn a_config_reloaded_from_itself_is_equal_with_its_sources() {
    for config in [
        Config::default(),
        busy(),
        load_env(&[("RMM_POOL__ASYNC", "1"), ("RMM_DEVICES", "0,1")]).unwrap(),
    ] {
        let back = ConfigLoader::from_config(&config).load().unwrap();
        assert_eq!(back, config);
        for v in config.effective_values() {
            assert_eq!(back.source(&v.key), v.source, "{}", v.key);
        }
    }
}

#[test]
fn one_change_keeps_every_other_key() {
    let running = busy();
    let next = ConfigLoader::from_config(&running)
        .set("pool.enabled", false)
        .load()
        .unwrap();
    assert!(!next.pool.enabled);
    assert_eq!(next.source("pool.enabled"), Source::Code);
    // The issue's case: devices, workers and spilling stay as they run.
    assert_eq!(next.devices, Devices::All);
    assert_eq!(next.workers_per_device, 2);
    assert!(next.spill.enabled);
    assert_eq!(next.spill.host_pool_size, None);
    assert_eq!(
        next.spill.disk_directory.as_deref(),
        Some(std::path::Path::new("/tmp/spill"))
    );
    assert_eq!(next.device, running.device);
    let mut expected = running.clone();
    expected.pool.enabled = false;
    assert_eq!(next, expected);
}

#[test]
fn the_environment_does_not_come_back_on_top() {
    // `from_config` reads no environment: a variable set since the config loaded (or
    // overridden in code then) does not undo the running values.
    let running = ConfigLoader::new()
        .no_file()
        .env_from([("RMM_WORKERS_PER_DEVICE", "3")])
        .set("workers_per_device", 5)
        .load()
        .unwrap();
    let next = ConfigLoader::from_config(&running)
        .env_from([("RMM_WORKERS_PER_DEVICE", "3")])
        .load()
        .unwrap();
    assert_eq!(running.workers_per_device, 5);
    // An explicit environment given afterwards is a layer like any other.
    assert_eq!(next.workers_per_device, 3);
    let plain = ConfigLoader::from_config(&running).load().unwrap();
    assert_eq!(plain.workers_per_device, 5);
}

#[test]
fn a_change_is_checked_like_any_other_and_a_bad_one_names_its_key() {
    let running = busy();
    let err = ConfigLoader::from_config(&running)
        .set("pool.initial_size", "lots")
        .load()
        .unwrap_err()
        .to_string();
    assert!(err.contains("pool.initial_size"), "{err}");
    assert!(err.contains("lots"), "{err}");
}

#[test]
fn fields_changed_in_code_after_loading_are_kept() {
    let mut running = busy();
    running.workers_per_device = 4;
    running.spill.host_pool_size = Some(Size::Bytes(16 << 20));
    let mut o = DeviceOverride::default();
    o.pool.release_threshold = Some(None);
    running.device.insert(3, o);
    let next = ConfigLoader::from_config(&running).load().unwrap();
    assert_eq!(next, running);
}
