//! Fuzzing every parser of configuration input (issue 22): `rmm.toml` text, TOML documents
//! built from the schema's keys with arbitrary values, sizes, environment variables and
//! overrides in code. Every input loads or fails with an error, never a panic, in bounded
//! time; what loads also resolves (or fails) on two devices, prints its effective values
//! and reads back equal, from its TOML and from itself.
//!
//! A fixed budget per target (`PROPTEST_CASES` raises it for a longer run).

mod common;

use std::time::{Duration, Instant};

use common::two_devices;
use proptest::prelude::*;
use rmm_config::{Config, ConfigLoader, Size, keys, per_device_keys};

/// The longest one input may take, far above what any takes: a hang or a blow-up fails the
/// test instead of stalling CI.
const BOUND: Duration = Duration::from_secs(5);

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128)
}

/// Everything a loaded configuration offers must work on it without a panic.
fn use_loaded(config: &Config) {
    let _ = config.resolve(&two_devices());
    let _ = config.resolve(&[]);
    let _ = rmm_config::render(&config.effective_values());
    if let Ok(text) = config.to_toml() {
        let back = Config::from_toml_str(&text).expect("a config's own TOML loads");
        assert_eq!(&back, config, "{text}");
    }
    let again = ConfigLoader::from_config(config)
        .load()
        .expect("a loaded config reloads from itself");
    assert_eq!(&again, config);
}

/// Loads with `loader`; an error must say something.
fn exercise(loader: ConfigLoader) {
    let start = Instant::now();
    match loader.load() {
        Ok(config) => use_loaded(&config),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    assert!(start.elapsed() < BOUND, "took {:?}", start.elapsed());
}

/// A key: the schema's (top level or per device), near misses and junk.
fn key() -> impl Strategy<Value = String> {
    let known: Vec<String> = keys().map(String::from).collect();
    let per_device: Vec<String> = per_device_keys().map(String::from).collect();
    prop_oneof![
        4 => prop::sample::select(known),
        2 => (0u32..4, prop::sample::select(per_device)).prop_map(|(d, k)| format!("device.{d}.{k}")),
        1 => Just("pool".to_string()),
        1 => Just("device".to_string()),
        1 => Just("device.x".to_string()),
        1 => "[a-z_.]{1,20}",
        1 => "\\PC{0,10}",
    ]
}

/// Text a user might write for a value: sizes, percentages, keywords, device lists, junk.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        (
            0u64..10_000,
            prop::sample::select(vec!["", "B", "KiB", "MiB", "GiB", "TB", "%", "kb", "PiB"])
        )
            .prop_map(|(n, u)| format!("{n}{u}")),
        (any::<f64>(), prop::sample::select(vec!["", "%", "GiB"]))
            .prop_map(|(f, u)| format!("{f}{u}")),
        Just("18446744073709551616".to_string()),
        Just("99999999999999999999PiB".to_string()),
        Just("1e309".to_string()),
        Just("-0".to_string()),
        Just(".".to_string()),
        Just("1..5GiB".to_string()),
        prop::sample::select(vec![
            "auto", "none", "all", "true", "false", "0,1", "cuda", "sim", "trace"
        ])
        .prop_map(String::from),
        "[ -~]{0,16}",
        "\\PC{0,8}",
    ]
}

/// An arbitrary TOML value, nested a few levels.
fn value() -> impl Strategy<Value = toml::Value> {
    let leaf = prop_oneof![
        any::<bool>().prop_map(toml::Value::Boolean),
        any::<i64>().prop_map(toml::Value::Integer),
        (-5i64..300).prop_map(toml::Value::Integer),
        any::<f64>().prop_map(toml::Value::Float),
        (0.0f64..1.5).prop_map(toml::Value::Float),
        text().prop_map(toml::Value::String),
    ];
    leaf.prop_recursive(4, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(toml::Value::Array),
            prop::collection::btree_map("[a-z0-9_]{1,10}", inner, 0..4)
                .prop_map(|m| toml::Value::Table(m.into_iter().collect())),
        ]
    })
}

/// A document: schema keys (dotted keys become nested tables) with arbitrary values.
fn document() -> impl Strategy<Value = toml::Table> {
    prop::collection::vec((key(), value()), 0..10).prop_map(|entries| {
        let mut root = toml::Table::new();
        for (key, value) in entries {
            let mut parts: Vec<&str> = key.split('.').collect();
            let Some(leaf) = parts.pop() else { continue };
            let mut table = &mut root;
            for part in parts {
                let entry = table
                    .entry(part.to_string())
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()));
                if !entry.is_table() {
                    *entry = toml::Value::Table(toml::Table::new());
                }
                let Some(t) = entry.as_table_mut() else {
                    unreachable!()
                };
                table = t;
            }
            table.insert(leaf.to_string(), value);
        }
        root
    })
}

fn loader() -> ConfigLoader {
    ConfigLoader::new().no_file().no_env()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn arbitrary_text_as_rmm_toml_loads_or_errs(text in "\\PC{0,300}") {
        exercise(ConfigLoader::new().no_env().toml_str("rmm.toml", text));
    }

    #[test]
    fn documents_of_schema_keys_and_arbitrary_values_load_or_err(doc in document()) {
        // A document TOML cannot print (a NaN somewhere is fine; junk keys may not be) is
        // skipped: the text form is what users write.
        if let Ok(text) = toml::to_string(&doc) {
            exercise(ConfigLoader::new().no_env().toml_str("rmm.toml", text));
        }
    }

    #[test]
    fn overrides_in_code_load_or_err(entries in prop::collection::vec((key(), value()), 0..8)) {
        exercise(entries.into_iter().fold(loader(), |l, (k, v)| l.set(k, v)));
    }

    #[test]
    fn overrides_as_text_and_environment_variables_load_or_err(
        entries in prop::collection::vec((key(), text()), 0..8),
        raw in prop::collection::vec(("RMM_[A-Z_0-9]{0,24}", text()), 0..4),
    ) {
        let vars: Vec<(String, String)> = entries
            .iter()
            .map(|(k, v)| (rmm_config::env_var_name(k), v.clone()))
            .chain(raw)
            .collect();
        exercise(ConfigLoader::new().no_file().env_from(vars));
        exercise(entries.into_iter().fold(loader(), |l, (k, v)| l.set_str(k, v)));
    }

    #[test]
    fn sizes_parse_or_err_and_what_parses_resolves_and_reads_back(text in text(), total in any::<u64>()) {
        if let Ok(size) = text.parse::<Size>() {
            let bytes = size.resolve(total);
            assert_eq!(bytes % rmm_config::ALIGNMENT, 0);
            let back = Size::from_toml(&size.to_toml()).expect("a size's TOML reads back");
            assert_eq!(back, size);
        }
    }
}
