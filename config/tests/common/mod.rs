//! Helpers shared by the integration tests. No test touches the process environment: the
//! environment is always injected with `ConfigLoader::env_from`.

#![allow(dead_code)]

use rmm_config::{Config, ConfigLoader, DeviceFacts, Error};

pub const GIB: u64 = 1 << 30;

/// `text` as the file `rmm.toml`, no environment.
pub fn load(text: &str) -> Result<Config, Error> {
    ConfigLoader::new()
        .no_env()
        .toml_str("rmm.toml", text)
        .load()
}

/// The message of the error that loading `text` gives.
pub fn load_error(text: &str) -> String {
    match load(text) {
        Ok(config) => panic!("expected an error, loaded {config:?}"),
        Err(e) => e.to_string(),
    }
}

/// No file, only these variables.
pub fn load_env(vars: &[(&str, &str)]) -> Result<Config, Error> {
    ConfigLoader::new()
        .no_file()
        .env_from(vars.iter().copied())
        .load()
}

/// Two devices: 0 with 80 GiB (60 GiB free), 1 with 40 GiB (all free).
pub fn two_devices() -> Vec<DeviceFacts> {
    vec![
        DeviceFacts {
            ordinal: 0,
            uuid: "GPU-aaaa".into(),
            total_memory: 80 * GIB,
            free_memory: Some(60 * GIB),
            host_memory: Some(256 * GIB),
        },
        DeviceFacts {
            ordinal: 1,
            uuid: "GPU-bbbb".into(),
            total_memory: 40 * GIB,
            free_memory: Some(40 * GIB),
            host_memory: Some(256 * GIB),
        },
    ]
}

/// The message of the error that resolving `text` on [`two_devices`] gives.
pub fn resolve_error(text: &str) -> String {
    let config = load(text).expect("the file loads");
    match config.resolve(&two_devices()) {
        Ok(resolved) => panic!("expected an error, resolved {resolved:?}"),
        Err(e) => e.to_string(),
    }
}
