//! Reinitialize and spilling (issue 22, items 3 and 4): a reinitialize applies the new
//! configuration's host pool and disk tier before it spills into them, so that it can
//! escape a too-small host pool; a failed one leaves the old configuration working;
//! `reconfigure` starts from the running configuration; a reinitialize that takes a device
//! or its spilling away from live spillable data says so in its report.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{device_count, pattern, read_on_device, serial, skip, spilling};
use rmm_allocator::StreamView;
use rmm_allocator::spill::{SpillableBuffer, Tier};
use rmm_runtime::{Error, Runtime, SpillManager};

const MIB: usize = 1 << 20;
const S: StreamView = StreamView::DEFAULT;

/// The set-up: device limit 8 MiB, host pool 16 MiB, no disk.
fn small_host(more: &[(&str, toml::Value)]) -> rmm_config::Config {
    spilling("8MiB", "16MiB", None, more)
}

fn manager(rt: &Runtime) -> Arc<SpillManager> {
    rt.spill_manager(rt.devices()[0]).expect("spilling is on")
}

/// Ten spillable buffers of 4 MiB with distinct contents: more than the device limit and
/// the host pool together hold, so some stay on the device over the limit.
fn ten_buffers(m: &SpillManager) -> (Vec<Arc<SpillableBuffer>>, Vec<Vec<u8>>) {
    let data: Vec<Vec<u8>> = (0..10).map(|i| contents(4 * MIB, 100 + i)).collect();
    let buffers = data.iter().map(|d| m.from_host(d, S).unwrap()).collect();
    (buffers, data)
}

/// `len` bytes distinct per `seed` and per 64 KiB block (a misplaced block shows), quick to
/// make in a debug build.
fn contents(len: usize, seed: u64) -> Vec<u8> {
    let block = pattern(64 << 10, seed);
    let mut out = block.repeat(len.div_ceil(block.len()));
    out.truncate(len);
    for (i, b) in out.iter_mut().enumerate() {
        *b ^= (i >> 16) as u8;
    }
    out
}

fn on_device(buffers: &[Arc<SpillableBuffer>]) -> usize {
    buffers.iter().filter(|b| b.tier() == Tier::Device).count()
}

fn assert_intact(buffers: &[Arc<SpillableBuffer>], data: &[Vec<u8>]) {
    for (b, d) in buffers.iter().zip(data) {
        assert!(b.to_vec().unwrap() == *d, "buffer {} changed", b.id());
    }
}

/// Every buffer comes back to the device with its bytes (one at a time: the limit spills the
/// others meanwhile).
fn assert_intact_on_device(buffers: &[Arc<SpillableBuffer>], data: &[Vec<u8>]) {
    for (b, d) in buffers.iter().zip(data) {
        assert!(read_on_device(b, S) == *d, "buffer {} changed", b.id());
    }
}

fn host_pool_size(rt: &Runtime) -> Option<u64> {
    rt.config().devices[0]
        .spill
        .as_ref()
        .expect("spilling is on")
        .host_pool_size
}

fn disk_directory(rt: &Runtime) -> Option<std::path::PathBuf> {
    rt.config().devices[0]
        .spill
        .as_ref()
        .expect("spilling is on")
        .disk_directory
        .clone()
}

/// The spill files this process holds open in `dir`; the directory holds no name (spill
/// files have none).
fn files_in(dir: &Path) -> usize {
    assert_eq!(common::names_in(dir), Vec::<String>::new(), "a named file");
    common::open_spill_files(dir).len()
}

#[test]
fn the_same_configuration_is_refused_with_advice_that_matches_the_cause() {
    let _s = serial();
    let rt = Runtime::start(&small_host(&[])).unwrap();
    let m = manager(&rt);
    let (buffers, data) = ten_buffers(&m);
    assert!(on_device(&buffers) > 2, "the host pool is full: some stay");
    let err = rt.reinitialize(&small_host(&[])).unwrap_err();
    // Known before anything moves: the host tier has less room than the data to move.
    assert!(matches!(err, Error::HostTierTooSmall { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("nothing changed"), "{text}");
    // The pool is too small: the advice is to give it more room, not less.
    assert!(text.contains("spill.host_pool_size"), "{text}");
    assert!(text.contains("spill.disk_directory"), "{text}");
    assert!(!text.contains("Lower the host pool size"), "{text}");
    assert_intact(&buffers, &data);
    assert_eq!(rt.submit(|_| 7).wait().unwrap(), 7);
}

#[test]
fn a_reinitialize_that_adds_a_disk_directory_escapes_a_full_host_pool() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::start(&small_host(&[])).unwrap();
    let m = manager(&rt);
    let (buffers, data) = ten_buffers(&m);
    let with_disk = spilling("8MiB", "16MiB", Some(dir.path()), &[]);
    let report = rt.reinitialize(&with_disk).unwrap();
    // Pool to pool: the device limit's worth stays in place, the rest is spilled.
    assert_eq!(on_device(&buffers), 2, "{report}");
    assert_eq!(report.kept_in_place_bytes, 8 * MIB as u64, "{report}");
    assert!(report.spilled_bytes >= 4 * MIB as u64, "{report}");
    assert!(files_in(dir.path()) > 0, "the new disk tier took the rest");
    assert_eq!(disk_directory(&rt).as_deref(), Some(dir.path()));
    assert_intact(&buffers, &data);
    assert_intact_on_device(&buffers, &data);
    let s = m.statistics();
    assert_eq!(
        s.host_pool_bytes,
        16 * MIB as u64,
        "the host pool is kept: {s:?}"
    );
    drop(buffers);
    assert_eq!(files_in(dir.path()), 0, "files go with their buffers");
    let s = m.statistics();
    assert_eq!((s.host_bytes, s.disk_bytes), (0, 0), "{s:?}");
}

#[test]
fn a_reinitialize_to_a_larger_host_pool_escapes_and_old_host_data_stays_readable() {
    let _s = serial();
    let rt = Runtime::start(&small_host(&[])).unwrap();
    let m = manager(&rt);
    let (buffers, data) = ten_buffers(&m);
    let on_host_before: Vec<bool> = buffers.iter().map(|b| b.tier() == Tier::Host).collect();
    assert_eq!(on_host_before.iter().filter(|h| **h).count(), 4);
    let report = rt
        .reinitialize(&spilling("8MiB", "64MiB", None, &[]))
        .unwrap();
    // The device limit's worth (two buffers) stays in place; the rest is on the host.
    assert_eq!(on_device(&buffers), 2, "{report}");
    assert_eq!(report.kept_in_place_bytes, 8 * MIB as u64, "{report}");
    assert_eq!(host_pool_size(&rt), Some(64 * MIB as u64));
    let s = m.statistics();
    assert_eq!(s.host_pool_bytes, 64 * MIB as u64, "{s:?}");
    // Host bytes count the old pool's data too, until it is gone.
    assert_eq!(s.host_bytes, 32 * MIB as u64, "{s:?}");
    assert_intact(&buffers, &data);
    assert_intact_on_device(&buffers, &data);
    drop(buffers);
    let s = m.statistics();
    assert_eq!((s.host_bytes, s.tracked_bytes), (0, 0), "{s:?}");
}

#[test]
fn a_failing_reinitialize_leaves_the_old_configuration_working() {
    let _s = serial();
    let rt = Runtime::start(&small_host(&[])).unwrap();
    let m = manager(&rt);
    let (buffers, data) = ten_buffers(&m);
    // 24 MiB are on the device: the limit's 8 MiB may stay in place, but 12 MiB more is not
    // enough for the other 16 MiB, and there is no disk.
    let err = rt
        .reinitialize(&spilling("8MiB", "12MiB", None, &[]))
        .unwrap_err();
    assert!(matches!(err, Error::HostTierTooSmall { .. }), "{err}");
    assert_eq!(host_pool_size(&rt), Some(16 * MIB as u64));
    assert_eq!(m.statistics().host_pool_bytes, 16 * MIB as u64);
    assert_intact(&buffers, &data);
    // A disk directory that cannot be used fails before anything moves.
    let file = tempfile::NamedTempFile::new().unwrap();
    let err = rt
        .reinitialize(&spilling("8MiB", "64MiB", Some(file.path()), &[]))
        .unwrap_err();
    assert!(matches!(err, Error::SpillTiers { .. }), "{err}");
    assert!(err.to_string().contains("spill.disk_directory"), "{err}");
    assert_eq!(host_pool_size(&rt), Some(16 * MIB as u64));
    assert_eq!(disk_directory(&rt), None);
    // The old configuration keeps working: tasks run, data comes back, new buffers spill.
    assert_eq!(rt.submit(|ctx| ctx.device().ordinal()).wait().unwrap(), 0);
    assert_intact_on_device(&buffers, &data);
    let more = m.from_host(&pattern(4 * MIB, 9), S).unwrap();
    assert!(more.to_vec().unwrap() == pattern(4 * MIB, 9));
    // And the escape still works afterwards.
    rt.reinitialize(&spilling("8MiB", "64MiB", None, &[]))
        .unwrap();
    assert_intact(&buffers, &data);
}

#[test]
fn reconfigure_keeps_devices_workers_and_spilling_and_changes_one_key() {
    let _s = serial();
    if device_count() < 2 {
        skip(
            "reconfigure_keeps_devices_workers_and_spilling_and_changes_one_key",
            "needs two devices",
        );
        return;
    }
    let config = common::config(&[
        ("devices", toml::Value::from("all")),
        ("workers_per_device", toml::Value::from(2)),
        ("pool.enabled", toml::Value::from(true)),
        ("pool.initial_size", toml::Value::from("64MiB")),
        ("spill.enabled", toml::Value::from(true)),
        ("spill.device_memory_limit", toml::Value::from("64MiB")),
        ("spill.host_pool_size", toml::Value::from("16MiB")),
    ]);
    let rt = Runtime::start(&config).unwrap();
    let devices = rt.devices();
    let workers = rt.workers().len();
    assert_eq!(workers, devices.len() * 2);
    let m1 = rt.spill_manager(1).unwrap();
    let data = pattern(MIB, 5);
    let b = m1.from_host(&data, S).unwrap();
    let report = rt
        .reconfigure(|running| running.set("pool.enabled", false))
        .unwrap();
    assert_eq!(rt.devices(), devices);
    assert_eq!(rt.workers().len(), workers);
    assert!(!report.respawned, "{report}");
    assert!(report.notes.is_empty(), "{report}");
    let resolved = rt.config();
    assert!(resolved.devices.iter().all(|d| d.spill.is_some()));
    assert!(resolved.devices.iter().all(|d| d.pool.is_none()));
    assert_eq!(
        rt.loaded_config().devices,
        rmm_config::Devices::All,
        "still all"
    );
    assert!(!rt.loaded_config().pool.enabled);
    assert!(read_on_device(&b, S) == data);
    // A change that does not load changes nothing.
    let err = rt
        .reconfigure(|running| running.set("pool.initial_size", "lots"))
        .unwrap_err();
    assert!(err.to_string().contains("lots"), "{err}");
    assert!(!rt.loaded_config().pool.enabled);
}

#[test]
fn a_reinitialize_that_drops_a_device_or_its_spilling_says_so_for_live_data() {
    let _s = serial();
    if device_count() < 2 {
        skip(
            "a_reinitialize_that_drops_a_device_or_its_spilling_says_so_for_live_data",
            "needs two devices",
        );
        return;
    }
    let config = common::config(&[
        ("devices", toml::Value::from(vec![0, 1])),
        ("workers_per_device", toml::Value::from(2)),
        ("spill.enabled", toml::Value::from(true)),
        ("spill.device_memory_limit", toml::Value::from("64MiB")),
        ("spill.host_pool_size", toml::Value::from("16MiB")),
    ]);
    let rt = Runtime::start(&config).unwrap();
    let data = pattern(MIB, 6);
    let b1 = rt.spill_manager(1).unwrap().from_host(&data, S).unwrap();
    let b0 = rt.spill_manager(0).unwrap().from_host(&data, S).unwrap();
    // The call: a partial configuration (device 0 only, no spilling).
    let report = rt
        .reinitialize(&common::config(&[(
            "pool.enabled",
            toml::Value::from(false),
        )]))
        .unwrap();
    assert_eq!(report.notes.len(), 2, "{report}");
    let text = report.to_string();
    assert!(text.contains("device 1 leaves the runtime"), "{text}");
    assert!(text.contains("spilling turns off on device 0"), "{text}");
    assert!(text.contains("1 spillable value of 1.00 MiB"), "{text}");
    // The data stays reachable and intact.
    assert!(b1.is_spilled() && b0.is_spilled());
    assert!(read_on_device(&b1, S) == data);
    assert!(read_on_device(&b0, S) == data);
    assert!(rt.spill_manager(1).is_some());
    // Without live spillable data there is nothing to say.
    drop((b0, b1));
    let report = rt.reinitialize(&config).unwrap();
    assert!(report.notes.is_empty(), "{report}");
}

#[test]
fn a_fixed_disk_directory_stays_across_a_reinitialize_that_names_none() {
    // A Dask worker's device store keeps its worker's directory as the disk tier, as it
    // keeps its device limit, whatever configuration a later reinitialize brings.
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::start(&small_host(&[])).unwrap();
    let m = manager(&rt);
    m.fix_disk_directory(dir.path()).unwrap();
    assert_eq!(m.store().disk_directory().as_deref(), Some(dir.path()));
    let (buffers, data) = ten_buffers(&m);
    assert!(
        files_in(dir.path()) > 0,
        "past the host pool, data goes to disk"
    );
    // No disk directory in the new configuration: the fixed one stays, and takes what the
    // full host pool cannot.
    rt.reinitialize(&small_host(&[])).unwrap();
    assert_eq!(
        on_device(&buffers),
        2,
        "the device limit's worth stays in place"
    );
    assert_eq!(m.store().disk_directory().as_deref(), Some(dir.path()));
    assert_intact(&buffers, &data);
    // A directory that cannot be used is refused and changes nothing.
    let file = tempfile::NamedTempFile::new().unwrap();
    let err = m.fix_disk_directory(file.path()).unwrap_err();
    assert!(err.to_string().contains("spill.disk_directory"), "{err}");
    assert_eq!(m.store().disk_directory().as_deref(), Some(dir.path()));
    drop(buffers);
    assert_eq!(files_in(dir.path()), 0);
}

#[test]
fn spilling_off_then_on_again_pins_a_fixed_host_pool_again() {
    let _s = serial();
    let rt = Runtime::start(&small_host(&[])).unwrap();
    let (buffers, data) = ten_buffers(&manager(&rt));
    assert_intact(&buffers, &data);
    drop(buffers);
    rt.reconfigure(|running| running.set("spill.enabled", false))
        .unwrap();
    rt.reconfigure(|running| running.set("spill.enabled", true))
        .unwrap();
    let m = manager(&rt);
    assert_eq!(m.statistics().host_pool_bytes, 16 * MIB as u64);
    let (buffers, data) = ten_buffers(&m);
    assert_eq!(
        buffers.iter().filter(|b| b.tier() == Tier::Host).count(),
        4,
        "the fixed host pool takes spills again"
    );
    assert_intact(&buffers, &data);
}
