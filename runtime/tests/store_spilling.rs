//! A device store (a Dask worker's data) relies on its device's spilling: a reinitialize that
//! would turn it off keeps it and says so; one that would take the device away is refused.

mod common;

use common::{config, devices, pattern, serial};
use rmm_runtime::{Error, Runtime};

const MIB: usize = 1 << 20;

fn spilling() -> rmm_config::Config {
    config(&[
        ("devices", toml::Value::from(devices(2))),
        ("spill.enabled", toml::Value::from(true)),
        ("spill.device_memory_limit", toml::Value::from("256MiB")),
    ])
}

#[test]
fn turning_spilling_off_under_a_device_store_keeps_it_and_says_so() {
    let _s = serial();
    let rt = Runtime::start(&spilling()).unwrap();
    // What a Dask worker's DeviceStore does with its device_memory_limit.
    let m = rt.spill_manager(0).unwrap();
    m.fix_limit(8 * MIB as u64).unwrap();
    let report = rt
        .reconfigure(|running| running.set("spill.enabled", false))
        .unwrap();
    let note = report
        .notes
        .iter()
        .find(|n| n.starts_with("spilling stays on on device 0: a device store spills there"))
        .unwrap_or_else(|| panic!("no note: {:?}", report.notes));
    assert!(note.contains("set_device_memory_limit"), "{note}");
    // Device 0 still spills, under the store's limit; device 1 (no store) does not.
    let resolved = rt.config();
    assert!(resolved.devices[0].spill.is_some());
    if resolved.devices.len() > 1 {
        assert!(resolved.devices[1].spill.is_none());
    }
    let m = rt.spill_manager(0).unwrap();
    let values: Vec<_> = (0..4)
        .map(|i| {
            m.from_host(&pattern(4 * MIB, i), rmm_allocator::StreamView::DEFAULT)
                .unwrap()
        })
        .collect();
    let s = m.statistics();
    assert!(
        s.tracked_bytes <= 8 * MIB as u64 && s.spilled_bytes > 0,
        "{s:?}"
    );
    for (i, v) in values.iter().enumerate() {
        assert!(v.to_vec().unwrap() == pattern(4 * MIB, i as u64));
    }
    // A whole new configuration without spilling keeps it too.
    let report = rt
        .reinitialize(&config(&[("devices", toml::Value::from(devices(2)))]))
        .unwrap();
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.starts_with("spilling stays on on device 0")),
        "{:?}",
        report.notes
    );
    assert!(rt.config().devices[0].spill.is_some());
}

#[test]
fn taking_a_device_store_s_device_away_is_refused_and_changes_nothing() {
    let _s = serial();
    if common::device_count() < 2 {
        common::skip(
            "taking_a_device_store_s_device_away_is_refused_and_changes_nothing",
            "needs two devices",
        );
        return;
    }
    let rt = Runtime::start(&spilling()).unwrap();
    rt.spill_manager(0)
        .unwrap()
        .fix_limit(8 * MIB as u64)
        .unwrap();
    let e = rt
        .reinitialize(&config(&[
            ("devices", toml::Value::from(vec![1i64])),
            ("spill.enabled", toml::Value::from(true)),
        ]))
        .unwrap_err();
    assert!(matches!(e, Error::StoreDeviceLeaves { device: 0 }), "{e}");
    assert!(e.to_string().contains("keep device 0 in `devices`"), "{e}");
    assert_eq!(rt.devices(), vec![0, 1]);
    assert!(rt.config().devices[0].spill.is_some());
}
