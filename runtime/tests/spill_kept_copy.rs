//! A stored value brought back to the device keeps its host copy: spilling it again frees
//! its device memory and copies nothing, every byte stays as it was, and the kept copies are
//! the first thing given back when the host tier needs room.

mod common;

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use common::foreign::{LibraryOwner, read_back};
use common::{pattern, serial, sim};
use rmm_allocator::StreamView;
use rmm_allocator::spill::Tier;
use rmm_runtime::{ForeignData, Runtime, SpillManager};

const MIB: usize = 1 << 20;
const S: StreamView = StreamView::DEFAULT;

type Value = Arc<ForeignData<LibraryOwner>>;

/// A runtime spilling over `limit` into a fixed host pool of `host`, and its manager.
fn start(limit: &str, host: &str) -> (Runtime, Arc<SpillManager>) {
    let rt = Runtime::start(&common::spilling(limit, host, None, &[])).unwrap();
    let m = rt.spill_manager(rt.devices()[0]).expect("spilling is on");
    (rt, m)
}

/// Three values of 3 MiB adopted by `m`, and their bytes.
fn three_values(m: &SpillManager, dropped: &Arc<AtomicUsize>) -> (Vec<Value>, Vec<Vec<u8>>) {
    adopted(m, 3, 3 * MIB, 40, dropped)
}

/// `n` values of `size` bytes (seeds from `seed`) adopted by `m`, and their bytes.
fn adopted(
    m: &SpillManager,
    n: u64,
    size: usize,
    seed: u64,
    dropped: &Arc<AtomicUsize>,
) -> (Vec<Value>, Vec<Vec<u8>>) {
    let data: Vec<Vec<u8>> = (0..n).map(|i| pattern(size, seed + i)).collect();
    let values = data
        .iter()
        .map(|d| {
            let o = LibraryOwner::holding(0, &[d], dropped);
            m.adopt(&[o.allocations[0]], S, o)
        })
        .collect();
    (values, data)
}

#[test]
fn a_value_brought_back_spills_again_without_a_copy_and_stays_intact() {
    let _s = serial();
    sim();
    let (_rt, m) = start("8MiB", "64MiB");
    let dropped = Arc::new(AtomicUsize::new(0));
    let (values, data) = three_values(&m, &dropped);
    // 9 MiB over 8: the first went to the host, copied.
    assert_eq!(values[0].tier(), Tier::Host);
    assert_eq!(m.statistics().spilled_bytes, 3 * MIB as u64);
    // Brought back (the second is copied off to make room), then read where it is: its
    // host copy, kept, holds the same bytes.
    assert_eq!(read_back(&values[0]), vec![data[0].clone()]);
    assert_eq!(
        values[0].spilled_bytes().unwrap(),
        Some(vec![data[0].clone()])
    );
    let s = m.statistics();
    assert_eq!(
        (s.spilled_bytes, s.spilled_without_copy_bytes),
        (6 * MIB as u64, 0)
    );
    assert_eq!(
        (s.host_bytes, s.host_kept_bytes),
        (3 * MIB as u64, 3 * MIB as u64),
        "the kept copy stays in the host tier, counted apart from spilled data"
    );
    // Everything off the device: the first value copies nothing, the last is copied.
    assert_eq!(m.spill_all().unwrap(), 6 * MIB as u64);
    let s = m.statistics();
    assert_eq!(
        (
            s.spilled_bytes,
            s.spilled_without_copy_bytes,
            s.spilled_without_copy_count
        ),
        (9 * MIB as u64, 3 * MIB as u64, 1),
        "{s:?}"
    );
    assert_eq!(
        (s.tracked_bytes, s.host_bytes, s.host_kept_bytes),
        (0, 9 * MIB as u64, 0)
    );
    // Round after round, only the first trip of each value copies it off the device.
    for _ in 0..3 {
        for (v, d) in values.iter().zip(&data) {
            assert_eq!(read_back(v), vec![d.clone()]);
        }
        m.spill_all().unwrap();
    }
    let s = m.statistics();
    assert_eq!(s.spilled_bytes, 9 * MIB as u64, "{s:?}");
    assert_eq!(
        s.spilled_without_copy_bytes,
        (3 + 3 * 9) * MIB as u64,
        "{s:?}"
    );
    assert_eq!(s.unspilled_bytes, (3 + 3 * 9) * MIB as u64, "{s:?}");
    drop(values);
    let s = m.statistics();
    assert_eq!(
        (s.tracked_bytes, s.host_bytes, s.host_kept_bytes),
        (0, 0, 0),
        "{s:?}"
    );
}

#[test]
fn kept_copies_are_given_back_first_when_the_host_tier_is_full() {
    let _s = serial();
    sim();
    // Room on the host for two values only, and no disk tier.
    let (_rt, m) = start("8MiB", "6MiB");
    let dropped = Arc::new(AtomicUsize::new(0));
    let (values, data) = three_values(&m, &dropped);
    assert_eq!(values[0].tier(), Tier::Host);
    // The first comes back keeping its copy; the second is copied off beside it.
    assert_eq!(read_back(&values[0]), vec![data[0].clone()]);
    let s = m.statistics();
    assert_eq!(
        (s.host_bytes, s.host_kept_bytes),
        (3 * MIB as u64, 3 * MIB as u64)
    );
    // The second comes back: the third must go, into a full host tier. The first value's
    // kept copy is given back for it (nothing goes to disk: there is none).
    assert_eq!(read_back(&values[1]), vec![data[1].clone()]);
    assert_eq!(values[2].tier(), Tier::Host);
    assert_eq!(
        values[2].spilled_bytes().unwrap(),
        Some(vec![data[2].clone()])
    );
    // The first value is copied again when it goes (its copy is gone), into the room the
    // second's kept copy leaves.
    assert_eq!(values[0].spill().unwrap(), 3 * MIB);
    let s = m.statistics();
    assert_eq!(
        (values[0].tier(), values[1].tier()),
        (Tier::Host, Tier::Device)
    );
    assert_eq!(s.spilled_bytes, 12 * MIB as u64, "{s:?}");
    assert_eq!(s.spilled_without_copy_bytes, 0, "{s:?}");
    assert_eq!(
        (s.host_bytes, s.host_kept_bytes),
        (6 * MIB as u64, 0),
        "{s:?}"
    );
    for (v, d) in values.iter().zip(&data) {
        assert_eq!(v.spilled_bytes().unwrap(), Some(vec![d.clone()]));
    }
    // With no room left on the host for the second, it stays where it is.
    assert!(values[1].spill().is_err());
    assert_eq!(read_back(&values[1]), vec![data[1].clone()]);
}

#[test]
fn a_growable_host_pool_gives_back_kept_copies_rather_than_pin_more() {
    let _s = serial();
    sim();
    // Host memory pinned as spills need it, nothing pinned ahead: what the pool holds is
    // what the spills asked for.
    let config = common::spilling(
        "100MiB",
        "none",
        None,
        &[("spill.pin_ahead", toml::Value::from("none"))],
    );
    let rt = Runtime::start(&config).unwrap();
    let m = rt.spill_manager(rt.devices()[0]).expect("spilling is on");
    let dropped = Arc::new(AtomicUsize::new(0));
    let data: Vec<Vec<u8>> = (0..3).map(|i| pattern(40 * MIB, 60 + i)).collect();
    let mut values: Vec<Value> = data
        .iter()
        .map(|d| {
            let o = LibraryOwner::holding(0, &[d], &dropped);
            m.adopt(&[o.allocations[0]], S, o)
        })
        .collect();
    // 120 MiB over a 100 MiB limit: the first went to the host, which pinned for it.
    assert_eq!(values[0].tier(), Tier::Host);
    // With the third gone, it comes back without pushing anything off, keeping its copy.
    values.pop();
    assert_eq!(read_back(&values[0]), vec![data[0].clone()]);
    let s = m.statistics();
    let pinned = s.host_pool_bytes;
    assert_eq!(s.host_kept_bytes, 40 * MIB as u64, "{s:?}");
    assert!(
        pinned - s.host_bytes - s.host_kept_bytes < 40 * MIB as u64,
        "no room for another value without the copy: {s:?}"
    );
    // The second goes to the host into the copy's memory, rather than have the pool pin
    // more; the first is copied again when it goes.
    assert_eq!(values[1].spill().unwrap(), 40 * MIB);
    let s = m.statistics();
    assert_eq!(s.host_pool_bytes, pinned, "{s:?}");
    assert_eq!(
        (s.host_bytes, s.host_kept_bytes),
        (40 * MIB as u64, 0),
        "{s:?}"
    );
    for (v, d) in values.iter().zip(&data) {
        assert_eq!(read_back(v), vec![d.clone()]);
    }
}

#[test]
fn a_value_spilled_to_pageable_memory_keeps_no_copy_when_it_comes_back() {
    let _s = serial();
    sim();
    // Pinned as needed and ahead of demand: the first spill finds nothing pinned and goes to
    // pageable memory rather than wait.
    let (_rt, m) = start("16MiB", "none");
    let dropped = Arc::new(AtomicUsize::new(0));
    let (values, data) = adopted(&m, 2, 12 * MIB, 70, &dropped);
    assert_eq!(values[0].tier(), Tier::Host);
    let s = m.statistics();
    assert_eq!(s.host_pageable_bytes, 12 * MIB as u64, "{s:?}");
    // Back on the device, intact; its pageable copy went back rather than being kept.
    assert!(read_back(&values[0]) == vec![data[0].clone()]);
    assert_eq!(values[0].tier(), Tier::Device);
    // (From pinned memory the copy is kept: the first test.)
    let s = m.statistics();
    assert_eq!(s.host_kept_bytes, 0, "{s:?}");
    assert!(read_back(&values[1]) == vec![data[1].clone()]);
    drop(values);
    let s = m.statistics();
    assert_eq!((s.host_bytes, s.host_pageable_bytes), (0, 0), "{s:?}");
}
