//! Spilling through all three tiers (device, pinned host, disk), typed vectors, host access,
//! a growable host pool, injected faults, a property test with every byte checked, and
//! workers sharing buffers while data moves through every tier.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{FileSizeCap, pattern, read_on_device, serial, sim, spilling};
use proptest::prelude::*;
use rmm_allocator::spill::{SpillableBuffer, Tier};
use rmm_allocator::{Error as AllocError, StreamView};
use rmm_runtime::{Runtime, SpillManager};

const MIB: usize = 1 << 20;
const S: StreamView = StreamView::DEFAULT;

/// One device, a pool, spilling with a `limit` device limit, a `host` pinned pool, and a
/// disk tier under `disk` when given.
fn tiers(limit: &str, host: &str, disk: Option<&Path>) -> rmm_config::Config {
    spilling(limit, host, disk, &[])
}

fn manager(rt: &Runtime) -> Arc<SpillManager> {
    rt.spill_manager(rt.devices()[0]).expect("spilling is on")
}

/// The spill files this process holds open in `dir`; the directory holds no name (spill
/// files have none).
fn files_in(dir: &Path) -> usize {
    assert_eq!(common::names_in(dir), Vec::<String>::new(), "a named file");
    common::open_spill_files(dir).len()
}

#[test]
fn a_full_host_pool_moves_the_oldest_host_data_on_to_disk() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::start(&tiers("4MiB", "4MiB", Some(dir.path()))).unwrap();
    let m = manager(&rt);
    let data: Vec<Vec<u8>> = (0..3).map(|i| pattern(3 * MIB, i)).collect();
    let b: Vec<_> = data.iter().map(|d| m.from_host(d, S).unwrap()).collect();
    // Each new buffer pushed the one before off the device; the host holds one of them.
    assert_eq!(
        [b[0].tier(), b[1].tier(), b[2].tier()],
        [Tier::Disk, Tier::Host, Tier::Device]
    );
    assert_eq!(files_in(dir.path()), 1);
    // The oldest comes back from disk; the newest goes to the host, pushing the other on.
    assert!(read_on_device(&b[0], S) == data[0]);
    assert_eq!(
        [b[0].tier(), b[1].tier(), b[2].tier()],
        [Tier::Device, Tier::Disk, Tier::Host]
    );
    for (x, d) in b.iter().zip(&data) {
        assert!(x.to_vec().unwrap() == *d, "buffer {} changed", x.id());
    }
    let s = m.statistics();
    assert_eq!(s.disk.spilled_count, 2, "{s:?}");
    assert_eq!(s.disk.unspilled_count, 1, "{s:?}");
    assert_eq!(s.disk_bytes, 3 * MIB as u64);
    assert_eq!(s.host.held_bytes, 3 * MIB as u64);
    drop(b);
    let s = m.statistics();
    assert_eq!(
        (s.tracked_bytes, s.host_bytes, s.disk_bytes),
        (0, 0, 0),
        "{s:?}"
    );
    assert_eq!(
        files_in(dir.path()),
        0,
        "spill files are removed with their buffers"
    );
}

#[test]
fn a_buffer_larger_than_the_host_pool_goes_straight_to_disk_and_back() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::start(&tiers("1GiB", "4MiB", Some(dir.path()))).unwrap();
    let m = manager(&rt);
    // More than two staging slots: the copy and the file write overlap chunk by chunk.
    let data = pattern(80 * MIB + 4096 + 3, 5);
    let b = m.from_host(&data, S).unwrap();
    assert_eq!(b.spill().unwrap(), data.len());
    assert_eq!(b.tier(), Tier::Disk);
    assert_eq!(m.statistics().host_bytes, 0);
    assert!(b.to_vec().unwrap() == data);
    assert!(read_on_device(&b, S) == data);
    assert_eq!(b.tier(), Tier::Device);
    let s = m.statistics();
    assert_eq!(s.disk.spilled_bytes, data.len() as u64, "{s:?}");
    assert_eq!(s.unspilled_bytes, data.len() as u64, "{s:?}");
    assert_eq!(files_in(dir.path()), 0);
}

#[test]
fn a_host_view_brings_data_to_the_host_and_changes_stay() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::start(&tiers("1GiB", "16MiB", Some(dir.path()))).unwrap();
    let m = manager(&rt);
    let mut data = pattern(5 * MIB + 7, 8);
    let b = m.from_host(&data, S).unwrap();
    {
        let mut host = b.host_view().unwrap();
        assert_eq!(b.tier(), Tier::Host);
        assert!(host.to_vec() == data);
        for chunk in host.chunks_mut() {
            chunk.iter_mut().for_each(|x| *x = x.wrapping_add(1));
        }
    }
    data.iter_mut().for_each(|x| *x = x.wrapping_add(1));
    // From disk, a host view reads the file back into pinned memory.
    assert_eq!(b.spill_to_disk().unwrap(), data.len());
    assert_eq!(b.tier(), Tier::Disk);
    assert!(b.host_view().unwrap().to_vec() == data);
    assert_eq!(b.tier(), Tier::Host);
    assert!(read_on_device(&b, S) == data);
    // In use on the device: no host view (the data cannot move), but a copy.
    let guard = b.device_view(S).unwrap();
    assert!(b.host_view().is_err());
    assert!(b.to_vec().unwrap() == data);
    drop(guard);
}

#[test]
fn spillable_vectors_keep_their_elements_through_every_tier() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::start(&tiers("1GiB", "8MiB", Some(dir.path()))).unwrap();
    let m = manager(&rt);
    let values: Vec<u64> = (0..300_000u64).map(|i| i * i + 7).collect();
    let v = m.vector_from_slice(&values, S).unwrap();
    assert_eq!(v.len(), values.len());
    assert_eq!(v.spill().unwrap(), values.len() * 8);
    assert_eq!(v.tier(), Tier::Host);
    assert_eq!(v.to_vec().unwrap(), values);
    assert_eq!(v.buffer().spill_to_disk().unwrap(), values.len() * 8);
    assert_eq!(v.to_vec().unwrap(), values);
    {
        let g = v.device_view(S).unwrap();
        let mut back = vec![0u64; values.len()];
        v.buffer()
            .device()
            .copy_to_host(bytemuck::cast_slice_mut(&mut back), g.ptr())
            .unwrap();
        assert_eq!(back, values);
    }
    let floats: rmm_allocator::spill::SpillableVector<f32> = m.vector(1000, S).unwrap();
    assert_eq!(floats.buffer().size(), 4000);
    let odd = m.buffer(10, S).unwrap();
    assert!(rmm_allocator::spill::SpillableVector::<u32>::from_buffer(odd).is_err());
}

#[test]
fn host_pool_none_pins_host_memory_as_needed() {
    let _s = serial();
    let rt = Runtime::start(&tiers("8MiB", "none", None)).unwrap();
    let m = manager(&rt);
    // Nothing pinned up front beyond what is pinned ahead of demand in the background: the
    // device limit's worth, in steps of at least 32 MiB (it may not have started yet).
    let up_front = m.statistics().host_pool_bytes;
    assert!(
        up_front <= 32 * MIB as u64,
        "{up_front} bytes pinned up front"
    );
    let data: Vec<Vec<u8>> = (0..8).map(|i| pattern(6 * MIB, i + 40)).collect();
    let b: Vec<_> = data.iter().map(|d| m.from_host(d, S).unwrap()).collect();
    let s = m.statistics();
    // Spills that found nothing pinned yet went to pageable memory rather than wait.
    assert!(
        s.host_pool_bytes + s.host_pageable_bytes >= s.host_bytes
            && s.host_bytes >= 36 * MIB as u64
            && s.host_pageable_total_bytes >= s.host_pageable_bytes,
        "{s:?}"
    );
    for (x, d) in b.iter().zip(&data) {
        assert!(read_on_device(x, S) == *d);
    }
}

#[test]
fn a_failing_spill_copy_leaves_the_buffer_on_the_device() {
    let _s = serial();
    let Some(sim) = sim() else { return };
    let rt = Runtime::start(&tiers("1GiB", "16MiB", None)).unwrap();
    let m = manager(&rt);
    let data = pattern(3 * MIB, 2);
    let b = m.from_host(&data, S).unwrap();
    let dev = b.device().ordinal();
    sim.fail_nth_copy(dev, 1).unwrap();
    let err = b.spill().unwrap_err();
    sim.clear_faults(dev).unwrap();
    assert!(matches!(err, AllocError::InjectedFault { .. }), "{err}");
    assert_eq!(b.tier(), Tier::Device);
    assert!(b.to_vec().unwrap() == data);
    let s = m.statistics();
    assert_eq!((s.host_bytes, s.spilled_count), (0, 0), "{s:?}");
    assert_eq!(s.tracked_bytes, data.len() as u64);
    // And it spills fine afterwards.
    assert_eq!(b.spill().unwrap(), data.len());
    assert!(b.to_vec().unwrap() == data);
}

#[test]
fn a_failing_unspill_copy_leaves_the_buffer_spilled_and_frees_its_new_memory() {
    let _s = serial();
    let Some(sim) = sim() else { return };
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::start(&tiers("1GiB", "16MiB", Some(dir.path()))).unwrap();
    let m = manager(&rt);
    let stack = rt.stack(rt.devices()[0]).unwrap();
    let data = pattern(3 * MIB, 4);
    let b = m.from_host(&data, S).unwrap();
    let dev = b.device().ordinal();
    for tier in [Tier::Host, Tier::Disk] {
        if tier == Tier::Host {
            b.spill().unwrap();
        } else {
            b.spill_to_disk().unwrap();
        }
        assert_eq!(b.tier(), tier);
        let live = stack.live().count;
        sim.fail_nth_copy(dev, 1).unwrap();
        assert!(b.device_view(S).is_err());
        sim.clear_faults(dev).unwrap();
        assert_eq!(b.tier(), tier, "still spilled");
        assert_eq!(
            stack.live().count,
            live,
            "the new allocation was given back"
        );
        assert_eq!(m.statistics().tracked_bytes, 0);
        assert!(b.to_vec().unwrap() == data);
    }
    assert!(read_on_device(&b, S) == data);
}

#[test]
fn a_full_host_pool_without_a_disk_tier_is_an_error_and_nothing_leaks() {
    let _s = serial();
    let rt = Runtime::start(&tiers("1GiB", "4MiB", None)).unwrap();
    let m = manager(&rt);
    let small = m.from_host(&pattern(3 * MIB, 1), S).unwrap();
    small.spill().unwrap();
    let data = pattern(2 * MIB, 3);
    let b = m.from_host(&data, S).unwrap();
    let err = b.spill().unwrap_err();
    assert!(matches!(err, AllocError::HostOutOfMemory { .. }), "{err}");
    assert_eq!(b.tier(), Tier::Device);
    assert!(b.to_vec().unwrap() == data);
    assert_eq!(
        m.statistics().host_bytes,
        3 * MIB as u64,
        "only the first buffer's bytes"
    );
    assert!(b.spill_to_disk().is_err(), "no disk tier");
}

#[test]
fn a_failing_disk_write_leaves_the_buffer_where_it_was() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::start(&tiers("1GiB", "4MiB", Some(dir.path()))).unwrap();
    let m = manager(&rt);
    let on_host = pattern(3 * MIB, 6);
    let h = m.from_host(&on_host, S).unwrap();
    h.spill().unwrap();
    let on_device = pattern(40 * MIB, 7);
    let d = m.from_host(&on_device, S).unwrap();
    {
        let _cap = FileSizeCap::new(MIB as u64);
        // Straight from the device (the host pool is too small): the second chunk fails.
        let err = d.spill().unwrap_err();
        assert!(
            matches!(
                err,
                AllocError::SpillFile {
                    operation: "write",
                    ..
                }
            ),
            "{err}"
        );
        // From the host.
        let err = h.spill_to_disk().unwrap_err();
        assert!(matches!(err, AllocError::SpillFile { .. }), "{err}");
    }
    assert_eq!((d.tier(), h.tier()), (Tier::Device, Tier::Host));
    assert!(d.to_vec().unwrap() == on_device);
    assert!(h.to_vec().unwrap() == on_host);
    assert_eq!(files_in(dir.path()), 0, "failed files are removed");
    let s = m.statistics();
    assert_eq!(s.disk_bytes, 0, "{s:?}");
    assert_eq!(s.host_bytes, 3 * MIB as u64, "{s:?}");
    // With room again, both go to disk.
    assert_eq!(d.spill().unwrap(), on_device.len());
    assert_eq!(h.spill_to_disk().unwrap(), on_host.len());
    assert!(read_on_device(&d, S) == on_device && read_on_device(&h, S) == on_host);
}

#[test]
fn a_missing_disk_directory_fails_the_spill_not_the_buffer() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let spill_dir = dir.path().join("spill");
    let rt = Runtime::start(&tiers("1GiB", "4MiB", Some(&spill_dir))).unwrap();
    let m = manager(&rt);
    let data = pattern(6 * MIB, 9);
    let b = m.from_host(&data, S).unwrap();
    std::fs::remove_dir(&spill_dir).unwrap();
    let err = b.spill().unwrap_err();
    assert!(
        matches!(
            err,
            AllocError::SpillFile {
                operation: "create",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("spill.disk_directory"), "{err}");
    assert_eq!(b.tier(), Tier::Device);
    assert!(b.to_vec().unwrap() == data);
}

/// One step of the property test.
#[derive(Debug, Clone)]
enum Op {
    New { size: usize, seed: u64 },
    Drop(usize),
    ReadDevice(usize),
    ReadHost(usize),
    WriteHost(usize, u8),
    Spill(usize),
    SpillToDisk(usize),
    SpillAll,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (prop_oneof![0usize..4096, 4096usize..(2 * MIB), Just(0)], any::<u64>())
            .prop_map(|(size, seed)| Op::New { size, seed }),
        1 => any::<usize>().prop_map(Op::Drop),
        4 => any::<usize>().prop_map(Op::ReadDevice),
        2 => any::<usize>().prop_map(Op::ReadHost),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(i, v)| Op::WriteHost(i, v)),
        2 => any::<usize>().prop_map(Op::Spill),
        1 => any::<usize>().prop_map(Op::SpillToDisk),
        1 => Just(Op::SpillAll),
    ]
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// Many buffers of random contents under limits that force constant spilling through
    /// all three tiers, random accesses: every byte is what was last written.
    #[test]
    fn every_byte_survives_constant_spilling(ops in proptest::collection::vec(op(), 100..400)) {
        let _s = serial();
        let dir = tempfile::tempdir().unwrap();
        let rt = Runtime::start(&tiers("6MiB", "6MiB", Some(dir.path()))).unwrap();
        let m = manager(&rt);
        let mut live: Vec<(Arc<SpillableBuffer>, Vec<u8>)> = Vec::new();
        for op in ops {
            let n = live.len();
            match op {
                Op::New { size, seed } => {
                    let data = pattern(size, seed);
                    live.push((m.from_host(&data, S).unwrap(), data));
                }
                Op::Drop(i) if n > 0 => { live.swap_remove(i % n); }
                Op::ReadDevice(i) if n > 0 => {
                    let (b, d) = &live[i % n];
                    prop_assert!(read_on_device(b, S) == *d, "buffer {} changed", b.id());
                }
                Op::ReadHost(i) if n > 0 => {
                    let (b, d) = &live[i % n];
                    prop_assert!(b.host_view().unwrap().to_vec() == *d);
                }
                Op::WriteHost(i, v) if n > 0 => {
                    let (b, d) = &mut live[i % n];
                    let mut g = b.host_view().unwrap();
                    for c in g.chunks_mut() {
                        c.iter_mut().for_each(|x| *x ^= v);
                    }
                    d.iter_mut().for_each(|x| *x ^= v);
                }
                Op::Spill(i) if n > 0 => { live[i % n].0.spill().unwrap(); }
                Op::SpillToDisk(i) if n > 0 => { live[i % n].0.spill_to_disk().unwrap(); }
                Op::SpillAll => { m.spill_all().unwrap(); }
                _ => {}
            }
            let s = m.statistics();
            prop_assert!(s.tracked_bytes <= s.limit, "{s:?}");
            let on = |t: Tier| live.iter().filter(|(b, _)| b.tier() == t).map(|(b, _)| b.size() as u64).sum::<u64>();
            prop_assert_eq!(s.tracked_bytes, on(Tier::Device));
            prop_assert_eq!(s.disk_bytes, on(Tier::Disk));
        }
        for (b, d) in &live {
            prop_assert!(b.to_vec().unwrap() == *d, "buffer {} changed", b.id());
        }
        drop(live);
        let s = m.statistics();
        prop_assert_eq!((s.tracked_bytes, s.host_bytes, s.disk_bytes), (0, 0, 0));
        prop_assert_eq!(files_in(dir.path()), 0);
    }
}

#[test]
fn eight_workers_share_buffers_while_data_moves_through_every_tier() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let cfg = spilling(
        "24MiB",
        "24MiB",
        Some(dir.path()),
        &[("workers_per_device", 8.into())],
    );
    let rt = Runtime::start(&cfg).unwrap();
    let m = manager(&rt);
    let data: Arc<Vec<Vec<u8>>> =
        Arc::new((0..24).map(|i| pattern(4 * MIB + i, i as u64)).collect());
    let buffers: Arc<Vec<Arc<SpillableBuffer>>> =
        Arc::new(data.iter().map(|d| m.from_host(d, S).unwrap()).collect());
    let handles = rt.run_on_all(move |ctx| {
        let mut x = u64::from(ctx.worker().index) + 1;
        for step in 0..50 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x % buffers.len() as u64) as usize;
            let b = &buffers[i];
            let got = match step % 3 {
                0 => b.to_vec().unwrap(),
                1 => match b.host_view() {
                    Ok(g) => g.to_vec(),
                    // In use on the device by another worker right now.
                    Err(_) => b.to_vec().unwrap(),
                },
                _ => read_on_device(b, ctx.stream()),
            };
            assert!(got == data[i], "buffer {i} changed");
        }
    });
    for h in handles {
        h.wait_timeout(Duration::from_secs(300)).unwrap();
    }
    let s = m.statistics();
    assert!(
        s.host.spilled_count > 0 && s.disk.spilled_count > 0,
        "{s:?}"
    );
}

#[test]
fn a_disk_directory_that_cannot_hold_files_fails_at_start_up() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    for bad in [Path::new("/proc"), file.as_path(), &file.join("below")] {
        let err = Runtime::start(&tiers("1GiB", "4MiB", Some(bad)))
            .err()
            .unwrap_or_else(|| panic!("{} was accepted", bad.display()));
        let text = err.to_string();
        assert!(
            text.contains(&format!("spill.disk_directory = {}", bad.display()))
                && text.contains("a writable directory")
                && text.contains("\"none\""),
            "{text}"
        );
    }
    // A missing directory is created, and the probe leaves nothing behind.
    let fresh = dir.path().join("new").join("spill");
    let rt = Runtime::start(&tiers("1GiB", "4MiB", Some(&fresh))).unwrap();
    assert_eq!(files_in(&fresh), 0);
    rt.shutdown().unwrap();
}

/// Names the directory [`spilling_child_of_the_kill_test`] spills to (no `RMM_` prefix: the
/// configuration would read that as a key).
const KILL_CHILD_DIR: &str = "SPILL_KILL_TEST_CHILD_DIR";

/// Not a test of its own: the child process of
/// [`a_process_killed_while_spilling_to_disk_leaves_nothing_the_next_start_keeps`], which
/// spills to disk without end (keeping the last eight buffers' files) until it is killed.
#[test]
#[ignore = "run as the child process of the kill test"]
fn spilling_child_of_the_kill_test() {
    let dir = std::env::var_os(KILL_CHILD_DIR).expect("run by the kill test");
    let rt = Runtime::start(&tiers("1GiB", "2MiB", Some(Path::new(&dir)))).unwrap();
    let m = manager(&rt);
    let mut kept = std::collections::VecDeque::new();
    for seed in 0.. {
        let b = m.from_host(&pattern(MIB, seed), S).unwrap();
        b.spill_to_disk().unwrap();
        kept.push_back(b);
        if kept.len() > 8 {
            kept.pop_front();
        }
    }
}

#[test]
fn a_process_killed_while_spilling_to_disk_leaves_nothing_the_next_start_keeps() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "spilling_child_of_the_kill_test",
            "--ignored",
            "--nocapture",
        ])
        .env(KILL_CHILD_DIR, dir.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while common::open_spill_files_of(child.id(), dir.path()).len() < 4 {
        assert!(
            std::time::Instant::now() < deadline && child.try_wait().unwrap().is_none(),
            "the child spilled nothing to {}",
            dir.path().display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL, in the middle of spilling
    child.wait().unwrap();
    // Its files had no name: they went with the process.
    assert_eq!(common::names_in(dir.path()), Vec::<String>::new());
    // A named file of a process that is gone (one killed between making and unlinking it)
    // is swept by the next disk tier in that directory; a live process's (pid 1, always
    // there) is not touched.
    let dead = format!("rmm-spill-{}-dev0-0-0.bin", child.id());
    std::fs::write(dir.path().join(&dead), b"x").unwrap();
    let live = "rmm-spill-1-dev0-0-0.bin".to_string();
    std::fs::write(dir.path().join(&live), b"x").unwrap();
    let rt = Runtime::start(&tiers("1GiB", "4MiB", Some(dir.path()))).unwrap();
    assert_eq!(
        common::names_in(dir.path()),
        vec![live],
        "swept at start-up, but for the live process's file"
    );
    rt.shutdown().unwrap();
}
