//! Adopted values (`SpillManager::adopt`): device memory another library owns, kept under the
//! spill limit beside the manager's own buffers, spilled only when its owner says it is not
//! in use, counted once per allocation, and brought back into the current stack on use.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::foreign::{LibraryOwner, read_back};
use common::{FileSizeCap, config, devices, pattern, serial, sim};
use rmm_allocator::spill::Tier;
use rmm_allocator::{Error as AllocError, StreamView};
use rmm_runtime::{ForeignOwner, OwnerAccess, Runtime, SpillManager};

const MIB: usize = 1 << 20;
const S: StreamView = StreamView::DEFAULT;

/// A library's allocation on `device` holding `bytes`.
fn library_value(device: u32, bytes: &[u8], dropped: &Arc<AtomicUsize>) -> LibraryOwner {
    LibraryOwner::holding(device, &[bytes], dropped)
}

fn spilling(limit: &str, host: &str, disk: Option<&Path>) -> rmm_config::Config {
    common::spilling(limit, host, disk, &[])
}

/// A library's allocation holding `bytes`, adopted by `m`.
fn adopt_bytes(
    m: &SpillManager,
    bytes: &[u8],
    dropped: &Arc<AtomicUsize>,
) -> Arc<rmm_runtime::ForeignData<LibraryOwner>> {
    let o = library_value(0, bytes, dropped);
    m.adopt(&[o.allocations[0]], S, o)
}

fn manager(rt: &Runtime) -> Arc<SpillManager> {
    rt.spill_manager(rt.devices()[0]).expect("spilling is on")
}

#[test]
fn the_least_recently_used_value_spills_over_the_limit_and_comes_back_intact() {
    let _s = serial();
    sim();
    let rt = Runtime::start(&spilling("8MiB", "64MiB", None)).unwrap();
    let m = manager(&rt);
    let dropped = Arc::new(AtomicUsize::new(0));
    let data: Vec<Vec<u8>> = (0..3).map(|i| pattern(3 * MIB, i)).collect();
    let values: Vec<_> = data.iter().map(|d| adopt_bytes(&m, d, &dropped)).collect();
    // 9 MiB over an 8 MiB limit: the oldest went to the host and its owner was dropped.
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    assert_eq!(
        [values[0].tier(), values[1].tier(), values[2].tier()],
        [Tier::Host, Tier::Device, Tier::Device]
    );
    let s = m.statistics();
    assert_eq!(s.tracked_bytes, 6 * MIB as u64);
    assert_eq!((s.tracked_count, s.host.held_count), (2, 1));
    assert_eq!(s.spilled_bytes, 3 * MIB as u64);
    assert_eq!(s.host_bytes, 3 * MIB as u64);
    assert!(matches!(values[0].owner(|_| ()), OwnerAccess::Spilled));
    assert!(matches!(values[1].owner(|_| ()), OwnerAccess::Device(())));
    assert_eq!(
        values[0].spilled_bytes().unwrap().unwrap(),
        vec![data[0].clone()]
    );
    // Back on the device (pushing the next oldest off), every byte as it was.
    assert_eq!(read_back(&values[0]), vec![data[0].clone()]);
    assert_eq!(values[0].tier(), Tier::Device);
    assert_eq!(values[1].tier(), Tier::Host);
    assert_eq!(dropped.load(Ordering::SeqCst), 2);
    drop(values);
    let s = m.statistics();
    assert_eq!((s.tracked_bytes, s.host_bytes), (0, 0));
    assert_eq!(dropped.load(Ordering::SeqCst), 3);
}

#[test]
fn values_spill_by_next_use_when_it_is_told() {
    let _s = serial();
    sim();
    let rt = Runtime::start(&spilling("13MiB", "64MiB", None)).unwrap();
    let m = manager(&rt);
    let dropped = Arc::new(AtomicUsize::new(0));
    let data: Vec<Vec<u8>> = (0..7).map(|i| pattern(3 * MIB, i)).collect();
    let mut values: Vec<_> = data[..4]
        .iter()
        .map(|d| adopt_bytes(&m, d, &dropped))
        .collect();
    let tiers = |v: &[Arc<rmm_runtime::ForeignData<LibraryOwner>>]| {
        v.iter().map(|v| v.tier()).collect::<Vec<_>>()
    };
    // Least recently used, 0 would go first. Told next uses, the furthest (2) goes; a value
    // never told (3) goes after those; a use does not move a value whose next use is known.
    values[0].set_next_use(Some(10));
    values[1].set_next_use(Some(20));
    values[2].set_next_use(Some(30));
    values[2].touch();
    values.push(adopt_bytes(&m, &data[4], &dropped));
    assert_eq!(
        tiers(&values),
        [
            Tier::Device,
            Tier::Device,
            Tier::Host,
            Tier::Device,
            Tier::Device
        ]
    );
    // Nothing reads 3 again: it goes before any value with a next use.
    values[3].set_next_use(None);
    values.push(adopt_bytes(&m, &data[5], &dropped));
    assert_eq!(
        tiers(&values)[..4],
        [Tier::Device, Tier::Device, Tier::Host, Tier::Host]
    );
    // 0 is now read furthest ahead.
    values[0].set_next_use(Some(40));
    values.push(adopt_bytes(&m, &data[6], &dropped));
    assert_eq!(
        tiers(&values),
        [
            Tier::Host,
            Tier::Device,
            Tier::Host,
            Tier::Host,
            Tier::Device,
            Tier::Device,
            Tier::Device
        ]
    );
    for i in [0, 2, 3] {
        assert_eq!(
            values[i].spilled_bytes().unwrap().unwrap(),
            vec![data[i].clone()]
        );
    }
}

#[test]
fn a_value_in_use_is_never_spilled() {
    let _s = serial();
    sim();
    let rt = Runtime::start(&spilling("4MiB", "64MiB", None)).unwrap();
    let m = manager(&rt);
    let dropped = Arc::new(AtomicUsize::new(0));
    let busy = library_value(0, &pattern(3 * MIB, 1), &dropped);
    let in_use = Arc::clone(&busy.in_use);
    in_use.store(true, Ordering::SeqCst);
    let first = m.adopt(&[busy.allocations[0]], S, busy);
    let second = adopt_bytes(&m, &pattern(3 * MIB, 2), &dropped);
    // Over the limit, and the older value is in use: the new one goes (the limit holds).
    assert_eq!((first.tier(), second.tier()), (Tier::Device, Tier::Host));
    assert_eq!(m.spill_all().unwrap(), 0);
    assert_eq!(first.tier(), Tier::Device);
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    // Done with it: now it goes.
    in_use.store(false, Ordering::SeqCst);
    assert_eq!(m.spill_all().unwrap(), 3 * MIB as u64);
    assert_eq!(first.tier(), Tier::Host);
    assert_eq!(dropped.load(Ordering::SeqCst), 2);
}

#[test]
fn views_of_one_allocation_are_counted_once_and_freed_with_the_last() {
    let _s = serial();
    sim();
    let rt = Runtime::start(&spilling("64MiB", "64MiB", None)).unwrap();
    let m = manager(&rt);
    let dropped = Arc::new(AtomicUsize::new(0));
    let owner = library_value(0, &pattern(4 * MIB, 3), &dropped);
    let (ptr, size) = owner.allocations[0];
    let whole = m.adopt(&[(ptr, size)], S, owner);
    // A second value viewing the same allocation (held by a second handle to it).
    struct View(Arc<AtomicBool>);
    impl ForeignOwner for View {
        fn is_in_use(&self) -> bool {
            self.0.load(Ordering::SeqCst)
        }
    }
    let view = m.adopt(&[(ptr, size), (ptr, size)], S, View(Arc::default()));
    assert_eq!(view.size(), size);
    assert_eq!(m.statistics().tracked_bytes, size as u64);
    assert_eq!(m.statistics().tracked_count, 2);
    // Spilling one view frees nothing yet; the second frees the allocation.
    assert_eq!(view.spill().unwrap(), 0);
    assert_eq!(m.statistics().tracked_bytes, size as u64);
    assert_eq!(whole.spill().unwrap(), size);
    assert_eq!(m.statistics().tracked_bytes, 0);
}

#[test]
fn a_failed_spill_leaves_the_value_on_the_device_as_it_was() {
    let _s = serial();
    sim();
    // A 2 MiB host pool and no disk tier: a 3 MiB value cannot go anywhere.
    let rt = Runtime::start(&spilling("1MiB", "2MiB", None)).unwrap();
    let m = manager(&rt);
    let dropped = Arc::new(AtomicUsize::new(0));
    let data = pattern(3 * MIB, 4);
    let v = adopt_bytes(&m, &data, &dropped);
    assert_eq!(v.tier(), Tier::Device);
    assert!(matches!(v.spill(), Err(AllocError::HostOutOfMemory { .. })));
    assert_eq!(v.tier(), Tier::Device);
    assert_eq!(dropped.load(Ordering::SeqCst), 0);
    let s = m.statistics();
    assert_eq!((s.tracked_bytes, s.host_bytes), (3 * MIB as u64, 0));
    // The owner's memory still holds the data.
    let bytes = v.owner(|o| {
        let mut out = vec![0u8; o.allocations[0].1];
        rmm_allocator::Device::new(0)
            .unwrap()
            .copy_to_host(&mut out, o.allocations[0].0)
            .unwrap();
        out
    });
    assert!(matches!(bytes, OwnerAccess::Device(b) if b == data));
}

#[test]
fn values_go_on_to_disk_when_the_host_is_full_and_come_back() {
    let _s = serial();
    sim();
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::start(&spilling("4MiB", "4MiB", Some(dir.path()))).unwrap();
    let m = manager(&rt);
    let dropped = Arc::new(AtomicUsize::new(0));
    let data: Vec<Vec<u8>> = (0..4).map(|i| pattern(3 * MIB, 10 + i)).collect();
    let values: Vec<_> = data.iter().map(|d| adopt_bytes(&m, d, &dropped)).collect();
    let tiers: Vec<Tier> = values.iter().map(|v| v.tier()).collect();
    assert_eq!(tiers, [Tier::Disk, Tier::Disk, Tier::Host, Tier::Device]);
    assert_eq!(common::open_spill_files(dir.path()).len(), 2);
    assert_eq!(common::names_in(dir.path()), Vec::<String>::new());
    for (v, d) in values.iter().zip(&data).take(3) {
        assert_eq!(v.spilled_bytes().unwrap().unwrap(), vec![d.clone()]);
    }
    assert_eq!(read_back(&values[0]), vec![data[0].clone()]);
    drop(values);
    assert_eq!(common::open_spill_files(dir.path()).len(), 0);
    assert_eq!(m.statistics().disk_bytes, 0);
}

#[test]
fn adopted_values_survive_a_reinitialize() {
    let _s = serial();
    sim();
    let rt = Runtime::start(&spilling("64MiB", "64MiB", None)).unwrap();
    let m = manager(&rt);
    let dropped = Arc::new(AtomicUsize::new(0));
    let data = pattern(5 * MIB, 20);
    let v = adopt_bytes(&m, &data, &dropped);
    let report = rt
        .reinitialize(&config(&[
            ("devices", toml::Value::from(devices(1))),
            ("spill.enabled", toml::Value::from(true)),
            ("spill.host_pool_size", toml::Value::from("64MiB")),
        ]))
        .unwrap();
    assert_eq!(report.spilled_bytes, 5 * MIB as u64);
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    assert_eq!(v.tier(), Tier::Host);
    // Back into the new (plain) stack.
    assert_eq!(read_back(&v), vec![data]);
}

#[test]
fn a_spilled_value_in_use_on_the_device_stays_there() {
    let _s = serial();
    sim();
    let rt = Runtime::start(&spilling("64MiB", "64MiB", None)).unwrap();
    let m = manager(&rt);
    let dropped = Arc::new(AtomicUsize::new(0));
    let v = adopt_bytes(&m, &pattern(2 * MIB, 30), &dropped);
    assert_eq!(v.spill().unwrap(), 2 * MIB);
    let views = v.device_views(S).unwrap().expect("spilled");
    assert_eq!(
        m.spill_all().unwrap(),
        0,
        "a view holds the data on the device"
    );
    assert_eq!(v.tier(), Tier::Device);
    drop(views);
    assert_eq!(m.spill_all().unwrap(), 2 * MIB as u64);
    assert_eq!(v.tier(), Tier::Host);
}

#[test]
fn a_failing_disk_write_leaves_the_value_on_the_device_and_no_file() {
    let _s = serial();
    sim();
    let dir = tempfile::tempdir().unwrap();
    // A 4 MiB host pool: a 40 MiB value goes straight to disk, where writes fail past 1 MiB.
    let rt = Runtime::start(&spilling("1GiB", "4MiB", Some(dir.path()))).unwrap();
    let m = manager(&rt);
    let dropped = Arc::new(AtomicUsize::new(0));
    let data = pattern(40 * MIB, 40);
    let v = adopt_bytes(&m, &data, &dropped);
    {
        let _cap = FileSizeCap::new(MIB as u64);
        let err = v.spill().unwrap_err();
        assert!(matches!(err, AllocError::SpillFile { .. }), "{err}");
    }
    assert_eq!(v.tier(), Tier::Device);
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        0,
        "the owner keeps the memory"
    );
    assert_eq!(common::open_spill_files(dir.path()).len(), 0);
    let s = m.statistics();
    assert_eq!((s.tracked_bytes, s.disk_bytes), (40 * MIB as u64, 0));
    // Without the cap it goes, and comes back intact.
    assert_eq!(v.spill().unwrap(), 40 * MIB);
    assert_eq!(v.tier(), Tier::Disk);
    assert_eq!(read_back(&v), vec![data]);
}

#[test]
fn adopting_in_the_background_returns_before_the_spill_it_causes_ends() {
    let _s = serial();
    let Some(sim) = sim() else {
        eprintln!("SKIPPED: holding a stream back needs the simulated device (RMM_BACKEND=cuda)");
        return;
    };
    let rt = Runtime::start(&spilling("8MiB", "64MiB", None)).unwrap();
    let m = manager(&rt);
    let dropped = Arc::new(AtomicUsize::new(0));
    let held = rmm_allocator::backend::Backend::stream_create(sim, 0).unwrap();
    let first_bytes = pattern(6 * MIB, 1);
    let first = {
        let o = library_value(0, &first_bytes, &dropped);
        m.adopt_in_background(&[o.allocations[0]], StreamView::from_raw(held), o)
    };
    // The first value's copy must wait for its stream, held back here: a synchronous spill
    // would block the next adoption until the gate opens.
    let gate = sim.hold_stream(0, held).unwrap();
    let second_bytes = pattern(6 * MIB, 2);
    let (tx, rx) = std::sync::mpsc::channel();
    let second = {
        let m = Arc::clone(&m);
        let dropped = Arc::clone(&dropped);
        std::thread::spawn(move || {
            let o = library_value(0, &second_bytes, &dropped);
            let v = m.adopt_in_background(&[o.allocations[0]], S, o);
            tx.send(()).unwrap();
            v
        })
    };
    let returned = rx.recv_timeout(std::time::Duration::from_secs(5));
    assert!(
        returned.is_ok(),
        "adopt_in_background waited for a spill held back on its stream"
    );
    assert_eq!(
        first.tier(),
        Tier::Device,
        "the spill finished behind a held stream"
    );
    assert_eq!(dropped.load(Ordering::SeqCst), 0);
    gate.open();
    m.settle();
    let second = second.join().unwrap();
    assert_eq!(first.tier(), Tier::Host);
    assert_eq!(second.tier(), Tier::Device);
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        1,
        "the spilled value's memory was let go"
    );
    assert!(m.statistics().tracked_bytes <= 8 * MIB as u64);
    assert_eq!(read_back(&first), vec![first_bytes]);
    drop((first, second));
    rmm_allocator::backend::Backend::stream_destroy(sim, 0, held).unwrap();
}

#[test]
fn reading_back_with_room_made_in_the_background_runs_beside_the_spill_it_causes() {
    let _s = serial();
    let Some(sim) = sim() else {
        eprintln!("SKIPPED: holding a stream back needs the simulated device (RMM_BACKEND=cuda)");
        return;
    };
    let rt = Runtime::start(&spilling("8MiB", "64MiB", None)).unwrap();
    let m = manager(&rt);
    let dropped = Arc::new(AtomicUsize::new(0));
    let first_bytes = pattern(6 * MIB, 1);
    let first = {
        let o = library_value(0, &first_bytes, &dropped);
        m.adopt(&[o.allocations[0]], S, o)
    };
    assert_eq!(first.spill().unwrap(), 6 * MIB);
    // The second value's spill must wait for its stream, held back below.
    let held = rmm_allocator::backend::Backend::stream_create(sim, 0).unwrap();
    let second_bytes = pattern(6 * MIB, 2);
    let second = {
        let o = library_value(0, &second_bytes, &dropped);
        m.adopt(&[o.allocations[0]], StreamView::from_raw(held), o)
    };
    assert_eq!(second.tier(), Tier::Device);
    m.make_room_in_background(true);
    let gate = sim.hold_stream(0, held).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let first = Arc::new(first);
    let reader = {
        let first = Arc::clone(&first);
        std::thread::spawn(move || {
            let views = first.device_views(S).unwrap().expect("spilled");
            tx.send(()).unwrap();
            views
        })
    };
    let returned = rx.recv_timeout(std::time::Duration::from_secs(5));
    assert!(
        returned.is_ok(),
        "reading a value back waited for the spill it causes, held back on its stream"
    );
    assert_eq!(
        second.tier(),
        Tier::Device,
        "the spill ran behind a held stream"
    );
    gate.open();
    m.settle();
    let views = reader.join().unwrap();
    assert_eq!(
        second.tier(),
        Tier::Host,
        "the room was made after the read"
    );
    assert!(m.statistics().tracked_bytes <= 8 * MIB as u64);
    drop(views);
    assert_eq!(read_back(&first), vec![first_bytes]);
    assert_eq!(read_back(&second), vec![second_bytes]);
    m.make_room_in_background(false);
    drop((first, second));
    rmm_allocator::backend::Backend::stream_destroy(sim, 0, held).unwrap();
}
