//! Reinitialize from pool to pool keeps idle spillable data where it is (issue 21): the new
//! pool takes the buffers' blocks over with their chunks, no copy. Checked on the simulated
//! device: the same device addresses, no spill move, every byte; the new stack's statistics,
//! limit, tracking and pool count the data exactly once and drop to zero once it is freed
//! (to the new pool); the old pool gives everything back; what a new stack cannot take is
//! spilled as before; a switch that fails leaves the old configuration working with every
//! byte where it was.

mod common;

use std::sync::Arc;

use common::{device_count, pattern, read_on_device, serial, sim, sim_live, skip, spilling};
use rmm_allocator::StreamView;
use rmm_allocator::adaptor::{LimitingResourceAdaptor, find_in_chain};
use rmm_allocator::backend::DevicePtr;
use rmm_allocator::spill::{SpillableBuffer, Tier};
use rmm_runtime::{DeviceStack, Error, Runtime, SpillManager, SpillStatistics};

const MIB: usize = 1 << 20;
const S: StreamView = StreamView::DEFAULT;

/// Spillable data of distinct contents and sizes (none of 64 KiB or less: those never
/// move), 48 MiB and a bit in all.
const SIZES: [usize; 6] = [
    4 * MIB,
    3 * MIB + 17,
    MIB,
    8 * MIB + 4096,
    200 << 10,
    32 * MIB,
];

/// One device, a 256 MiB pool in 4 MiB chunks, a 128 MiB device limit, a 64 MiB host pool,
/// and `more`.
fn config(more: &[(&str, toml::Value)]) -> rmm_config::Config {
    let mut settings = vec![("pool.growth", toml::Value::from("4MiB"))];
    settings.extend(more.iter().cloned());
    spilling("128MiB", "64MiB", None, &settings)
}

struct Data {
    buffers: Vec<Arc<SpillableBuffer>>,
    data: Vec<Vec<u8>>,
    ptrs: Vec<DevicePtr>,
}

impl Data {
    fn new(m: &SpillManager, sizes: &[usize], seed: u64) -> Data {
        let data: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| pattern(n, seed + i as u64))
            .collect();
        let buffers: Vec<Arc<SpillableBuffer>> =
            data.iter().map(|d| m.from_host(d, S).unwrap()).collect();
        let ptrs = buffers.iter().map(|b| b.device_ptr().unwrap()).collect();
        Data {
            buffers,
            data,
            ptrs,
        }
    }

    fn bytes(&self) -> u64 {
        self.data.iter().map(|d| d.len() as u64).sum()
    }

    /// Bytes as the pool and the limit count them (each rounded up to 256).
    fn rounded(&self) -> u64 {
        self.data
            .iter()
            .map(|d| d.len().next_multiple_of(256) as u64)
            .sum()
    }

    /// Every buffer reads back its bytes (wherever it is).
    fn assert_intact(&self, what: &str) {
        for (b, d) in self.buffers.iter().zip(&self.data) {
            assert!(
                b.to_vec().unwrap() == *d,
                "{what}: buffer {} changed",
                b.id()
            );
        }
    }

    /// Every buffer is on the device at the address it had when it was made.
    fn assert_in_place(&self, what: &str) {
        for (b, p) in self.buffers.iter().zip(&self.ptrs) {
            assert_eq!(b.tier(), Tier::Device, "{what}: buffer {} moved", b.id());
            assert_eq!(b.device_ptr(), Some(*p), "{what}: buffer {} moved", b.id());
        }
    }
}

/// Spill moves so far: (spilled, unspilled).
fn moves(s: &SpillStatistics) -> (u64, u64) {
    (s.spilled_count, s.unspilled_count)
}

fn limited(stack: &DeviceStack) -> usize {
    find_in_chain::<LimitingResourceAdaptor>(&**stack.resource())
        .expect("a limit in the stack")
        .used_bytes()
}

fn pool_in_use(stack: &DeviceStack) -> u64 {
    let pool = stack.pool().expect("a pool");
    pool.synchronize().unwrap();
    pool.validate().unwrap().in_use
}

#[test]
fn live_spillable_data_stays_in_place_across_pool_to_pool_and_is_counted_once() {
    let _s = serial();
    let baseline = sim_live(0);
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::start(&config(&[])).unwrap();
    let m = rt.spill_manager(0).unwrap();
    let d = Data::new(&m, &SIZES, 1);
    let old = rt.stack(0).unwrap();
    let before = m.statistics();
    // A new maximum, a hard limit, tracking and logging turned on: still pool to pool.
    let new_config = config(&[
        ("pool.maximum_size", "1GiB".into()),
        ("limits.device_memory_limit", "512MiB".into()),
        ("tracking.enabled", true.into()),
        ("logging.enabled", true.into()),
        ("logging.directory", dir.path().to_str().unwrap().into()),
    ]);
    let r = rt.reinitialize(&new_config).unwrap();
    assert_eq!(r.kept_in_place_bytes, d.bytes(), "{r}");
    assert_eq!(r.spilled_bytes, 0, "{r}");
    assert!(r.to_string().contains("kept in place"), "{r}");
    d.assert_in_place("after the switch");
    d.assert_intact("after the switch");
    let after = m.statistics();
    assert_eq!(moves(&after), moves(&before), "no spill move: {after:?}");
    assert_eq!(after.tracked_bytes, d.bytes(), "{after:?}");

    // The new stack counts the data once, in every layer; the old one no longer does.
    let new = rt.stack(0).unwrap();
    assert!(!Arc::ptr_eq(&old, &new));
    assert!(new.describe().contains("TrackingResourceAdaptor"));
    let n = d.buffers.len() as u64;
    let live = new.live();
    assert_eq!((live.count, live.bytes), (n, d.bytes()));
    assert_eq!(
        new.tracking().unwrap().outstanding_count() as u64,
        n,
        "tracked"
    );
    assert_eq!(limited(&new) as u64, d.rounded(), "under the hard limit");
    assert_eq!(pool_in_use(&new), d.rounded(), "in the new pool");
    assert_eq!(new.pool().unwrap().adopted_blocks().len() as u64, n);
    assert_eq!(old.live().count, 0);
    assert_eq!(old.statistics().lifetime_bytes().value, 0);
    assert_eq!(old.reserved_bytes(), 0, "the old pool gave everything back");

    // A task uses the data through the new stack.
    let b = Arc::clone(&d.buffers[0]);
    let want = d.data[0].clone();
    let same = rt
        .submit(move |ctx| read_on_device(&b, ctx.stream()) == want)
        .wait()
        .unwrap();
    assert!(same);

    // A buffer freed now goes back to the new pool; all freed, every figure is zero.
    let Data {
        mut buffers, data, ..
    } = d;
    drop(buffers.remove(0));
    let rest: u64 = data[1..]
        .iter()
        .map(|d| d.len().next_multiple_of(256) as u64)
        .sum();
    assert_eq!(pool_in_use(&new), rest);
    assert_eq!(limited(&new) as u64, rest);
    assert_eq!(new.live().count, n - 1);
    drop(buffers);
    assert_eq!(pool_in_use(&new), 0);
    assert_eq!(limited(&new), 0);
    assert_eq!((new.live().count, new.live().bytes), (0, 0));
    assert_eq!(new.tracking().unwrap().outstanding_count(), 0);
    assert_eq!(m.statistics().tracked_bytes, 0);
    // The new log has an allocation line for each buffer it took over, and its free.
    new.release().unwrap(); // flushes the log
    let log = std::fs::read_to_string(dir.path().join("rmm_log.dev0.csv")).unwrap();
    let lines = |action: &str| {
        log.lines()
            .filter(|l| l.split(',').nth(2) == Some(action))
            .count() as u64
    };
    assert_eq!((lines("allocate"), lines("free")), (n, n), "{log}");
    drop((old, new, m));
    rt.shutdown().unwrap();
    assert_eq!(sim_live(0), baseline, "device memory left after shutdown");
}

#[test]
fn pool_to_pool_on_several_devices_keeps_each_devices_data_in_place() {
    let _s = serial();
    if device_count() < 2 {
        skip(
            "pool_to_pool_on_several_devices_keeps_each_devices_data_in_place",
            "needs two devices",
        );
        return;
    }
    let two = |more: &[(&str, toml::Value)]| {
        let mut settings = vec![("devices", toml::Value::from(vec![0, 1]))];
        settings.extend(more.iter().cloned());
        config(&settings)
    };
    let rt = Runtime::start(&two(&[])).unwrap();
    let data: Vec<Data> = [0, 1]
        .iter()
        .map(|&dev| {
            Data::new(
                &rt.spill_manager(dev).unwrap(),
                &SIZES[..4],
                10 * dev as u64,
            )
        })
        .collect();
    let r = rt
        .reinitialize(&two(&[("pool.initial_size", "300MiB".into())]))
        .unwrap();
    let both: u64 = data.iter().map(Data::bytes).sum();
    assert_eq!((r.kept_in_place_bytes, r.spilled_bytes), (both, 0), "{r}");
    for (dev, d) in data.iter().enumerate() {
        d.assert_in_place(&format!("device {dev}"));
        d.assert_intact(&format!("device {dev}"));
        assert_eq!(rt.stack(dev as u32).unwrap().live().bytes, d.bytes());
    }
}

#[test]
fn data_the_new_stack_cannot_take_is_spilled_as_before_and_intact() {
    let _s = serial();
    let rt = Runtime::start(&config(&[])).unwrap();
    let m = rt.spill_manager(0).unwrap();
    let d = Data::new(&m, &SIZES, 20);
    let small = pattern(16 << 10, 99);
    let tiny = m.from_host(&small, S).unwrap();

    // Pool → pool: the 16 KiB buffer shares a slab and never moves; it is spilled.
    let r = rt.reinitialize(&config(&[])).unwrap();
    assert_eq!(r.kept_in_place_bytes, d.bytes(), "{r}");
    assert_eq!(r.spilled_bytes, small.len() as u64, "{r}");
    assert!(tiny.is_spilled());
    d.assert_in_place("the large ones");

    // A new pool of 8 MiB: the data that fits stays in place, the rest is spilled.
    let r = rt
        .reinitialize(&config(&[("pool.initial_size", "8MiB".into())]))
        .unwrap();
    // Most recently used first, what fits in 8 MiB: 200 KiB, 1 MiB and 3 MiB + 17.
    let fit = (200 << 10) + MIB + 3 * MIB + 17;
    assert_eq!(r.kept_in_place_bytes, fit as u64, "{r}");
    assert_eq!(r.kept_in_place_bytes + r.spilled_bytes, d.bytes(), "{r}");
    d.assert_intact("a smaller pool");
    let kept = d
        .buffers
        .iter()
        .filter(|b| b.tier() == Tier::Device)
        .count();
    let s = m.statistics();
    assert_eq!(s.tracked_bytes, r.kept_in_place_bytes, "{s:?}");
    assert_eq!(rt.stack(0).unwrap().live().count, kept as u64);

    // Pool → plain memory: nothing can be taken over; everything is spilled and comes back.
    let back_to_device: Vec<Vec<u8>> = d.buffers.iter().map(|b| read_on_device(b, S)).collect();
    assert!(back_to_device == d.data);
    let r = rt
        .reinitialize(&config(&[("pool.enabled", false.into())]))
        .unwrap();
    assert_eq!(
        (r.kept_in_place_bytes, r.spilled_bytes),
        (0, d.bytes()),
        "{r}"
    );
    assert!(d.buffers.iter().all(|b| b.is_spilled()));
    d.assert_intact("pool to plain");
    assert!(read_on_device(&tiny, S) == small);
    for (b, want) in d.buffers.iter().zip(&d.data) {
        assert!(read_on_device(b, S) == *want);
    }
}

#[test]
fn a_new_pool_over_one_allocation_too_large_to_take_spills_what_it_held() {
    let _s = serial();
    // One cuMemAlloc chunk of 256 MiB: a new pool of 64 MiB cannot take it, so the data it
    // held in place goes to the host after the new stack is built, before the switch.
    let plain = |initial: &str| {
        config(&[
            ("pool.vmm", false.into()),
            ("pool.initial_size", initial.into()),
        ])
    };
    let rt = Runtime::start(&plain("256MiB")).unwrap();
    let m = rt.spill_manager(0).unwrap();
    let d = Data::new(&m, &SIZES[..4], 30);
    let old = rt.stack(0).unwrap();
    let before = moves(&m.statistics());
    let r = rt.reinitialize(&plain("64MiB")).unwrap();
    assert_eq!(
        (r.kept_in_place_bytes, r.spilled_bytes),
        (0, d.bytes()),
        "{r}"
    );
    assert_eq!(moves(&m.statistics()).0, before.0 + 4);
    assert!(d.buffers.iter().all(|b| b.is_spilled()));
    assert_eq!(old.reserved_bytes(), 0, "the old pool gave its chunk back");
    d.assert_intact("spilled");
    // A new pool large enough for every chunk of the old one (its 64 MiB and what it grew
    // by for this data) takes them whole, data in place.
    let d = Data::new(&m, &SIZES[..4], 40);
    let r = rt.reinitialize(&plain("256MiB")).unwrap();
    assert_eq!(r.kept_in_place_bytes, d.bytes(), "{r}");
    d.assert_in_place("a larger pool");
    d.assert_intact("a larger pool");
}

#[test]
fn a_device_too_full_for_both_pools_spills_the_data_and_builds_again() {
    let _s = serial();
    if sim().is_none() {
        skip(
            "a_device_too_full_for_both_pools_spills_the_data_and_builds_again",
            "sized for the simulated device's 2 GiB",
        );
        return;
    }
    // One cuMemAlloc chunk of 1.25 GiB on a 2 GiB device: a new pool of 1 GiB cannot take
    // it, and cannot be made beside it either; with the data spilled the old chunk goes and
    // the new pool fits.
    let plain = |initial: &str| {
        config(&[
            ("pool.vmm", false.into()),
            ("pool.initial_size", initial.into()),
            ("pool.maximum_size", "1536MiB".into()),
        ])
    };
    let rt = Runtime::start(&plain("1280MiB")).unwrap();
    let m = rt.spill_manager(0).unwrap();
    let d = Data::new(&m, &SIZES[..4], 50);
    let r = rt.reinitialize(&plain("1GiB")).unwrap();
    assert_eq!(
        (r.kept_in_place_bytes, r.spilled_bytes),
        (0, d.bytes()),
        "{r}"
    );
    assert_eq!(rt.stack(0).unwrap().reserved_bytes(), 1 << 30);
    d.assert_intact("spilled and built again");
    for (b, want) in d.buffers.iter().zip(&d.data) {
        assert!(read_on_device(b, S) == *want);
    }
}

#[test]
fn a_switch_that_fails_leaves_the_old_configuration_working_with_the_data_in_place() {
    let _s = serial();
    let rt = Runtime::start(&config(&[])).unwrap();
    let m = rt.spill_manager(0).unwrap();
    let d = Data::new(&m, &SIZES, 60);
    let old = rt.stack(0).unwrap();
    let loaded = rt.loaded_config();
    let before = moves(&m.statistics());
    // The new stack's log cannot be made (its directory is a file): the stack fails after
    // its pool took the data over, and the pool gives it back as it is dropped.
    let file = tempfile::NamedTempFile::new().unwrap();
    let err = rt
        .reinitialize(&config(&[
            ("pool.initial_size", "300MiB".into()),
            ("logging.enabled", true.into()),
            ("logging.directory", file.path().to_str().unwrap().into()),
        ]))
        .unwrap_err();
    assert!(matches!(err, Error::DeviceSetup { device: 0, .. }), "{err}");
    assert_eq!(
        rt.loaded_config(),
        loaded,
        "the old configuration is in force"
    );
    assert!(Arc::ptr_eq(&rt.stack(0).unwrap(), &old));
    assert!(old.is_installed());
    d.assert_in_place("after the failure");
    d.assert_intact("after the failure");
    assert_eq!(moves(&m.statistics()), before, "nothing was spilled");
    // The old stack owns the data again: it counts it, and its pool has it.
    assert_eq!(old.live().bytes, d.bytes());
    assert_eq!(pool_in_use(&old), d.rounded());
    assert_eq!(old.pool().unwrap().pool_size(), 256 * MIB as u64);
    // It keeps working: tasks run, new buffers come and go, a freed buffer goes back to it.
    assert_eq!(rt.submit(|ctx| ctx.device().ordinal()).wait().unwrap(), 0);
    let more = m.from_host(&pattern(2 * MIB, 7), S).unwrap();
    assert!(more.to_vec().unwrap() == pattern(2 * MIB, 7));
    drop(more);
    let Data {
        mut buffers,
        mut data,
        mut ptrs,
    } = d;
    drop(buffers.pop());
    data.pop();
    ptrs.pop();
    let d = Data {
        buffers,
        data,
        ptrs,
    };
    assert_eq!(pool_in_use(&old), d.rounded());
    // And the switch works afterwards, data in place.
    let r = rt.reinitialize(&config(&[])).unwrap();
    assert_eq!(r.kept_in_place_bytes, d.bytes(), "{r}");
    d.assert_in_place("after a switch that worked");
    d.assert_intact("after a switch that worked");
}

#[test]
fn a_device_that_fails_to_switch_leaves_the_others_data_in_place() {
    let _s = serial();
    if device_count() < 2 {
        skip(
            "a_device_that_fails_to_switch_leaves_the_others_data_in_place",
            "needs two devices",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let two = |more: &[(&str, toml::Value)]| {
        let mut settings = vec![
            ("devices", toml::Value::from(vec![0, 1])),
            ("logging.enabled", true.into()),
            ("logging.directory", dir.path().to_str().unwrap().into()),
        ];
        settings.extend(more.iter().cloned());
        config(&settings)
    };
    let rt = Runtime::start(&two(&[])).unwrap();
    let data: Vec<Data> = [0, 1]
        .iter()
        .map(|&dev| {
            Data::new(
                &rt.spill_manager(dev).unwrap(),
                &SIZES[..4],
                70 + dev as u64,
            )
        })
        .collect();
    let old: Vec<Arc<DeviceStack>> = [0, 1].iter().map(|&d| rt.stack(d).unwrap()).collect();
    // Device 1's new log cannot be made (a directory stands where the file goes); device 0's
    // new stack is built, its pool holding device 0's data, then dropped with the rest.
    let log1 = dir.path().join("rmm_log.dev1.csv");
    std::fs::remove_file(&log1).ok();
    std::fs::create_dir(&log1).unwrap();
    let err = rt
        .reinitialize(&two(&[("pool.initial_size", "300MiB".into())]))
        .unwrap_err();
    assert!(matches!(err, Error::DeviceSetup { device: 1, .. }), "{err}");
    for (dev, d) in data.iter().enumerate() {
        let what = format!("device {dev} after the failure");
        assert!(Arc::ptr_eq(&rt.stack(dev as u32).unwrap(), &old[dev]));
        d.assert_in_place(&what);
        d.assert_intact(&what);
        assert_eq!(old[dev].live().bytes, d.bytes(), "{what}");
        assert_eq!(pool_in_use(&old[dev]), d.rounded(), "{what}");
    }
    std::fs::remove_dir(&log1).unwrap();
    let r = rt
        .reinitialize(&two(&[("pool.initial_size", "300MiB".into())]))
        .unwrap();
    let both: u64 = data.iter().map(Data::bytes).sum();
    assert_eq!(r.kept_in_place_bytes, both, "{r}");
    for d in &data {
        d.assert_in_place("after a switch that worked");
        d.assert_intact("after a switch that worked");
    }
}

#[test]
fn injected_allocation_failures_while_building_leave_every_byte_intact() {
    let _s = serial();
    let Some(sim) = sim() else {
        skip(
            "injected_allocation_failures_while_building_leave_every_byte_intact",
            "fault injection needs the simulated device",
        );
        return;
    };
    let rt = Runtime::start(&config(&[])).unwrap();
    let m = rt.spill_manager(0).unwrap();
    let d = Data::new(&m, &SIZES, 80);
    let loaded = rt.loaded_config();
    let larger = config(&[("pool.initial_size", "512MiB".into())]);
    // Every allocation for the new pool's memory beyond the old pool's fails: with the data
    // held in place, then (the device looks full) spilled and built again. It fails; the old
    // configuration stays, and the data is intact on the host.
    sim.fail_allocations_above(0, MIB).unwrap();
    let err = rt.reinitialize(&larger).unwrap_err();
    sim.clear_faults(0).unwrap();
    assert!(matches!(err, Error::DeviceSetup { device: 0, .. }), "{err}");
    assert_eq!(rt.loaded_config(), loaded);
    d.assert_intact("two failed builds");
    assert_eq!(rt.submit(|ctx| ctx.device().ordinal()).wait().unwrap(), 0);
    for (b, want) in d.buffers.iter().zip(&d.data) {
        assert!(read_on_device(b, S) == *want);
    }
    // Only the first fails: the second build, with the data spilled, succeeds.
    let d = Data::new(&m, &SIZES[..2], 90);
    sim.fail_nth_allocation(0, 1).unwrap();
    let r = rt.reinitialize(&larger);
    sim.clear_faults(0).unwrap();
    let r = r.unwrap();
    assert_eq!(r.kept_in_place_bytes, 0, "{r}");
    d.assert_intact("one failed build");
    assert_eq!(rt.loaded_config(), larger);
}

#[test]
fn a_buffer_in_use_blocks_the_switch_and_the_idle_ones_stay_where_they_were() {
    let _s = serial();
    let rt = Runtime::start(&config(&[])).unwrap();
    let m = rt.spill_manager(0).unwrap();
    let d = Data::new(&m, &SIZES[..4], 100);
    let busy = m.from_host(&pattern(MIB, 5), S).unwrap();
    let guard = busy.device_view(S).unwrap();
    let before = moves(&m.statistics());
    let err = rt.reinitialize(&config(&[])).unwrap_err();
    match &err {
        Error::LiveAllocations(live) => {
            assert_eq!((live[0].count, live[0].bytes), (1, MIB as u64), "{err}");
        }
        other => panic!("expected live allocations, got {other}"),
    }
    d.assert_in_place("refused");
    assert_eq!(moves(&m.statistics()), before, "nothing was spilled");
    drop(guard);
    let r = rt.reinitialize(&config(&[])).unwrap();
    assert_eq!(r.kept_in_place_bytes, d.bytes() + MIB as u64, "{r}");
    d.assert_in_place("switched");
    d.assert_intact("switched");
}
