//! Pinned host memory is taken for need, within a bound, and given back: nothing is pinned
//! before something must spill; pinning ahead stays within `spill.pin_ahead`; shutdown and a
//! reinitialize that turns spilling off give back all but what spilled data holds, and that
//! as the data goes; a host pool larger than the host the process may use is refused.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{config, devices, pattern, serial, sim, skip};
use rmm_allocator::spill::SpillableBuffer;
use rmm_runtime::{Runtime, SpillManager};

const MIB: usize = 1 << 20;

/// One device, a pool, spilling under `limit` with a host pool pinned as needed, and `more`.
fn spilling(limit: &str, more: &[(&str, toml::Value)]) -> rmm_config::Config {
    let mut settings = vec![
        ("devices", toml::Value::from(devices(1))),
        ("pool.enabled", toml::Value::from(true)),
        ("pool.initial_size", toml::Value::from("256MiB")),
        ("spill.enabled", toml::Value::from(true)),
        ("spill.device_memory_limit", toml::Value::from(limit)),
    ];
    settings.extend(more.iter().cloned());
    config(&settings)
}

/// Pinned bytes of `m`'s host pool.
fn pinned(m: &SpillManager) -> usize {
    m.store().host().capacity()
}

/// Waits until `m`'s host pool pins nothing in the background.
fn settled(m: &SpillManager) {
    let start = Instant::now();
    while m.store().host().is_pinning_ahead() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "still pinning ahead after 30 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `n` spillable buffers of `size` bytes, made on a worker.
fn fill(rt: &Runtime, n: u64, size: usize) -> Vec<Arc<SpillableBuffer>> {
    rt.submit(move |ctx| {
        let m = ctx.spill_manager().expect("spilling is on");
        (0..n)
            .map(|i| m.from_host(&pattern(size, i), ctx.stream()).unwrap())
            .collect::<Vec<_>>()
    })
    .wait()
    .unwrap()
}

#[test]
fn nothing_is_pinned_before_something_must_spill() {
    let _s = serial();
    let rt = Runtime::start(&spilling("16MiB", &[])).unwrap();
    let m = rt.spill_manager(0).unwrap();
    // Under the limit: nothing spills, so nothing is pinned, now or later.
    let kept = fill(&rt, 3, 4 * MIB);
    std::thread::sleep(Duration::from_millis(300));
    settled(&m);
    assert_eq!(pinned(&m), 0, "pinned with nothing to spill");
    if let Some(sim) = sim() {
        assert_eq!(sim.pinned_host_bytes(), 0);
    }
    // The first spill pins what it needs, and pinning ahead starts from then on.
    let more = fill(&rt, 2, 4 * MIB);
    settled(&m);
    let s = m.statistics();
    assert!(s.spilled_bytes > 0, "{s:?}");
    assert!(pinned(&m) >= s.host_bytes as usize && pinned(&m) > 0);
    drop((kept, more));
}

#[test]
fn pinning_ahead_stays_within_spill_pin_ahead() {
    let _s = serial();
    let ahead = 40 * MIB;
    let rt = Runtime::start(&spilling(
        "64MiB",
        &[("spill.pin_ahead", toml::Value::from("40MiB"))],
    ))
    .unwrap();
    let m = rt.spill_manager(0).unwrap();
    let values = fill(&rt, 24, 4 * MIB);
    settled(&m);
    let host = m.store().host();
    let free = host.capacity() - host.used();
    assert!(host.used() > 0, "something spilled");
    assert!(free >= ahead, "{free} free, {ahead} asked to be kept free");
    // Pinning ahead goes in steps of at least 32 MiB: at most one step past the headroom.
    assert!(
        free < ahead + 32 * MIB,
        "{free} bytes free and pinned, spill.pin_ahead = {ahead}"
    );
    drop(values);
}

#[test]
fn spill_pin_ahead_none_pins_only_what_spills_take() {
    let _s = serial();
    let rt = Runtime::start(&spilling(
        "16MiB",
        &[("spill.pin_ahead", toml::Value::from("none"))],
    ))
    .unwrap();
    let m = rt.spill_manager(0).unwrap();
    let values = fill(&rt, 8, 4 * MIB);
    std::thread::sleep(Duration::from_millis(200));
    settled(&m);
    assert!(!m.store().host().is_pinning_ahead());
    assert_eq!(m.store().host().headroom(), 0);
    drop(values);
}

/// Pinned bytes that the spilled values among `values` hold, whole chunks counted.
fn held_by(m: &SpillManager, values: &[Arc<SpillableBuffer>]) -> (usize, usize) {
    let spilled: usize = values
        .iter()
        .filter(|b| b.tier() == rmm_allocator::spill::Tier::Host)
        .map(|b| b.size())
        .sum();
    (spilled, pinned(m))
}

#[test]
fn shutdown_gives_pinned_memory_back_but_what_spilled_data_holds() {
    let _s = serial();
    // Pinned as spills go (without pinning ahead, spills pin rather than go pageable), so
    // several chunks are pinned.
    let no_ahead = [("spill.pin_ahead", toml::Value::from("none"))];
    let rt = Runtime::start(&spilling("16MiB", &no_ahead)).unwrap();
    let m = rt.spill_manager(0).unwrap();
    let mut values = fill(&rt, 20, 4 * MIB);
    settled(&m);
    let before = pinned(&m);
    assert!(before > 32 * MIB, "{before} pinned");
    // Keep one small value; drop the rest, then shut down (which spills what is left).
    let small = fill(&rt, 1, 4096).pop().unwrap();
    values.clear();
    rt.shutdown().unwrap();
    // A step being pinned ahead when spilling stood down ends, and goes back.
    settled(&m);
    let (spilled, pinned_now) = held_by(&m, std::slice::from_ref(&small));
    assert_eq!(spilled, 4096, "the value left is spilled at shutdown");
    assert!(
        pinned_now < before && pinned_now <= 256 * MIB,
        "{pinned_now} pinned for 4 KiB of spilled data (was {before})"
    );
    // The value keeps its bytes, and once it goes nothing stays pinned.
    assert!(small.to_vec().unwrap() == pattern(4096, 0));
    drop(small);
    assert_eq!(
        pinned(&m),
        0,
        "pinned memory left after the last spilled value went"
    );
    if let Some(sim) = sim() {
        assert_eq!(sim.pinned_host_bytes(), 0);
    }
}

#[test]
fn a_reinitialize_that_turns_spilling_off_gives_pinned_memory_back() {
    let _s = serial();
    let rt = Runtime::start(&spilling("16MiB", &[])).unwrap();
    let m = rt.spill_manager(0).unwrap();
    let values = fill(&rt, 10, 4 * MIB);
    settled(&m);
    assert!(pinned(&m) > 0);
    let spilled: Vec<Arc<SpillableBuffer>> = values
        .iter()
        .filter(|b| b.tier() == rmm_allocator::spill::Tier::Host)
        .cloned()
        .collect();
    assert!(!spilled.is_empty());
    drop(values);
    rt.reconfigure(|running| running.set("spill.enabled", false))
        .unwrap();
    // What is left pinned is what the spilled values hold (whole chunks).
    let held: usize = spilled.iter().map(|b| b.size()).sum();
    let now = pinned(&m);
    assert!(now >= held, "{now} pinned for {held} spilled");
    drop(spilled);
    assert_eq!(
        pinned(&m),
        0,
        "pinned memory left after the spilled values went"
    );
    // Spilling on again: the pool pins again for need.
    rt.reconfigure(|running| running.set("spill.enabled", true))
        .unwrap();
    let again = fill(&rt, 6, 4 * MIB);
    let m = rt.spill_manager(0).unwrap();
    assert!(m.statistics().spilled_bytes > 0);
    for (i, b) in again.iter().enumerate() {
        assert!(b.to_vec().unwrap() == pattern(4 * MIB, i as u64));
    }
}

#[test]
fn a_host_pool_larger_than_the_host_the_process_may_use_is_refused_cleanly() {
    let _s = serial();
    let Some(sim) = sim() else {
        skip(
            "a_host_pool_larger_than_the_host_the_process_may_use_is_refused_cleanly",
            "the host's memory is made smaller on the simulated device only (RMM_BACKEND=cuda)",
        );
        return;
    };
    // As in a 3 GiB cgroup: a 4 GiB pool would get the process killed while faulting in.
    sim.limit_host_memory(Some(3 << 30));
    let result = Runtime::start(&spilling(
        "64MiB",
        &[("spill.host_pool_size", toml::Value::from("4GiB"))],
    ));
    sim.limit_host_memory(None);
    let e = result.unwrap_err().to_string();
    assert!(
        e.contains("spill.host_pool_size = 4GiB (code) is larger than the 3GiB of host memory this process may use"),
        "{e}"
    );
    // Below the limit at start, but more than is left when pinning: refused where it pins.
    sim.limit_host_memory(Some(3 << 30));
    let region =
        rmm_allocator::resource::PinnedHostPool::on(common::backend(), (3 << 30) + (64 << 20));
    sim.limit_host_memory(None);
    let e = region.unwrap_err().to_string();
    assert!(
        e.contains("would take more than this process may use"),
        "{e}"
    );
    assert_eq!(sim.pinned_host_bytes(), 0, "nothing left pinned");
}

#[test]
fn spills_that_find_nothing_pinned_go_to_pageable_memory_and_come_back_intact() {
    let _s = serial();
    // Pinning ahead (the default): nothing is pinned before the first spill, which does not
    // wait for pinning.
    let rt = Runtime::start(&spilling("16MiB", &[])).unwrap();
    let m = rt.spill_manager(0).unwrap();
    let values = fill(&rt, 12, 16 * MIB);
    settled(&m);
    let s = m.statistics();
    assert!(s.host_pageable_total_bytes >= 16 * MIB as u64, "{s:?}");
    assert!(s.host_bytes >= 32 * MIB as u64, "{s:?}");
    // The pageable memory is not pinned: what is pinned is the pool's.
    if let Some(sim) = sim() {
        assert_eq!(sim.pinned_host_bytes(), pinned(&m));
    }
    for (i, v) in values.iter().enumerate() {
        assert!(
            v.to_vec().unwrap() == pattern(16 * MIB, i as u64),
            "value {i}"
        );
    }
    drop(values);
    let s = m.statistics();
    assert_eq!((s.host_bytes, s.host_pageable_bytes), (0, 0), "{s:?}");
}
