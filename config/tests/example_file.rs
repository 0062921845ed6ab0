//! The repository's rmm.toml: every key, each at its default, and it loads.

mod common;

use std::path::PathBuf;

use rmm_config::{Config, ConfigLoader, Source};

/// The repository's rmm.toml, found at run time: nextest sets `CARGO_MANIFEST_DIR` to where
/// the crate is now (after `--workspace-remap` on another machine), while `env!` would give
/// the path it was built at.
fn example() -> PathBuf {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    dir.join("../rmm.toml")
}

#[test]
fn example_sets_every_key_to_its_default() {
    let example = example();
    let config = ConfigLoader::new().no_env().file(&example).load().unwrap();
    assert_eq!(config, Config::default());
    // Every key is present: each effective value came from the file.
    for row in config.effective_values() {
        assert_eq!(
            row.source,
            Source::File(example.clone()),
            "{} is not in rmm.toml",
            row.key
        );
    }
}

#[test]
fn example_device_table_is_valid_when_uncommented() {
    let text = std::fs::read_to_string(example()).unwrap();
    let start = text
        .find("# [device.1]")
        .expect("the example has a [device.1] table");
    let uncommented: String = text[start..]
        .lines()
        .map(|line| line.strip_prefix("# ").unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n");
    // Its sizes are the pool's and spilling's: with both on (else they would do nothing).
    let config = ConfigLoader::new()
        .toml_str("rmm.toml", format!("{}{uncommented}", &text[..start]))
        .env_from([
            ("RMM_POOL__ENABLED", "true"),
            ("RMM_SPILL__ENABLED", "true"),
        ])
        .load()
        .unwrap();
    let keys: Vec<String> = config
        .effective_values()
        .into_iter()
        .filter(|row| row.key.starts_with("device.1."))
        .map(|row| row.key)
        .collect();
    let want: Vec<String> = rmm_config::per_device_keys()
        .map(|k| format!("device.1.{k}"))
        .collect();
    assert_eq!(keys, want);
}

#[test]
fn the_readme_tour_of_rmm_toml_loads() {
    let readme = example().with_file_name("README.md");
    let text = std::fs::read_to_string(&readme).unwrap();
    let start = text.find("```toml\n").expect("a toml block in the README") + 8;
    let block = &text[start..start + text[start..].find("```").unwrap()];
    let config = ConfigLoader::new()
        .no_env()
        .toml_str("README.md", block)
        .load()
        .unwrap_or_else(|e| panic!("the README's rmm.toml tour does not load: {e}"));
    assert!(config.spill.enabled && config.pool.enabled);
    assert_eq!(config.workers_per_device, 4);
}
