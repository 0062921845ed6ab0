//! Every key from TOML, from the environment and from code; layering and sources.

mod common;

use common::{GIB, load, load_env};
use rmm_allocator::backend::BackendChoice;
use rmm_config::{
    Config, ConfigLoader, DeviceOverride, DeviceSelector, Devices, LogLevel, Overhead, PinAhead,
    Size, Source, Switch, render,
};

/// Every key set to a value other than its default.
const EVERY_KEY: &str = r#"
backend = "sim"
devices = ["GPU-aaaa", 1]
workers_per_device = 4

[pool]
enabled = true
managed = false
async = true
initial_size = "2GiB"
maximum_size = "50%"
release_threshold = 1073741824
growth = "256MiB"
vmm = true
max_overhead = "5%"

[logging]
enabled = true
directory = "/tmp/rmm-logs"
file_name = "mylog.csv"
level = "debug"

[limits]
device_memory_limit = 0.9

[spill]
enabled = true
device_memory_limit = "1.5 GB"
host_pool_size = "16GiB"
pin_ahead = "none"
on_demand = false
eager_unspill = true
disk_directory = "/scratch/spill"

[stats]
enabled = true

[tracking]
enabled = true
backtraces = true

[device.1]
pool.initial_size = "8GiB"
pool.maximum_size = "none"
pool.release_threshold = "512MB"
pool.growth = "5%"
limits.device_memory_limit = "70%"
spill.device_memory_limit = 0.6
spill.host_pool_size = "1GiB"
"#;

/// The same settings as environment variables.
const EVERY_VAR: &[(&str, &str)] = &[
    ("RMM_BACKEND", "SIM"),
    ("RMM_DEVICES", "GPU-aaaa, 1"),
    ("RMM_WORKERS_PER_DEVICE", "4"),
    ("RMM_POOL__ENABLED", "true"),
    ("RMM_POOL__MANAGED", "no"),
    ("RMM_POOL__ASYNC", "1"),
    ("RMM_POOL__INITIAL_SIZE", "2GiB"),
    ("RMM_POOL__MAXIMUM_SIZE", "50%"),
    ("RMM_POOL__RELEASE_THRESHOLD", "1073741824"),
    ("RMM_POOL__GROWTH", "256MiB"),
    ("RMM_POOL__VMM", "on"),
    ("RMM_POOL__MAX_OVERHEAD", "5%"),
    ("RMM_LOGGING__ENABLED", "on"),
    ("RMM_LOGGING__DIRECTORY", "/tmp/rmm-logs"),
    ("RMM_LOGGING__FILE_NAME", "mylog.csv"),
    ("RMM_LOGGING__LEVEL", "DEBUG"),
    ("RMM_LIMITS__DEVICE_MEMORY_LIMIT", "0.9"),
    ("RMM_SPILL__ENABLED", "yes"),
    ("RMM_SPILL__DEVICE_MEMORY_LIMIT", "1.5 GB"),
    ("RMM_SPILL__HOST_POOL_SIZE", "16GiB"),
    ("RMM_SPILL__PIN_AHEAD", "NONE"),
    ("RMM_SPILL__ON_DEMAND", "false"),
    ("RMM_SPILL__EAGER_UNSPILL", "TRUE"),
    ("RMM_SPILL__DISK_DIRECTORY", "/scratch/spill"),
    ("RMM_STATS__ENABLED", "1"),
    ("RMM_TRACKING__ENABLED", "true"),
    ("RMM_TRACKING__BACKTRACES", "true"),
    ("RMM_DEVICE__1__POOL__INITIAL_SIZE", "8GiB"),
    ("RMM_DEVICE__1__POOL__MAXIMUM_SIZE", "none"),
    ("RMM_DEVICE__1__POOL__RELEASE_THRESHOLD", "512MB"),
    ("RMM_DEVICE__1__POOL__GROWTH", "5%"),
    ("RMM_DEVICE__1__LIMITS__DEVICE_MEMORY_LIMIT", "70%"),
    ("RMM_DEVICE__1__SPILL__DEVICE_MEMORY_LIMIT", "0.6"),
    ("RMM_DEVICE__1__SPILL__HOST_POOL_SIZE", "1GiB"),
    // Not keys: left alone.
    ("RMM_SIM_DEVICES", "2"),
    ("RMM_LOG", "debug"),
    ("RMM_BENCH_SCALE", "0.1"),
    ("PATH", "/usr/bin"),
];

fn every_key_expected() -> Config {
    let mut c = Config::default();
    c.backend = BackendChoice::Sim;
    c.devices = Devices::List(vec![
        DeviceSelector::Uuid("GPU-aaaa".into()),
        DeviceSelector::Ordinal(1),
    ]);
    c.workers_per_device = 4;
    c.pool.enabled = true;
    c.pool.managed = false;
    c.pool.use_async = true;
    c.pool.initial_size = Some(Size::Bytes(2 * GIB));
    c.pool.maximum_size = Some(Size::Fraction(0.5));
    c.pool.release_threshold = Some(Size::Bytes(GIB));
    c.pool.growth = Size::Bytes(GIB / 4);
    c.pool.vmm = Switch::On;
    c.pool.max_overhead = Overhead::Share(0.05);
    c.logging.enabled = true;
    c.logging.directory = "/tmp/rmm-logs".into();
    c.logging.file_name = "mylog.csv".into();
    c.logging.level = LogLevel::Debug;
    c.limits.device_memory_limit = Some(Size::Fraction(0.9));
    c.spill.enabled = true;
    c.spill.device_memory_limit = Size::Bytes(1_500_000_000);
    c.spill.host_pool_size = Some(Size::Bytes(16 * GIB));
    c.spill.pin_ahead = PinAhead::Off;
    c.spill.on_demand = false;
    c.spill.eager_unspill = true;
    c.spill.disk_directory = Some("/scratch/spill".into());
    c.stats.enabled = true;
    c.tracking.enabled = true;
    c.tracking.backtraces = true;
    let mut one = DeviceOverride::default();
    one.pool.initial_size = Some(Some(Size::Bytes(8 * GIB)));
    one.pool.maximum_size = Some(None);
    one.pool.release_threshold = Some(Some(Size::Bytes(512_000_000)));
    one.pool.growth = Some(Size::Fraction(0.05));
    one.limits.device_memory_limit = Some(Some(Size::Fraction(0.7)));
    one.spill.device_memory_limit = Some(Size::Fraction(0.6));
    one.spill.host_pool_size = Some(Some(Size::Bytes(GIB)));
    c.device.insert(1, one);
    c
}

#[test]
fn every_key_from_toml() {
    let config = load(EVERY_KEY).unwrap();
    assert_eq!(config, every_key_expected());
    for row in config.effective_values() {
        assert_eq!(row.source, Source::File("rmm.toml".into()), "{}", row.key);
    }
}

#[test]
fn every_key_from_the_environment() {
    let config = load_env(EVERY_VAR).unwrap();
    assert_eq!(config, every_key_expected());
    for row in config.effective_values() {
        assert_eq!(
            row.source,
            Source::Env(rmm_config::env_var_name(&row.key)),
            "{}",
            row.key
        );
    }
}

#[test]
fn every_key_from_code() {
    let mut loader = ConfigLoader::new().no_file().no_env();
    let table: toml::Table = toml::from_str(EVERY_KEY).unwrap();
    for (key, value) in table {
        loader = loader.set(key, value);
    }
    assert_eq!(loader.load().unwrap(), every_key_expected());
}

#[test]
fn every_key_from_code_as_text() {
    let mut loader = ConfigLoader::new().no_file().no_env();
    for (name, text) in EVERY_VAR {
        if let Some(rest) = name.strip_prefix("RMM_")
            && !["SIM_DEVICES", "LOG", "BENCH_SCALE"].contains(&rest)
        {
            let key = rest.to_ascii_lowercase().replace("__", ".");
            loader = loader.set_str(key, *text);
        }
    }
    let config = loader.load().unwrap();
    assert_eq!(config, every_key_expected());
    assert_eq!(config.source("pool.enabled"), Source::Code);
}

#[test]
fn defaults_are_rmm_reinitialize_defaults() {
    let c = load("").unwrap();
    assert_eq!(c, Config::default());
    assert!(!c.pool.enabled && !c.pool.managed && !c.pool.use_async);
    assert_eq!(c.pool.initial_size, None, "None = half of the free memory");
    assert_eq!(c.pool.maximum_size, None);
    assert_eq!(c.devices, Devices::List(vec![DeviceSelector::Ordinal(0)]));
    assert!(!c.logging.enabled);
    assert_eq!(c.workers_per_device, 1);
    assert_eq!(c.backend, BackendChoice::Auto);
}

#[test]
fn keyword_and_scalar_forms() {
    let c = load(
        "devices = \"all\"\n[pool]\nenabled = true\ninitial_size = \"AUTO\"\nmaximum_size = 4096",
    )
    .unwrap();
    assert_eq!(c.devices, Devices::All);
    assert_eq!(c.pool.initial_size, None);
    assert_eq!(c.pool.maximum_size, Some(Size::Bytes(4096)));
    let c = load("devices = 3").unwrap();
    assert_eq!(c.devices, Devices::List(vec![DeviceSelector::Ordinal(3)]));
    let c = load_env(&[("RMM_DEVICES", "all"), ("RMM_BACKEND", "gpu")]).unwrap();
    assert_eq!(c.devices, Devices::All);
    assert_eq!(c.backend, BackendChoice::Cuda);
    // A quoted dotted key and a [device.N.section] table are the same keys.
    let c = load("\"pool.enabled\" = true\n[device.02.pool]\ninitial_size = \"1GiB\"").unwrap();
    assert!(c.pool.enabled);
    assert_eq!(c.device[&2].pool.initial_size, Some(Some(Size::Bytes(GIB))));
    assert_eq!(
        c.source("device.2.pool.initial_size"),
        Source::File("rmm.toml".into())
    );
}

#[test]
fn layers_override_key_by_key_and_record_sources() {
    let file = "devices = [0, 1, 2]\n[pool]\nenabled = true\ninitial_size = \"2GiB\"\n";
    let config = ConfigLoader::new()
        .toml_str("/etc/rmm.toml", file)
        .env_from([
            ("RMM_POOL__INITIAL_SIZE", "4GiB"),
            ("RMM_DEVICES", "3"),
            ("RMM_STATS__ENABLED", "true"),
        ])
        .set("stats.enabled", false)
        .load()
        .unwrap();
    // Arrays are replaced, not merged element by element.
    assert_eq!(
        config.devices,
        Devices::List(vec![DeviceSelector::Ordinal(3)])
    );
    assert!(config.pool.enabled);
    assert_eq!(config.pool.initial_size, Some(Size::Bytes(4 * GIB)));
    assert!(!config.stats.enabled);

    let rows = config.effective_values();
    let source = |key: &str| {
        rows.iter()
            .find(|r| r.key == key)
            .map(|r| (r.value.clone(), r.source.to_string()))
            .unwrap()
    };
    assert_eq!(
        source("devices"),
        ("[3]".into(), "environment RMM_DEVICES".into())
    );
    assert_eq!(
        source("pool.enabled"),
        ("true".into(), "file /etc/rmm.toml".into())
    );
    assert_eq!(
        source("pool.initial_size"),
        ("4GiB".into(), "environment RMM_POOL__INITIAL_SIZE".into())
    );
    assert_eq!(source("stats.enabled"), ("false".into(), "code".into()));
    assert_eq!(
        source("pool.maximum_size"),
        ("none".into(), "default".into())
    );
    assert_eq!(
        source("spill.device_memory_limit"),
        ("80%".into(), "default".into())
    );
    assert_eq!(rows.len(), rmm_config::keys().count());
}

#[test]
fn effective_values_list_device_overrides() {
    let config = load(
        "[pool]\nenabled = true\n[device.1]\npool.initial_size = \"8GiB\"\nspill.host_pool_size = \"none\"",
    )
    .unwrap();
    let rows = config.effective_values();
    let tail: Vec<(&str, &str)> = rows[rmm_config::keys().count()..]
        .iter()
        .map(|r| (r.key.as_str(), r.value.as_str()))
        .collect();
    assert_eq!(
        tail,
        [
            ("device.1.pool.initial_size", "8GiB"),
            ("device.1.spill.host_pool_size", "none")
        ]
    );
}

#[test]
fn render_aligns_the_table() {
    let config = ConfigLoader::new()
        .no_file()
        .env_from([("RMM_POOL__ENABLED", "true")])
        .load()
        .unwrap();
    let text = render(&config.effective_values());
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1 + rmm_config::keys().count());
    let width = "limits.device_memory_limit".len();
    // The widest value: logging.file_name's default.
    let values = "rmm_log.csv".len();
    assert_eq!(
        lines[0],
        format!("{:<width$}  {:<values$}  SOURCE", "KEY", "VALUE")
    );
    assert!(
        lines.contains(&format!("{:<width$}  {:<values$}  default", "backend", "auto").as_str())
    );
    assert!(
        lines.contains(
            &format!(
                "{:<width$}  {:<values$}  environment RMM_POOL__ENABLED",
                "pool.enabled", "true"
            )
            .as_str()
        )
    );
}

#[test]
fn missing_default_file_means_defaults() {
    let config = ConfigLoader::new()
        .env_from([("RMM_POOL__ENABLED", "true")])
        .optional_file("/nonexistent/dir/rmm.toml")
        .load()
        .unwrap();
    let mut want = Config::default();
    want.pool.enabled = true;
    assert_eq!(config, want);
}

#[test]
fn rmm_config_names_the_file() {
    let path = std::env::temp_dir().join(format!("rmm-config-test-{}.toml", std::process::id()));
    std::fs::write(&path, "workers_per_device = 3\n").unwrap();
    let result = ConfigLoader::new()
        .env_from([("RMM_CONFIG", path.to_string_lossy().into_owned())])
        .load();
    std::fs::remove_file(&path).unwrap();
    let config = result.unwrap();
    assert_eq!(config.workers_per_device, 3);
    assert_eq!(config.source("workers_per_device"), Source::File(path));
}

#[test]
fn resolved_config_serializes_for_the_cli() {
    let config = load("[pool]\nenabled = true").unwrap();
    let resolved = config.resolve(&common::two_devices()).unwrap();
    let json = serde_json::to_value(&resolved).unwrap();
    assert_eq!(json["backend"], "auto");
    assert_eq!(json["devices"][0]["pool"]["initial_size"], 30 * GIB);
}

/// A load builds its table from the keys it is given alone (each section deserializes with its
/// defaults): each key set by itself changes that key and leaves every other at its default.
#[test]
fn each_key_set_alone_leaves_every_other_key_at_its_default() {
    let every: toml::Table = toml::from_str(EVERY_KEY).unwrap();
    let expected = every_key_expected().effective_values();
    let defaults = Config::default().effective_values();
    let mut checked = 0;
    for (section, value) in &every {
        let leaves: Vec<(String, toml::Value)> = match (section.as_str(), value) {
            ("device", _) => vec![(
                "device.1.pool.initial_size".into(),
                toml::Value::from("8GiB"),
            )],
            (_, toml::Value::Table(t)) => t
                .iter()
                .map(|(k, v)| (format!("{section}.{k}"), v.clone()))
                .collect(),
            (_, v) => vec![(section.clone(), v.clone())],
        };
        for (key, value) in leaves {
            // A size of a feature that is off would be refused as having no effect: the
            // feature is turned on in the file, and that switch is not compared below.
            let switch = ["pool.release_threshold"]
                .contains(&key.as_str())
                .then_some("pool.async")
                .or_else(|| key.contains("pool.").then_some("pool.enabled"))
                .or_else(|| {
                    (key.starts_with("spill.") || key.contains(".spill."))
                        .then_some("spill.enabled")
                })
                .filter(|s| *s != key && !key.ends_with("_demand") && !key.ends_with("unspill"));
            let file = switch.map_or_else(String::new, |s| format!("{s} = true"));
            let config = ConfigLoader::new()
                .toml_str("rmm.toml", file)
                .no_env()
                .set(key.as_str(), value)
                .load()
                .unwrap_or_else(|e| panic!("{key}: {e}"));
            let mut seen = false;
            for row in config.effective_values() {
                if row.key == key {
                    let want = expected.iter().find(|r| r.key == key).unwrap();
                    assert_eq!(row.value, want.value, "{key}");
                    assert_eq!(row.source, Source::Code, "{key}");
                    seen = true;
                } else if Some(row.key.as_str()) == switch {
                    assert_eq!(row.value, "true", "{key}");
                } else {
                    let want = defaults.iter().find(|r| r.key == row.key).unwrap();
                    assert_eq!(row.value, want.value, "{} after setting {key}", row.key);
                }
            }
            assert!(seen, "{key} is not among the effective values");
            checked += 1;
        }
    }
    assert_eq!(checked, 28);
}
