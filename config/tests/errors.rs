//! Every load-time error, with its message.

mod common;

use common::{load, load_env, load_error};
use rmm_config::{ConfigLoader, Error};

fn env_error(vars: &[(&str, &str)]) -> String {
    load_env(vars).unwrap_err().to_string()
}

#[test]
fn unknown_key_with_did_you_mean() {
    assert_eq!(
        load_error("[pool]\nintial_size = \"2GiB\""),
        "rmm.toml: unknown key pool.intial_size; did you mean pool.initial_size?"
    );
    assert_eq!(
        load_error("[spil]\nenabled = true"),
        "rmm.toml: unknown key spil; did you mean spill?"
    );
    assert_eq!(
        load_error("worker_per_device = 2"),
        "rmm.toml: unknown key worker_per_device; did you mean workers_per_device?"
    );
    assert_eq!(
        load_error("[pool]\ndevice_memory_limit = \"1GiB\""),
        "rmm.toml: unknown key pool.device_memory_limit; did you mean \
         limits.device_memory_limit or spill.device_memory_limit?"
    );
    assert_eq!(
        load_error("[spill]\nbacktraces = true"),
        "rmm.toml: unknown key spill.backtraces; did you mean tracking.backtraces?"
    );
    assert_eq!(
        load_error("[device.1.pool]\nintial_size = 1024"),
        "rmm.toml: unknown key device.1.pool.intial_size; did you mean \
         device.1.pool.initial_size?"
    );
}

#[test]
fn unknown_key_without_a_close_match_lists_the_valid_keys() {
    assert_eq!(
        load_error("[pool]\ncolour = \"blue\""),
        "rmm.toml: unknown key pool.colour; [pool] takes enabled, managed, async, \
         initial_size, maximum_size, release_threshold, growth, vmm, max_overhead"
    );
    assert_eq!(
        load_error("[device.1]\npool.enabled = true"),
        "rmm.toml: unknown key device.1.pool.enabled; pool.enabled cannot be set per device; \
         a [device.N] table takes pool.initial_size, pool.maximum_size, \
         pool.release_threshold, pool.growth, limits.device_memory_limit, \
         spill.device_memory_limit, spill.host_pool_size"
    );
    assert_eq!(
        load_error("[device.gpu0]\npool.initial_size = 1024"),
        "rmm.toml: unknown key device.gpu0; per-device tables are keyed by ordinal, e.g. \
         [device.1]"
    );
}

#[test]
fn bad_values_name_file_key_value_and_expected_form() {
    let cases = [
        (
            "[pool]\ninitial_size = \"2GB0\"",
            r#"rmm.toml: pool.initial_size = "2GB0": expected bytes, "2GiB", "50%" or "auto""#,
        ),
        (
            "[spill]\ndevice_memory_limit = true",
            r#"rmm.toml: spill.device_memory_limit = true: expected bytes, "2GiB" or "50%""#,
        ),
        (
            "backend = \"rocm\"",
            r#"rmm.toml: backend = "rocm": expected "auto", "cuda" or "sim""#,
        ),
        (
            "[pool]\nenabled = \"yes\"",
            r#"rmm.toml: pool.enabled = "yes": expected true or false"#,
        ),
        (
            "workers_per_device = 0",
            "rmm.toml: workers_per_device = 0: expected a whole number from 1 to 256",
        ),
        (
            "workers_per_device = 100000",
            "rmm.toml: workers_per_device = 100000: expected a whole number from 1 to 256",
        ),
        (
            "[logging]\nlevel = \"loud\"",
            r#"rmm.toml: logging.level = "loud": expected "trace", "debug", "info", "warn", "error" or "off""#,
        ),
        (
            "[logging]\ndirectory = \"\"",
            r#"rmm.toml: logging.directory = "": expected a directory path"#,
        ),
        (
            "[spill]\ndisk_directory = 3",
            r#"rmm.toml: spill.disk_directory = 3: expected a directory path or "none""#,
        ),
        (
            "devices = \"gpu0\"",
            r#"rmm.toml: devices = "gpu0": expected "all", an ordinal, or a list of ordinals and UUIDs, e.g. [0, 1] or ["GPU-8932f937-…"]"#,
        ),
        (
            "devices = []",
            r#"rmm.toml: devices = []: the list is empty; expected "all", an ordinal, or a list of ordinals and UUIDs, e.g. [0, 1] or ["GPU-8932f937-…"]"#,
        ),
        (
            "devices = [0, 1, 0]",
            r#"rmm.toml: devices = [0, 1, 0]: device 0 is listed twice; expected "all", an ordinal, or a list of ordinals and UUIDs, e.g. [0, 1] or ["GPU-8932f937-…"]"#,
        ),
        (
            "devices = [-1]",
            r#"rmm.toml: devices = [-1]: -1 is not a device ordinal; expected "all", an ordinal, or a list of ordinals and UUIDs, e.g. [0, 1] or ["GPU-8932f937-…"]"#,
        ),
        (
            "pool = true",
            "rmm.toml: pool = true: expected a table, e.g. [pool]",
        ),
        (
            "device = 1",
            "rmm.toml: device = 1: expected tables keyed by ordinal, e.g. [device.1]",
        ),
    ];
    for (text, want) in cases {
        assert_eq!(load_error(text), want, "{text}");
    }
}

#[test]
fn zero_negative_and_above_whole_sizes() {
    let cases = [
        (
            "[pool]\nmaximum_size = -5",
            r#"rmm.toml: pool.maximum_size = -5: a size cannot be negative; expected bytes, "2GiB", "50%" or "none""#,
        ),
        (
            "[pool]\nmaximum_size = \"-2GiB\"",
            r#"rmm.toml: pool.maximum_size = "-2GiB": a size cannot be negative; expected bytes, "2GiB", "50%" or "none""#,
        ),
        (
            "[limits]\ndevice_memory_limit = 0",
            r#"rmm.toml: limits.device_memory_limit = 0: a size of zero is not allowed; expected bytes, "2GiB", "50%" or "none""#,
        ),
        (
            "[spill]\ndevice_memory_limit = \"0%\"",
            r#"rmm.toml: spill.device_memory_limit = "0%": a size of zero is not allowed; expected bytes, "2GiB" or "50%""#,
        ),
        (
            "[pool]\ninitial_size = \"150%\"",
            r#"rmm.toml: pool.initial_size = "150%": a fraction of device memory cannot exceed 100%; expected bytes, "2GiB", "50%" or "auto""#,
        ),
        (
            "[pool]\ninitial_size = 1.5",
            r#"rmm.toml: pool.initial_size = 1.5: a fraction of device memory cannot exceed 100%; expected bytes, "2GiB", "50%" or "auto""#,
        ),
        (
            "[device.1]\nspill.host_pool_size = \"20000000PiB\"",
            r#"rmm.toml: device.1.spill.host_pool_size = "20000000PiB": a size cannot exceed 16 EiB; expected bytes, "2GiB", "50%" or "none""#,
        ),
    ];
    for (text, want) in cases {
        assert_eq!(load_error(text), want, "{text}");
    }
}

#[test]
fn environment_errors_name_the_variable() {
    assert_eq!(
        env_error(&[("RMM_POOL__INITIAL_SIZE", "x")]),
        r#"environment RMM_POOL__INITIAL_SIZE = "x": expected bytes, "2GiB", "50%" or "auto""#
    );
    assert_eq!(
        env_error(&[("RMM_POOL__ENABLED", "maybe")]),
        r#"environment RMM_POOL__ENABLED = "maybe": expected true or false (or 1/0, yes/no, on/off)"#
    );
    assert_eq!(
        env_error(&[("RMM_DEVICES", "0,gpu1")]),
        r#"environment RMM_DEVICES = "0,gpu1": expected "all" or ordinals and UUIDs separated by commas, e.g. "0,1" or "GPU-8932f937-…""#
    );
    assert_eq!(
        env_error(&[("RMM_WORKERS_PER_DEVICE", "-2")]),
        r#"environment RMM_WORKERS_PER_DEVICE = "-2": expected a whole number from 1 to 256"#
    );
    assert_eq!(
        env_error(&[("RMM_SPILL__DEVICE_MEMORY_LIMIT", "120%")]),
        r#"environment RMM_SPILL__DEVICE_MEMORY_LIMIT = "120%": a fraction of device memory cannot exceed 100%; expected bytes, "2GiB" or "50%""#
    );
}

#[test]
fn unknown_environment_variables() {
    assert_eq!(
        env_error(&[("RMM_POOL__INTIAL_SIZE", "2GiB")]),
        "environment RMM_POOL__INTIAL_SIZE: unknown setting pool.intial_size; did you mean \
         RMM_POOL__INITIAL_SIZE?"
    );
    assert_eq!(
        env_error(&[("RMM_POOL_ENABLED", "1")]),
        "environment RMM_POOL_ENABLED: unknown setting pool_enabled; did you mean \
         RMM_POOL__ENABLED?"
    );
    assert_eq!(
        env_error(&[("RMM_DEVICE__1__POOL__INITAL_SIZE", "2GiB")]),
        "environment RMM_DEVICE__1__POOL__INITAL_SIZE: unknown setting \
         device.1.pool.inital_size; did you mean RMM_DEVICE__1__POOL__INITIAL_SIZE?"
    );
    assert_eq!(
        env_error(&[("RMM_FROBNICATE", "1")]),
        "environment RMM_FROBNICATE: unknown setting frobnicate; the top-level keys are \
         backend, devices, workers_per_device and the tables [pool], [logging], [limits], \
         [spill], [stats], [tracking], [device.N]"
    );
}

#[test]
fn code_override_errors() {
    let err = |loader: ConfigLoader| loader.no_file().no_env().load().unwrap_err().to_string();
    assert_eq!(
        err(ConfigLoader::new().set("pool.enabled", "yes")),
        r#"code override pool.enabled = "yes": expected true or false"#
    );
    assert_eq!(
        err(ConfigLoader::new().set("pool.intial_size", 1024)),
        "code override: unknown key pool.intial_size; did you mean pool.initial_size?"
    );
    assert_eq!(
        err(ConfigLoader::new().set_str("pool.initial_size", "2GB0")),
        r#"code override pool.initial_size = "2GB0": expected bytes, "2GiB", "50%" or "auto""#
    );
}

#[test]
fn several_problems_are_reported_together() {
    let err = ConfigLoader::new()
        .toml_str("rmm.toml", "[pool]\nintial_size = 1\nenabled = 2")
        .env_from([("RMM_POOL__MAXIMUM_SIZE", "lots")])
        .load()
        .unwrap_err();
    assert_eq!(err.all().len(), 3);
    assert!(matches!(err, Error::Several(_)));
    assert_eq!(
        err.to_string(),
        "3 problems in the configuration:\n\
         - rmm.toml: pool.enabled = 2: expected true or false\n\
         - rmm.toml: unknown key pool.intial_size; did you mean pool.initial_size?\n\
         - environment RMM_POOL__MAXIMUM_SIZE = \"lots\": expected bytes, \"2GiB\", \"50%\" or \"none\""
    );
}

#[test]
fn async_with_managed_names_both_sources() {
    let err = ConfigLoader::new()
        .toml_str("rmm.toml", "[pool]\nmanaged = true")
        .env_from([("RMM_POOL__ASYNC", "true")])
        .load()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "pool.async = true (environment RMM_POOL__ASYNC) conflicts with pool.managed = true \
         (file rmm.toml): CUDA's async allocator cannot allocate managed memory; set one of \
         them to false"
    );
}

#[test]
fn initial_above_maximum_when_known_without_devices() {
    assert_eq!(
        load_error("[pool]\nenabled = true\ninitial_size = \"8GiB\"\nmaximum_size = \"4GiB\""),
        "pool.initial_size = 8GiB (file rmm.toml) is above pool.maximum_size = 4GiB (file \
         rmm.toml); lower the initial size or raise the maximum"
    );
    assert_eq!(
        load_error(
            "[pool]\nasync = true\nmaximum_size = \"40%\"\n[device.3]\npool.initial_size = 0.5"
        ),
        "on device 3, device.3.pool.initial_size = 50% (file rmm.toml) is above \
         pool.maximum_size = 40% (file rmm.toml); lower the initial size or raise the maximum"
    );
    // With the pool off in the same file the sizes are a contradiction of their own (turned
    // off by a later layer, they are kept quietly: see contradictions.rs).
    let e = load_error("[pool]\ninitial_size = \"8GiB\"\nmaximum_size = \"4GiB\"");
    assert!(
        e.contains("pool.initial_size = 8GiB (file rmm.toml) has no effect"),
        "{e}"
    );
}

#[test]
fn file_errors() {
    let text = common::load_error("[pool\nenabled = true");
    assert!(
        text.starts_with("rmm.toml: not valid TOML: TOML parse error at line 1, column 6"),
        "{text}"
    );
    assert!(
        text.ends_with("\nFix the syntax at the line and column shown: `key = value` lines under `[section]` headers, text values in quotes"),
        "{text}"
    );

    let err = ConfigLoader::new()
        .env_from([("RMM_CONFIG", "/nonexistent/dir/rmm.toml")])
        .load()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "environment RMM_CONFIG = \"/nonexistent/dir/rmm.toml\": no such file; create it, or \
         unset RMM_CONFIG to read ./rmm.toml when present"
    );

    let err = ConfigLoader::new()
        .no_env()
        .file("/nonexistent/dir/rmm.toml")
        .load()
        .unwrap_err();
    assert!(
        err.to_string().starts_with(
            "/nonexistent/dir/rmm.toml: cannot read the configuration file: No such file"
        ),
        "{err}"
    );
    assert!(
        err.to_string().ends_with(
            "; check the path and that this process may read it, or name another file \
             (RMM_CONFIG, ConfigLoader::file)"
        ),
        "{err}"
    );
}

/// A value nested `depth` arrays deep around `1`.
fn nested_array(depth: usize) -> toml::Value {
    (0..depth).fold(toml::Value::Integer(1), |v, _| toml::Value::Array(vec![v]))
}

#[test]
fn values_nested_past_the_limit_are_refused_with_the_key_path_and_the_limit() {
    use rmm_config::MAX_NESTING;
    let deep = ConfigLoader::new()
        .no_file()
        .no_env()
        .set("devices", nested_array(1000))
        .load()
        .unwrap_err();
    let path = format!("devices{}", "[0]".repeat(MAX_NESTING));
    assert_eq!(
        deep.to_string(),
        format!(
            "code: {path} nests tables or arrays deeper than 32 levels (the limit); a \
             configuration value needs at most a few (e.g. device.1.pool.initial_size): \
             flatten it"
        )
    );
    // Exactly at the limit, the value is judged as a value (and is not a device list).
    let at_limit = ConfigLoader::new()
        .no_file()
        .no_env()
        .set("devices", nested_array(MAX_NESTING - 1))
        .load()
        .unwrap_err();
    assert!(matches!(at_limit, Error::InvalidValue { .. }), "{at_limit}");
    // A whole table given as one override counts its own levels.
    let mut table = toml::Table::new();
    table.insert("initial_size".into(), nested_array(40));
    let err = ConfigLoader::new()
        .no_file()
        .no_env()
        .set("pool", table)
        .load()
        .unwrap_err();
    assert!(
        err.to_string().starts_with("code: pool.initial_size[0]"),
        "{err}"
    );
}

#[test]
fn deep_toml_files_are_refused_cleanly() {
    // Past the schema's limit but within the TOML parser's own: our limit.
    let text = format!("devices = {}1{}", "[".repeat(40), "]".repeat(40));
    assert!(
        load_error(&text).starts_with("file rmm.toml: devices[0]"),
        "{}",
        load_error(&text)
    );
    // Far past both (200 000 levels): the TOML parser's recursion limit, never a crash.
    let text = format!("devices = {}1{}", "[".repeat(200_000), "]".repeat(200_000));
    assert!(load_error(&text).contains("not valid TOML"));
    let text = format!("{} = 1", vec!["a"; 200_000].join("."));
    assert!(load_error(&text).contains("not valid TOML"));
}

#[test]
fn workers_per_device_set_in_code_past_the_bound_is_refused_by_validate() {
    let mut config = rmm_config::Config::default();
    config.workers_per_device = 100_000;
    assert_eq!(
        config.validate().unwrap_err().to_string(),
        "default workers_per_device = 100000: expected a whole number from 1 to 256"
    );
    config.workers_per_device = rmm_config::MAX_WORKERS_PER_DEVICE;
    config.validate().unwrap();
}

#[test]
fn rapids_rmms_own_variables_are_ignored_but_other_unknown_ones_are_errors() {
    for name in rmm_config::ENV_RAPIDS_IGNORED {
        let config = ConfigLoader::new()
            .no_file()
            .env_from([(*name, "/tmp/rmm_debug.log"), ("RMM_POOL__ENABLED", "true")])
            .load();
        assert!(
            config.as_ref().is_ok_and(|c| c.pool.enabled),
            "{name}: {config:?}"
        );
    }
    let err = ConfigLoader::new()
        .no_file()
        .env_from([("RMM_DEBUG_LOG_FILES", "x")])
        .load()
        .unwrap_err();
    assert!(
        err.to_string().contains("unknown setting debug_log_files"),
        "{err}"
    );
}

#[test]
fn a_pool_overhead_that_is_no_share_is_refused_with_the_forms_accepted() {
    // A bare number is a fraction: 5 would be 500 %, more likely a percentage without its sign.
    for bad in [r#""5GiB""#, "-0.1", r#""lots""#, r#""nan%""#, "5", "1.5"] {
        let e = load(&format!("[pool]\nenabled = true\nmax_overhead = {bad}\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("pool.max_overhead") && e.contains(r#"such as "5%""#),
            "{bad}: {e}"
        );
    }
    for (good, want) in [
        (r#""5%""#, Some(0.05)),
        ("0.1", Some(0.1)),
        (r#""150%""#, Some(1.5)),
        (r#""none""#, None),
    ] {
        let c = load(&format!("[pool]\nenabled = true\nmax_overhead = {good}\n")).unwrap();
        assert_eq!(c.pool.max_overhead.fraction(), want, "{good}");
    }
    // As an environment variable, a fraction too; shown as a share either way.
    let c = load_env(&[
        ("RMM_POOL__ENABLED", "true"),
        ("RMM_POOL__MAX_OVERHEAD", "0.07"),
    ])
    .unwrap();
    assert_eq!(c.pool.max_overhead.fraction(), Some(0.07));
    assert_eq!(c.pool.max_overhead.to_string(), "7%");
}

#[test]
fn a_pool_overhead_with_a_pool_that_cannot_map_names_both_keys_and_the_remedy() {
    for (key, value) in [("vmm", "false"), ("managed", "true")] {
        let e = load(&format!(
            "[pool]\nenabled = true\nmax_overhead = \"5%\"\n{key} = {value}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("pool.max_overhead")
                && e.contains(&format!("pool.{key} = {value}"))
                && e.contains(r#"set pool.max_overhead = "none""#),
            "{key}: {e}"
        );
    }
    // The pool off: the limit has nothing to act on, and nothing to contradict.
    load("[pool]\nvmm = false\nmax_overhead = \"5%\"\n").unwrap();
}
