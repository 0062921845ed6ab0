//! Settings that contradict each other or the machine: sizes for a feature that is off, a
//! spill limit above the hard limit, pinned host memory beyond the host's; and how much
//! pinned memory spilling keeps ahead of demand.

mod common;

use common::{GIB, load, load_error, resolve_error, two_devices};
use rmm_config::{ConfigLoader, DeviceFacts, PIN_AHEAD_WITHOUT_HOST_FACTS};

#[test]
fn a_pool_size_in_the_file_with_the_pool_off_is_an_error_naming_both_keys() {
    let e = load_error("[pool]\ninitial_size = \"8GiB\"");
    assert!(
        e.contains("pool.initial_size = 8GiB (file rmm.toml) has no effect: the pool is off"),
        "{e}"
    );
    assert!(
        e.contains("pool.enabled = false (default)") && e.contains("pool.async = false (default)"),
        "{e}"
    );
    // Set off in the same file: the same contradiction.
    let e = load_error("[pool]\nenabled = false\nmaximum_size = \"8GiB\"");
    assert!(
        e.contains("pool.maximum_size = 8GiB (file rmm.toml) has no effect"),
        "{e}"
    );
    // Per device too, and the growth step without rmm-rs's pool, and spilling's sizes.
    let e = load_error("[device.1]\npool.initial_size = \"1GiB\"");
    assert!(e.contains("device.1.pool.initial_size = 1GiB"), "{e}");
    let e = load_error("[pool]\nasync = true\ngrowth = \"2GiB\"");
    assert!(
        e.contains("pool.growth = 2GiB (file rmm.toml) has no effect: rmm-rs's pool is off"),
        "{e}"
    );
    let e = load_error("[spill]\nhost_pool_size = \"4GiB\"");
    assert!(
        e.contains("spill.host_pool_size = 4GiB (file rmm.toml) has no effect: spilling is off"),
        "{e}"
    );
}

#[test]
fn the_example_file_and_defaults_written_out_are_not_contradictions() {
    // rmm.toml lists every key with its default, features off.
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../rmm.toml")).unwrap();
    load(&text).unwrap();
    load("[pool]\ninitial_size = \"auto\"\ngrowth = \"1GiB\"\n[spill]\ndevice_memory_limit = \"80%\"")
        .unwrap();
}

#[test]
fn a_feature_turned_off_by_a_later_layer_keeps_its_sizes_quietly() {
    let file = "[pool]\nenabled = true\ninitial_size = \"8GiB\"";
    // The environment over the file.
    ConfigLoader::new()
        .toml_str("rmm.toml", file)
        .env_from([("RMM_POOL__ENABLED", "false")])
        .load()
        .unwrap();
    // Code over the file.
    ConfigLoader::new()
        .no_env()
        .toml_str("rmm.toml", file)
        .set("pool.enabled", false)
        .load()
        .unwrap();
    // A running configuration changed: its sizes are carried over, not set anew.
    let running = ConfigLoader::new()
        .no_file()
        .no_env()
        .set("pool.enabled", true)
        .set("pool.initial_size", "8GiB")
        .load()
        .unwrap();
    ConfigLoader::from_config(&running)
        .set("pool.enabled", false)
        .load()
        .unwrap();
    // A later override in code turns it off after the size was set.
    ConfigLoader::new()
        .no_file()
        .no_env()
        .set("pool.enabled", true)
        .set("pool.initial_size", "8GiB")
        .set("pool.enabled", false)
        .load()
        .unwrap();
    // But a size set after the switch that leaves it unused is refused.
    let e = ConfigLoader::new()
        .no_file()
        .no_env()
        .set("pool.enabled", false)
        .set("pool.initial_size", "8GiB")
        .load()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("pool.initial_size = 8GiB (code) has no effect"),
        "{e}"
    );
    let e = ConfigLoader::new()
        .no_file()
        .no_env()
        .set("pool.initial_size", "8GiB")
        .load()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("pool.initial_size = 8GiB (code) has no effect"),
        "{e}"
    );
    // And a size the environment sets on top of a file that leaves the pool off.
    let e = ConfigLoader::new()
        .toml_str("rmm.toml", "[pool]\nenabled = false")
        .env_from([("RMM_POOL__INITIAL_SIZE", "8GiB")])
        .load()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("pool.initial_size = 8GiB (environment RMM_POOL__INITIAL_SIZE)")
            && e.contains("pool.enabled = false (file rmm.toml)"),
        "{e}"
    );
}

#[test]
fn a_spill_limit_above_the_hard_limit_is_an_error_naming_both() {
    let e = resolve_error(
        "[spill]\nenabled = true\ndevice_memory_limit = \"60GiB\"\n[limits]\ndevice_memory_limit = \"50GiB\"",
    );
    assert!(
        e.contains("on device 0, spill.device_memory_limit = 60GiB (file rmm.toml) is above limits.device_memory_limit = 50GiB (file rmm.toml)"),
        "{e}"
    );
    assert!(e.contains("lower the spill limit"), "{e}");
    // A hard limit given as a fraction compares once resolved: 50% of 80 GiB is 40 GiB.
    let e = resolve_error(
        "[spill]\nenabled = true\ndevice_memory_limit = \"60GiB\"\n[limits]\ndevice_memory_limit = \"50%\"",
    );
    assert!(
        e.contains("is above limits.device_memory_limit = 50% = 40GiB"),
        "{e}"
    );
    // A spill limit given as a fraction is of the hard limit, where one is set: the default
    // 80% starts spilling before allocations fail.
    let r = load("[spill]\nenabled = true\n[limits]\ndevice_memory_limit = \"50GiB\"")
        .unwrap()
        .resolve(&two_devices())
        .unwrap();
    assert_eq!(r.devices[0].spill.as_ref().unwrap().threshold, 40 * GIB);
    // At or below the hard limit: fine.
    load("[spill]\nenabled = true\ndevice_memory_limit = \"40GiB\"\n[limits]\ndevice_memory_limit = \"50GiB\"")
        .unwrap()
        .resolve(&two_devices())
        .unwrap();
}

#[test]
fn pinned_host_memory_beyond_the_hosts_is_an_error() {
    // The two devices' host has 256 GiB.
    let e = resolve_error("[spill]\nenabled = true\nhost_pool_size = \"300GiB\"");
    assert!(
        e.contains(
            "spill.host_pool_size = 300GiB (file rmm.toml) is larger than the 256GiB of host memory"
        ),
        "{e}"
    );
    assert!(e.contains("\"none\" to pin only as spilling needs"), "{e}");
    let e = resolve_error("[spill]\nenabled = true\npin_ahead = \"1TiB\"");
    assert!(
        e.contains("spill.pin_ahead = 1TiB (file rmm.toml) is larger than"),
        "{e}"
    );
    // Unknown host memory: not checked.
    let unknown: Vec<DeviceFacts> = two_devices()
        .into_iter()
        .map(|f| DeviceFacts {
            host_memory: None,
            ..f
        })
        .collect();
    load("[spill]\nenabled = true\nhost_pool_size = \"300GiB\"")
        .unwrap()
        .resolve(&unknown)
        .unwrap();
}

#[test]
fn pinning_ahead_keeps_the_spill_limit_within_a_sixteenth_of_the_host_by_default() {
    let pin_ahead = |text: &str, facts: &[DeviceFacts]| {
        let resolved = load(text).unwrap().resolve(facts).unwrap();
        let each: Vec<u64> = resolved
            .devices
            .iter()
            .map(|d| d.spill.as_ref().unwrap().pin_ahead)
            .collect();
        assert!(each.iter().all(|&p| p == each[0]), "{each:?}");
        each[0]
    };
    let facts = two_devices();
    let one = "devices = [0]\n[spill]\nenabled = true";
    let both = "devices = [0, 1]\n[spill]\nenabled = true";
    // 80% of 80 GiB is 64 GiB; a sixteenth of 256 GiB is 16 GiB.
    assert_eq!(pin_ahead(one, &facts), 16 * GIB);
    assert_eq!(
        pin_ahead(&format!("{one}\ndevice_memory_limit = \"2GiB\""), &facts),
        2 * GIB
    );
    // A process pins for all its devices at one rate: "auto" is shared between them.
    assert_eq!(pin_ahead(both, &facts), 8 * GIB);
    assert_eq!(
        pin_ahead(&format!("{both}\ndevice_memory_limit = \"2GiB\""), &facts),
        GIB
    );
    // A device with a pool pinned at start does not pin ahead: it takes no share.
    assert_eq!(
        load(&format!(
            "{both}\n[device.1]\nspill.host_pool_size = \"8GiB\""
        ))
        .unwrap()
        .resolve(&facts)
        .unwrap()
        .devices[0]
            .spill
            .as_ref()
            .unwrap()
            .pin_ahead,
        16 * GIB
    );
    // A size is per device, as written.
    assert_eq!(
        pin_ahead(&format!("{both}\npin_ahead = \"4GiB\""), &facts),
        4 * GIB
    );
    assert_eq!(
        pin_ahead("[spill]\nenabled = true\npin_ahead = \"none\"", &facts),
        0
    );
    let unknown: Vec<DeviceFacts> = facts
        .into_iter()
        .map(|f| DeviceFacts {
            host_memory: None,
            ..f
        })
        .collect();
    assert_eq!(pin_ahead(one, &unknown), PIN_AHEAD_WITHOUT_HOST_FACTS);
}
