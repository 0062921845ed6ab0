//! The simulated device's fault injection from the environment (`RMM_SIM_FAIL_*`,
//! `RMM_SIM_HOST_MEMORY`): each variable puts its fault in force, and a bad value is refused
//! with the variable, the value and the form expected. The variables are given to
//! [`SimFaults::from_vars`], never set in the process environment.

use rmm_allocator::Error;
use rmm_allocator::backend::{Backend, SimBackend, SimConfig, SimFaults, SimMemoryMode};
use rmm_allocator::resource::PinnedHostPool;

const MIB: usize = 1 << 20;

fn sim(devices: u32) -> SimBackend {
    SimBackend::new(SimConfig {
        devices,
        capacity: 64 * MIB,
        mode: SimMemoryMode::Unbacked,
    })
    .unwrap()
}

/// A backend of `devices` devices with the faults `vars` ask for in force.
fn sim_with(devices: u32, vars: &[(&str, &str)]) -> SimBackend {
    let sim = sim(devices);
    SimFaults::from_vars(vars.iter().copied(), devices)
        .unwrap()
        .apply(&sim)
        .unwrap();
    sim
}

/// Which of `n` allocations of `bytes` on `dev` fail (1-based), freeing the others.
fn failing_allocations(b: &SimBackend, dev: u32, n: u64, bytes: usize) -> Vec<u64> {
    let mut failed = Vec::new();
    for i in 1..=n {
        match b.malloc(dev, bytes) {
            Ok(p) => b.free(dev, p).unwrap(),
            Err(e) => {
                assert!(e.is_driver_out_of_memory(), "{e}");
                failed.push(i);
            }
        }
    }
    failed
}

/// Which of `n` memsets on `dev` fail (1-based).
fn failing_copies(b: &SimBackend, dev: u32, n: u64) -> Vec<u64> {
    let p = b.malloc(dev, 4096).unwrap();
    let failed = (1..=n)
        .filter(|_| match b.memset(dev, p, 1, 4096) {
            Ok(()) => false,
            Err(e) => {
                assert!(
                    matches!(e, Error::InjectedFault { what: "copy", .. }),
                    "{e}"
                );
                true
            }
        })
        .collect();
    b.free(dev, p).unwrap();
    failed
}

/// Which of `n` spill-file writes on `dev` fail (1-based).
fn failing_file_writes(b: &SimBackend, dev: u32, n: u64) -> Vec<u64> {
    (1..=n)
        .filter(|_| match b.before_file_write(dev) {
            Ok(()) => false,
            Err(e) => {
                assert!(
                    matches!(
                        e,
                        Error::InjectedFault {
                            what: "spill file write",
                            ..
                        }
                    ),
                    "{e}"
                );
                true
            }
        })
        .collect()
}

#[test]
fn fail_allocation_fails_the_nth_allocation_of_device_0_or_of_the_device_named() {
    let b = sim_with(2, &[("RMM_SIM_FAIL_ALLOCATION", "3")]);
    assert_eq!(failing_allocations(&b, 0, 6, 4096), vec![3]);
    assert_eq!(failing_allocations(&b, 1, 6, 4096), Vec::<u64>::new());
    let b = sim_with(2, &[("RMM_SIM_FAIL_ALLOCATION", " 1:2 , 0:4 ")]);
    assert_eq!(failing_allocations(&b, 0, 6, 4096), vec![4]);
    assert_eq!(failing_allocations(&b, 1, 6, 4096), vec![2]);
    // 0 injects nothing.
    let b = sim_with(2, &[("RMM_SIM_FAIL_ALLOCATION", "0")]);
    assert_eq!(failing_allocations(&b, 0, 6, 4096), Vec::<u64>::new());
}

#[test]
fn fail_allocations_above_fails_every_larger_allocation_on_its_device() {
    let b = sim_with(2, &[("RMM_SIM_FAIL_ALLOCATIONS_ABOVE", "1:1MiB")]);
    assert_eq!(failing_allocations(&b, 0, 2, 2 * MIB), Vec::<u64>::new());
    assert_eq!(failing_allocations(&b, 1, 2, MIB), Vec::<u64>::new());
    assert_eq!(failing_allocations(&b, 1, 2, MIB + 1), vec![1, 2]);
    let b = sim_with(1, &[("RMM_SIM_FAIL_ALLOCATIONS_ABOVE", "4096")]);
    assert_eq!(failing_allocations(&b, 0, 1, 4097), vec![1]);
}

#[test]
fn fail_copy_fails_the_nth_copy() {
    let b = sim_with(2, &[("RMM_SIM_FAIL_COPY", "1:2")]);
    assert_eq!(failing_copies(&b, 0, 4), Vec::<u64>::new());
    assert_eq!(failing_copies(&b, 1, 4), vec![2]);
    let b = sim_with(1, &[("RMM_SIM_FAIL_COPY", "4")]);
    assert_eq!(failing_copies(&b, 0, 6), vec![4]);
}

#[test]
fn fail_pin_fails_the_nth_pin_on_any_device() {
    let b: &'static SimBackend = Box::leak(Box::new(sim_with(2, &[("RMM_SIM_FAIL_PIN", "2")])));
    let first = PinnedHostPool::on(b, MIB).unwrap();
    let e = PinnedHostPool::on(b, MIB).unwrap_err();
    assert!(
        e.to_string().contains("injected failure of this pin"),
        "{e}"
    );
    let third = PinnedHostPool::on(b, MIB).unwrap();
    assert_eq!(b.counts(1).unwrap().pins, 3);
    drop((first, third));
}

#[test]
fn fail_file_write_fails_the_nth_write_to_a_spill_file_of_the_device() {
    let b = sim_with(3, &[("RMM_SIM_FAIL_FILE_WRITE", "2:1,0:3")]);
    assert_eq!(failing_file_writes(&b, 0, 5), vec![3]);
    assert_eq!(failing_file_writes(&b, 1, 5), Vec::<u64>::new());
    assert_eq!(failing_file_writes(&b, 2, 5), vec![1]);
}

#[test]
fn host_memory_is_what_the_simulated_host_reports() {
    let b = sim_with(1, &[("RMM_SIM_HOST_MEMORY", "256MiB")]);
    let host = b.host_memory();
    assert_eq!(host.physical, 256 << 20);
    assert_eq!(host.available_now, 256 << 20);
    let b = sim_with(1, &[("RMM_SIM_HOST_MEMORY", "1GB")]);
    assert_eq!(b.host_memory().physical, 1_000_000_000);
}

#[test]
fn the_parsed_faults_say_what_each_variable_asked_for() {
    let vars = [
        ("RMM_SIM_FAIL_ALLOCATION", "5"),
        ("RMM_SIM_FAIL_ALLOCATIONS_ABOVE", "0:1MiB,1:2MiB"),
        ("RMM_SIM_FAIL_COPY", "1:7"),
        ("RMM_SIM_FAIL_PIN", "4"),
        ("RMM_SIM_FAIL_FILE_WRITE", "0:2"),
        ("RMM_SIM_HOST_MEMORY", "8GiB"),
        // Other variables are not these.
        ("RMM_SIM_MEMORY", "2GiB"),
        ("RMM_POOL_ENABLED", "nonsense"),
        ("PATH", "/bin"),
    ];
    let f = SimFaults::from_vars(vars, 2).unwrap();
    assert_eq!(
        f,
        SimFaults {
            allocation: vec![(0, 5)],
            allocations_above: vec![(0, MIB), (1, 2 * MIB)],
            copy: vec![(1, 7)],
            pin: Some(4),
            file_write: vec![(0, 2)],
            host_memory: Some(8 << 30),
        }
    );
    assert!(!f.is_empty());
    let none = SimFaults::from_vars([("RMM_SIM_DEVICES", "2")], 2).unwrap();
    assert!(none.is_empty());
}

/// `from_vars` refuses `name=value` on a backend of 2 devices; the message names both, the
/// form expected, and `why`.
fn refused(name: &str, value: &str, why: &str) {
    let e = SimFaults::from_vars([(name, value)], 2).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    let text = e.to_string();
    assert!(text.contains(name), "{name}={value}: {text}");
    assert!(text.contains(value.trim()), "{name}={value}: {text}");
    assert!(text.contains("expected"), "{name}={value}: {text}");
    assert!(text.contains(why), "{name}={value}: {text}");
}

#[test]
fn bad_values_are_refused_naming_the_variable_the_value_and_the_form() {
    for name in [
        "RMM_SIM_FAIL_ALLOCATION",
        "RMM_SIM_FAIL_COPY",
        "RMM_SIM_FAIL_FILE_WRITE",
    ] {
        refused(name, "three", "e.g. 3 or 0:3,1:5");
        refused(name, "", "e.g. 3 or 0:3,1:5");
        refused(name, "-1", "does not parse");
        refused(name, "1.5", "does not parse");
        refused(name, "99999999999999999999", "does not parse");
        refused(
            name,
            "2:3",
            "device 2 is not one of the 2 simulated devices",
        );
        refused(name, "x:3", "is not a device number");
        refused(name, "1:3,1:4", "device 1 is named twice");
        refused(name, "3,0:4", "device 0 is named twice");
        refused(name, "0:3,", "does not parse");
    }
    refused("RMM_SIM_FAIL_ALLOCATIONS_ABOVE", "lots", "e.g. 64MiB");
    refused("RMM_SIM_FAIL_ALLOCATIONS_ABOVE", "0", "does not parse");
    refused(
        "RMM_SIM_FAIL_ALLOCATIONS_ABOVE",
        "5:1MiB",
        "device 5 is not one",
    );
    refused("RMM_SIM_FAIL_PIN", "0:3", "no DEVICE: part");
    refused(
        "RMM_SIM_FAIL_PIN",
        "often",
        "the N-th pin of host memory fails",
    );
    refused("RMM_SIM_HOST_MEMORY", "0", "a positive size");
    refused("RMM_SIM_HOST_MEMORY", "8 parsecs", "a positive size");
}

#[test]
fn a_misspelt_fault_variable_is_refused_not_ignored() {
    let e = SimFaults::from_vars([("RMM_SIM_FAIL_ALLOC", "3")], 1).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("RMM_SIM_FAIL_ALLOC=3"), "{text}");
    assert!(text.contains("RMM_SIM_FAIL_ALLOCATION,"), "{text}");
    assert!(text.contains("check its spelling"), "{text}");
}

#[test]
fn a_huge_count_injects_nothing_reachable_and_does_not_overflow() {
    let b = sim_with(1, &[("RMM_SIM_FAIL_ALLOCATION", &u64::MAX.to_string())]);
    assert_eq!(failing_allocations(&b, 0, 3, 4096), Vec::<u64>::new());
    // From the Rust API too, after some operations were counted.
    b.fail_nth_copy(0, u64::MAX).unwrap();
    b.fail_nth_file_write(0, u64::MAX).unwrap();
    b.fail_nth_pin(u64::MAX);
    b.fail_nth_allocation(0, u64::MAX).unwrap();
    assert_eq!(failing_allocations(&b, 0, 3, 4096), Vec::<u64>::new());
}

#[test]
fn faults_for_a_device_the_backend_lacks_are_refused_when_applied() {
    let f = SimFaults {
        copy: vec![(3, 1)],
        ..SimFaults::default()
    };
    assert!(matches!(
        f.apply(&sim(2)),
        Err(Error::NoSuchDevice { requested: 3, .. })
    ));
}
