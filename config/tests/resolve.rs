//! `Config::resolve`: device selection, bytes per device, device-dependent errors.

mod common;

use common::{GIB, load, resolve_error, two_devices};
use rmm_config::{
    Config, ConfigLoader, DeviceFacts, PoolPlan, ResolvedConfig, ResolvedSpill, Switch,
    UpstreamPlan,
};

fn resolve(text: &str) -> rmm_config::ResolvedConfig {
    load(text).unwrap().resolve(&two_devices()).unwrap()
}

/// Device `d`'s pool, which the configuration enables.
fn pool(r: &ResolvedConfig, d: usize) -> PoolPlan {
    r.devices[d].pool.expect("an enabled pool")
}

#[test]
fn defaults_resolve_to_device_0_with_plain_cuda() {
    let r = Config::default().resolve(&two_devices()).unwrap();
    assert_eq!(r.devices.len(), 1);
    let d = &r.devices[0];
    assert_eq!((d.ordinal, d.uuid.as_str()), (0, "GPU-aaaa"));
    assert_eq!((&d.upstream, d.pool), (&UpstreamPlan::Cuda, None));
    assert_eq!(
        (d.memory_limit, &d.spill, &d.log_file),
        (None, &None, &None)
    );
    assert_eq!(r.workers_per_device, 1);
}

#[test]
fn pool_growth_defaults_to_1_gib_and_takes_sizes_fractions_and_device_overrides() {
    let r = resolve("devices = \"all\"\n[pool]\nenabled = true");
    assert_eq!(pool(&r, 0).growth, GIB);
    let r = resolve(
        "devices = \"all\"\n[pool]\nenabled = true\ngrowth = \"256MiB\"\n\
         [device.1]\npool.growth = \"10%\"",
    );
    assert_eq!(pool(&r, 0).growth, GIB / 4);
    assert_eq!(pool(&r, 1).growth, 4 * GIB, "10% of 40 GiB");
    // Without the pool (turned off by a later layer) it is not used.
    let r = ConfigLoader::new()
        .toml_str("rmm.toml", "[pool]\nenabled = true\ngrowth = \"2GiB\"")
        .env_from([("RMM_POOL__ENABLED", "false")])
        .load()
        .unwrap()
        .resolve(&two_devices())
        .unwrap();
    assert_eq!(r.devices[0].pool, None);
    // A growth of nothing is refused, naming the key; one above the device is fine (the
    // pool grows by what is needed, up to its maximum).
    let e = load("[pool]\nenabled = true\ngrowth = 0")
        .unwrap_err()
        .to_string();
    assert!(e.contains("pool.growth"), "{e}");
    let r = resolve("[pool]\nenabled = true\ngrowth = \"100GiB\"");
    assert_eq!(pool(&r, 0).growth, 100 * GIB);
}

#[test]
fn device_selection() {
    let ordinals =
        |text: &str| -> Vec<u32> { resolve(text).devices.iter().map(|d| d.ordinal).collect() };
    assert_eq!(ordinals("devices = \"all\""), [0, 1]);
    assert_eq!(ordinals("devices = [1, 0]"), [1, 0]);
    assert_eq!(ordinals("devices = [\"gpu-BBBB\"]"), [1]);
    assert_eq!(ordinals("devices = 1"), [1]);
}

#[test]
fn pool_sizes_in_bytes() {
    // Default initial size: half the free memory (60 GiB free on device 0).
    let r = resolve("devices = \"all\"\n[pool]\nenabled = true");
    assert_eq!(pool(&r, 0).initial_size, 30 * GIB);
    assert_eq!(pool(&r, 1).initial_size, 20 * GIB);

    // Fractions are of the total memory; per-device overrides win.
    let r = resolve(
        "devices = \"all\"\n[pool]\nenabled = true\ninitial_size = \"25%\"\nmaximum_size = 0.75\n\
         [device.1]\npool.initial_size = \"8GiB\"\npool.maximum_size = \"none\"",
    );
    assert_eq!(pool(&r, 0).initial_size, 20 * GIB);
    assert_eq!(pool(&r, 0).maximum_size, Some(60 * GIB));
    assert_eq!(pool(&r, 1).initial_size, 8 * GIB);
    assert_eq!(pool(&r, 1).maximum_size, None);

    // The default initial size stays within the maximum and the hard limit.
    let r = resolve(
        "[pool]\nenabled = true\nmaximum_size = \"10GiB\"\n[limits]\ndevice_memory_limit = \"8GiB\"",
    );
    assert_eq!(pool(&r, 0).initial_size, 8 * GIB);
    assert_eq!(r.devices[0].memory_limit, Some(8 * GIB));
}

#[test]
fn sizes_round_down_to_256_bytes() {
    let r = resolve("[pool]\nenabled = true\ninitial_size = 1000\nmaximum_size = \"1.5 GB\"");
    assert_eq!(pool(&r, 0).initial_size, 768);
    assert_eq!(pool(&r, 0).maximum_size, Some(1_500_000_000 / 256 * 256));
    let odd = [DeviceFacts {
        ordinal: 0,
        uuid: "GPU-odd".into(),
        total_memory: 1_000_001,
        free_memory: Some(999_999),
        host_memory: None,
    }];
    let r = load("[pool]\nenabled = true\nmaximum_size = \"50%\"")
        .unwrap()
        .resolve(&odd)
        .unwrap();
    assert_eq!(pool(&r, 0).initial_size, 499_968);
    assert_eq!(pool(&r, 0).maximum_size, Some(499_968));
}

#[test]
fn async_pool_and_unused_sizes() {
    let r = resolve("[pool]\nasync = true\nrelease_threshold = \"1GiB\"\nmaximum_size = \"50%\"");
    assert_eq!(r.devices[0].pool, None);
    assert_eq!(
        r.devices[0].upstream,
        UpstreamPlan::Async {
            release_threshold: Some(GIB),
            initial_size: None, // the driver's default
        }
    );

    // Pool turned off by a later layer: its sizes are ignored, even ones that would not fit.
    let r = ConfigLoader::new()
        .toml_str(
            "rmm.toml",
            "[pool]\nasync = true\ninitial_size = \"200GiB\"\nrelease_threshold = \"1GiB\"",
        )
        .env_from([("RMM_POOL__ASYNC", "false")])
        .load()
        .unwrap()
        .resolve(&two_devices())
        .unwrap();
    assert_eq!(
        (&r.devices[0].upstream, r.devices[0].pool),
        (&UpstreamPlan::Cuda, None)
    );
}

#[test]
fn spill_logging_and_flags() {
    let r = resolve(
        "devices = [1]\n[spill]\nenabled = true\n\
         [logging]\nenabled = true\ndirectory = \"/var/log/rmm\"\nlevel = \"warn\"\n\
         [tracking]\nbacktraces = true\n[stats]\nenabled = true",
    );
    assert!(r.stats && !r.tracking && !r.backtraces);
    assert_eq!(r.logging_level, rmm_config::LogLevel::Warn);
    let d = &r.devices[0];
    assert_eq!(
        d.log_file.as_deref(),
        Some("/var/log/rmm/rmm_log.dev1.csv".as_ref())
    );
    assert_eq!(
        d.spill,
        Some(ResolvedSpill {
            threshold: 32 * GIB,
            host_pool_size: None,
            // The spill limit's worth, at most a sixteenth of the host's 256 GiB.
            pin_ahead: 16 * GIB,
            on_demand: true,
            eager_unspill: false,
            disk_directory: None,
        })
    );
}

#[test]
fn host_pool_may_exceed_the_device() {
    let r = resolve("[spill]\nenabled = true\nhost_pool_size = \"100GiB\"");
    assert_eq!(
        r.devices[0].spill.as_ref().unwrap().host_pool_size,
        Some(100 * GIB)
    );
}

#[test]
fn device_not_present() {
    assert_eq!(
        resolve_error("devices = [0, 2]"),
        "devices (file rmm.toml) names device 2, which is not present; present devices: \
         0 (GPU-aaaa), 1 (GPU-bbbb); choose from those, or use \"all\""
    );
    assert_eq!(
        resolve_error("devices = [\"GPU-cccc\"]"),
        "devices (file rmm.toml) names device GPU-cccc, which is not present; present \
         devices: 0 (GPU-aaaa), 1 (GPU-bbbb); choose from those, or use \"all\""
    );
    assert_eq!(
        resolve_error("[device.5]\nlimits.device_memory_limit = \"1GiB\""),
        "device.5 (file rmm.toml) names device 5, which is not present; present devices: \
         0 (GPU-aaaa), 1 (GPU-bbbb); remove the table or correct its ordinal"
    );
    assert_eq!(
        resolve_error("devices = [0, \"GPU-aaaa\"]"),
        "devices (file rmm.toml) selects device 0 twice (by ordinal and by UUID); list it once"
    );
    let err = load("devices = \"all\"").unwrap().resolve(&[]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "devices = all (file rmm.toml) but no device is present; check the driver and \
         CUDA_VISIBLE_DEVICES, or set backend = \"sim\""
    );
}

#[test]
fn size_larger_than_the_device() {
    assert_eq!(
        resolve_error("[pool]\nenabled = true\ninitial_size = \"100GiB\""),
        "pool.initial_size = 100GiB (file rmm.toml) is larger than device 0's 80GiB of \
         memory; use at most that, or a fraction such as \"90%\""
    );
    assert_eq!(
        resolve_error("devices = [1]\n[device.1]\nlimits.device_memory_limit = \"50GB\""),
        "device.1.limits.device_memory_limit = 50GB (file rmm.toml) is larger than device \
         1's 40GiB of memory; use at most that, or a fraction such as \"90%\""
    );
}

#[test]
fn size_that_rounds_to_zero() {
    assert_eq!(
        resolve_error("[pool]\nenabled = true\ninitial_size = 100"),
        "pool.initial_size = 100 (file rmm.toml) is below 256 bytes on device 0: sizes are \
         rounded down to a multiple of 256 bytes; use at least 256 bytes"
    );
}

#[test]
fn initial_above_maximum_or_limit_on_a_device() {
    assert_eq!(
        resolve_error("[pool]\nenabled = true\ninitial_size = \"50%\"\nmaximum_size = \"10GiB\""),
        "on device 0, pool.initial_size = 50% = 40GiB (file rmm.toml) is above \
         pool.maximum_size = 10GiB (file rmm.toml); lower the initial size or raise the maximum"
    );
    assert_eq!(
        resolve_error(
            "[pool]\nenabled = true\ninitial_size = \"16GiB\"\n[limits]\ndevice_memory_limit = \"10%\""
        ),
        "on device 0, pool.initial_size = 16GiB (file rmm.toml) is above \
         limits.device_memory_limit = 10% = 8GiB (file rmm.toml): the pool could not start; \
         lower the initial size or raise the limit"
    );
}

#[test]
fn resolve_reports_every_device_problem() {
    let err = load(
        "devices = \"all\"\n[pool]\nenabled = true\ninitial_size = \"60GiB\"\n\
         [device.0]\npool.initial_size = 100",
    )
    .unwrap()
    .resolve(&two_devices())
    .unwrap_err();
    let messages: Vec<String> = err.all().iter().map(|e| e.to_string()).collect();
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert!(messages[0].starts_with("device.0.pool.initial_size = 100 (file rmm.toml) is below"));
    assert!(
        messages[1]
            .starts_with("pool.initial_size = 60GiB (file rmm.toml) is larger than device 1's")
    );
}

#[test]
fn pool_vmm_is_true_false_or_auto() {
    assert_eq!(
        pool(&resolve("[pool]\nenabled = true"), 0).vmm,
        Switch::Auto
    );
    for (text, want) in [
        ("false", Switch::Off),
        ("true", Switch::On),
        ("\"auto\"", Switch::Auto),
        ("\"AUTO\"", Switch::Auto),
    ] {
        let r = resolve(&format!("[pool]\nenabled = true\nvmm = {text}"));
        assert_eq!(pool(&r, 0).vmm, want, "{text}");
    }
    let e = load("[pool]\nvmm = \"sometimes\"").unwrap_err().to_string();
    assert!(e.contains("pool.vmm") && e.contains("auto"), "{e}");
}

#[test]
fn free_memory_is_needed_only_for_a_default_initial_pool_size() {
    // Half the free memory is RMM's default initial pool: only then is free memory read.
    for (text, needed) in [
        ("", false),
        ("[pool]\nenabled = true", true),
        ("[pool]\nenabled = true\ninitial_size = \"auto\"", true),
        ("[pool]\nenabled = true\ninitial_size = \"2GiB\"", false),
        ("[pool]\nenabled = true\ninitial_size = \"50%\"", false),
        ("[pool]\nenabled = false", false),
        ("[pool]\nenabled = false\nasync = true", false),
        // A device that asks for the default itself.
        (
            "[pool]\nenabled = true\ninitial_size = \"2GiB\"\n[device.1]\npool.initial_size = \"auto\"",
            true,
        ),
    ] {
        let config = load(text).unwrap();
        assert_eq!(config.needs_free_memory(), needed, "{text:?}");
    }
}

#[test]
fn facts_without_free_memory_resolve_unless_a_size_depends_on_it() {
    let unread: Vec<DeviceFacts> = two_devices()
        .into_iter()
        .map(|f| DeviceFacts {
            free_memory: None,
            ..f
        })
        .collect();
    let r = load("devices = \"all\"\n[pool]\nenabled = true\ninitial_size = \"2GiB\"")
        .unwrap()
        .resolve(&unread)
        .unwrap();
    assert_eq!(pool(&r, 0).initial_size, 2 * GIB);
    assert_eq!(r.devices[0].free_memory, None);
    let e = load("[pool]\nenabled = true")
        .unwrap()
        .resolve(&unread)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("device 0") && e.contains("free_memory") && e.contains("pool.initial_size"),
        "{e}"
    );
}

#[test]
fn log_files_carry_the_device_before_the_extension_as_rmm_names_them() {
    use rmm_config::device_log_file_name as named;
    assert_eq!(named("rmm_log.csv", 0), "rmm_log.dev0.csv");
    assert_eq!(named("mylog", 3), "mylog.dev3");
    assert_eq!(named("archive.tar.gz", 1), "archive.tar.dev1.gz");
    assert_eq!(named(".hidden", 0), ".hidden.dev0");
    assert_eq!(named("..log", 0), "..log.dev0");
}

#[test]
fn a_log_file_name_with_a_directory_is_refused_with_the_remedy() {
    let err = rmm_config::ConfigLoader::new()
        .no_file()
        .env_from([("RMM_LOGGING__FILE_NAME", "logs/mylog.csv")])
        .load()
        .expect_err("a file name with a directory");
    let msg = err.to_string();
    assert!(msg.contains("RMM_LOGGING__FILE_NAME"), "{msg}");
    assert!(msg.contains("logs/mylog.csv"), "{msg}");
    assert!(
        msg.contains("put the directory in logging.directory"),
        "{msg}"
    );
}
