//! rmm-rs configuration: `rmm.toml`, environment overrides, overrides in code, validation.
//!
//! ```no_run
//! # mod rmm { pub use rmm_config as config; }
//! use rmm::config::{ConfigLoader, DeviceFacts, render};
//!
//! // Defaults, then RMM_CONFIG or ./rmm.toml, then RMM_* variables, then code.
//! let config = ConfigLoader::new().set("pool.enabled", true).load()?;
//! print!("{}", render(&config.effective_values()));    // `rmm info`
//!
//! let facts = [DeviceFacts {
//!     ordinal: 0,
//!     uuid: "GPU-0".into(),
//!     total_memory: 80 << 30,
//!     free_memory: Some(79 << 30),
//!     host_memory: Some(512 << 30),
//! }];
//! let resolved = config.resolve(&facts)?; // bytes per selected device
//! # Ok::<(), rmm::config::Error>(())
//! ```
//!
//! # Layers
//!
//! Defaults, file, environment, code: later layers win key by key ([`ConfigLoader`]).
//! [`Config::effective_values`] tells each key's layer ([`Source`]).
//!
//! # Keys and environment variables
//!
//! `RMM_SECTION__NAME` sets key `section.name`. Environment text is read as TOML, plus:
//! booleans also as `1`/`0`, `yes`/`no`, `on`/`off`; `devices` as a comma-separated list.
//!
//! | key | environment | default | accepts |
//! |---|---|---|---|
//! | `backend` | `RMM_BACKEND` | `"auto"` (the GPU, or an error) | `"auto"`, `"cuda"`, `"sim"` |
//! | `devices` | `RMM_DEVICES` | `[0]` | `"all"`, ordinals, UUIDs (`"GPU-…"`, `"MIG-…"`) |
//! | `workers_per_device` | `RMM_WORKERS_PER_DEVICE` | `1` | integer 1 ..= 256 ([`MAX_WORKERS_PER_DEVICE`]) |
//! | `pool.enabled` | `RMM_POOL__ENABLED` | `false` | bool |
//! | `pool.managed` | `RMM_POOL__MANAGED` | `false` | bool |
//! | `pool.async` | `RMM_POOL__ASYNC` | `false` | bool |
//! | `pool.initial_size` | `RMM_POOL__INITIAL_SIZE` | `"auto"` (half the free memory) | size or `"auto"` |
//! | `pool.maximum_size` | `RMM_POOL__MAXIMUM_SIZE` | `"none"` | size or `"none"` |
//! | `pool.release_threshold` | `RMM_POOL__RELEASE_THRESHOLD` | `"none"` | size or `"none"` |
//! | `pool.growth` | `RMM_POOL__GROWTH` | `"1GiB"` | size |
//! | `pool.vmm` | `RMM_POOL__VMM` | `"auto"` | `true`, `false` or `"auto"` |
//! | `pool.max_overhead` | `RMM_POOL__MAX_OVERHEAD` | `"none"` | share (`"5%"`) or `"none"` |
//! | `logging.enabled` | `RMM_LOGGING__ENABLED` | `false` | bool |
//! | `logging.directory` | `RMM_LOGGING__DIRECTORY` | `"."` | path |
//! | `logging.file_name` | `RMM_LOGGING__FILE_NAME` | `"rmm_log.csv"` (device N: `rmm_log.devN.csv`) | file name |
//! | `logging.level` | `RMM_LOGGING__LEVEL` | `"info"` | `trace` … `error`, `off` |
//! | `limits.device_memory_limit` | `RMM_LIMITS__DEVICE_MEMORY_LIMIT` | `"none"` | size or `"none"` |
//! | `spill.enabled` | `RMM_SPILL__ENABLED` | `false` | bool |
//! | `spill.device_memory_limit` | `RMM_SPILL__DEVICE_MEMORY_LIMIT` | `"80%"` | size |
//! | `spill.host_pool_size` | `RMM_SPILL__HOST_POOL_SIZE` | `"none"` | size or `"none"` |
//! | `spill.pin_ahead` | `RMM_SPILL__PIN_AHEAD` | `"auto"` (the spill limit, at most 1/16 of host memory) | size, `"auto"` or `"none"` |
//! | `spill.on_demand` | `RMM_SPILL__ON_DEMAND` | `true` | bool |
//! | `spill.eager_unspill` | `RMM_SPILL__EAGER_UNSPILL` | `false` | bool |
//! | `spill.disk_directory` | `RMM_SPILL__DISK_DIRECTORY` | `"none"` | path or `"none"` |
//! | `stats.enabled` | `RMM_STATS__ENABLED` | `false` | bool |
//! | `tracking.enabled` | `RMM_TRACKING__ENABLED` | `false` | bool |
//! | `tracking.backtraces` | `RMM_TRACKING__BACKTRACES` | `false` | bool |
//! | `device.N.<size key>` | `RMM_DEVICE__N__POOL__INITIAL_SIZE`, … | (global value) | as the key |
//!
//! A `[device.N]` table overrides for device N the size keys `pool.initial_size`,
//! `pool.maximum_size`, `pool.release_threshold`, `pool.growth`,
//! `limits.device_memory_limit`, `spill.device_memory_limit` and `spill.host_pool_size`.
//!
//! Not keys, left alone ([`ENV_NOT_KEYS`]): `RMM_CONFIG` (the file), `RMM_SIM_*` (the
//! simulated device), `RMM_LOG` (the CLI's log filter), `RMM_BENCH_*` (benchmarks). RAPIDS
//! RMM's own variables ([`ENV_RAPIDS_IGNORED`]: `RMM_LOG_FILE`, …) are ignored with a
//! `tracing` warning. Any other `RMM_*` variable is an error, with a suggestion for a
//! misspelt key.
//!
//! # Sizes
//!
//! See [`Size`]: bytes, `"2GiB"`, `"1.5 GB"`, or a fraction of the device's total memory
//! (`"50%"`, `0.5`). Resolved sizes are rounded **down** to a multiple of 256 bytes.
//!
//! # Errors
//!
//! One [`Error`] type. Loading reports every bad key and value together, each naming its file
//! or variable, key, value and accepted forms, e.g.
//! `rmm.toml: pool.initial_size = "2GB0": expected bytes, "2GiB", "50%" or "auto"`.

/// The most `workers_per_device` accepts. Each worker is a thread with its own stream and a
/// handful per device suffices (Dask runs one); a typo (`100000`) is then an error naming the
/// key, not thousands of threads the system may refuse to start.
pub const MAX_WORKERS_PER_DEVICE: u32 = 256;

mod config;
mod error;
mod loader;
mod overhead;
mod plan;
mod resolve;
mod schema;
mod size;
mod types;
mod unused;

pub use config::{EffectiveValue, render};
pub use error::{Error, Result, Setting, Source};
pub use loader::{CONFIG_PATH_VAR, ConfigLoader, DEFAULT_FILE, MAX_NESTING};
pub use overhead::Overhead;
pub use plan::{PoolPlan, UpstreamPlan};
pub use resolve::{
    DeviceFacts, PIN_AHEAD_HOST_SHARE, PIN_AHEAD_WITHOUT_HOST_FACTS, ResolvedConfig,
    ResolvedDevice, ResolvedSpill,
};
pub use schema::{
    ENV_NOT_KEYS, ENV_PREFIX, ENV_RAPIDS_IGNORED, env_var_name, keys, per_device_keys,
};
pub use size::{ALIGNMENT, ParseSizeError, Size, align_down};
pub use types::{
    Config, DeviceOverride, DeviceSelector, Devices, LimitsConfig, LimitsOverride, LogLevel,
    LoggingConfig, PinAhead, PoolConfig, PoolOverride, SpillConfig, SpillOverride, StatsConfig,
    Switch, TrackingConfig, device_log_file_name,
};

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// `schema::KEYS` and the `Config` struct name the same keys.
    #[test]
    fn schema_matches_the_struct() {
        let value = toml::Value::try_from(Config::default()).expect("defaults serialize");
        let mut flat = BTreeMap::new();
        loader::flatten(&value, "", &mut flat);
        let from_struct: Vec<&str> = flat.keys().map(String::as_str).collect();
        let mut from_schema: Vec<&str> = keys().collect();
        from_schema.sort_unstable();
        assert_eq!(from_struct, from_schema);
    }

    /// Every key has a display value, and it is the serialized value (strings unquoted).
    #[test]
    fn effective_values_cover_every_key() {
        let value = toml::Value::try_from(Config::default()).expect("defaults serialize");
        let mut flat = BTreeMap::new();
        loader::flatten(&value, "", &mut flat);
        let rows = Config::default().effective_values();
        assert_eq!(rows.len(), keys().count());
        for row in rows {
            let serialized = &flat[&row.key];
            let want = match serialized {
                toml::Value::String(s) => s.clone(),
                toml::Value::Float(f) => Size::Fraction(*f).to_string(),
                other => other.to_string(),
            };
            assert_eq!(row.value, want, "{}", row.key);
            assert_eq!(row.source, Source::Default);
        }
    }

    /// The key table in the crate docs lists every key and its variable.
    #[test]
    fn docs_list_every_environment_variable() {
        let docs = include_str!("lib.rs");
        for key in keys() {
            let line = format!("| `{key}` | `{}` |", env_var_name(key));
            assert!(docs.contains(&line), "missing doc row: {line}");
        }
    }
}
