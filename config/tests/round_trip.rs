//! Config → TOML → Config gives an equal value.

mod common;

use common::{load, load_env};
use rmm_config::{Config, DeviceOverride, DeviceSelector, Devices, Size};

fn round_trip(config: &Config) {
    let text = config.to_toml().unwrap();
    let back = Config::from_toml_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(&back, config, "{text}");
    // And the text is stable.
    assert_eq!(back.to_toml().unwrap(), text);
}

#[test]
fn defaults_round_trip() {
    round_trip(&Config::default());
}

#[test]
fn a_loaded_config_round_trips() {
    let config = load(
        r#"
backend = "cuda"
devices = [0, "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", 3]
workers_per_device = 8
[pool]
enabled = true
async = true
initial_size = "1.5 GB"
maximum_size = 0.3
release_threshold = 1001
[logging]
enabled = true
directory = "logs dir/with spaces"
level = "trace"
[limits]
device_memory_limit = "33.3%"
[spill]
enabled = true
device_memory_limit = "12.5%"
host_pool_size = "none"
on_demand = false
eager_unspill = true
disk_directory = "/tmp/spill"
[stats]
enabled = true
[tracking]
enabled = true
backtraces = true
[device.0]
pool.initial_size = "auto"
[device.7]
spill.device_memory_limit = "1KiB"
limits.device_memory_limit = "none"
"#,
    )
    .unwrap();
    round_trip(&config);
}

#[test]
fn an_environment_config_round_trips() {
    let config = load_env(&[
        ("RMM_DEVICES", "all"),
        ("RMM_POOL__ASYNC", "1"),
        ("RMM_POOL__INITIAL_SIZE", "0.123456789"),
        ("RMM_DEVICE__2__POOL__MAXIMUM_SIZE", "1.1 TB"),
    ])
    .unwrap();
    round_trip(&config);
}

#[test]
fn a_config_built_in_code_round_trips() {
    let mut config = Config::default();
    config.devices = Devices::List(vec![DeviceSelector::Ordinal(u32::MAX)]);
    config.pool.maximum_size = Some(Size::Bytes(u64::MAX));
    config.spill.device_memory_limit = Size::Fraction(1.0 / 3.0);
    let mut o = DeviceOverride::default();
    o.pool.release_threshold = Some(None);
    o.spill.host_pool_size = Some(Some(Size::Bytes(12345)));
    config.device.insert(4, o);
    round_trip(&config);
}
