//! Fault injection on the simulated device (issue 22) for adopted values
//! (`SpillManager::adopt`, `adopt_in_background`, `make_room_in_background`): every step of
//! their spilling, run once to count the device allocations, copies, host pins and spill
//! file writes it makes, then with the N-th operation of each kind failing, for N = 1, 2, …
//! until a run in which no fault struck. After each run:
//!
//! * every value's bytes are intact wherever they are (in the owner's memory, on the host, on
//!   disk, or back on the device);
//! * an owner (the library value) was dropped exactly when its value was spilled, never
//!   while its data was only on the device, and never twice;
//! * the figures agree with where the data is: tracked bytes and count with what is on the
//!   device, host and disk bytes with what is off it, disk bytes with the files in the
//!   directory, and the moves in and out of each tier with what it holds;
//! * the manager keeps working (a new value is adopted, spilled and read back), and once
//!   everything is dropped no device allocation, pinned host memory or spill file is left.
//!
//! The device's stack is plain (no pool), so that bringing data back allocates from the
//! simulated device and an allocation can fail. The simulated device cannot fail a read of a
//! spill file; reading data back from disk is swept for its copies and the allocations.
//!
//! Only on the simulated device (the GPU cannot fail on request): on CUDA each test says it
//! skips.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::faults::{FAULTS, Fault, sim_or_skip};
use common::foreign::LibraryOwner;
use common::{pattern, serial, spilling};
use rmm_allocator::backend::DevicePtr;
use rmm_allocator::backend::SimBackend;
use rmm_allocator::spill::Tier;
use rmm_allocator::{Device, StreamView};
use rmm_config::Config;
use rmm_runtime::{ForeignData, OwnerAccess, Runtime, SpillManager};

const MIB: usize = 1 << 20;
const S: StreamView = StreamView::DEFAULT;
const DEVICE: u32 = 0;

/// A library value not adopted yet: its owner and the bytes of each of its allocations.
struct Made {
    owner: LibraryOwner,
    data: Vec<Vec<u8>>,
}

/// `pattern(size, seed)`, made once (making them is much of a scene's time).
fn contents(size: usize, seed: u64) -> Vec<u8> {
    type Made = HashMap<(usize, u64), Arc<Vec<u8>>>;
    static MADE: std::sync::Mutex<Option<Made>> = std::sync::Mutex::new(None);
    let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    let bytes = made
        .get_or_insert_with(HashMap::new)
        .entry((size, seed))
        .or_insert_with(|| Arc::new(pattern(size, seed)));
    bytes.to_vec()
}

/// A library value of allocations of `sizes`, each holding its own pattern.
fn library_value(sizes: &[usize], seed: u64) -> Made {
    let data: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| contents(size, seed * 16 + i as u64))
        .collect();
    let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let owner = LibraryOwner::holding(DEVICE, &slices, &Arc::default());
    Made { owner, data }
}

/// An adopted value and what it must hold.
struct Value {
    name: &'static str,
    v: Arc<ForeignData<LibraryOwner>>,
    data: Vec<Vec<u8>>,
    in_use: Arc<AtomicBool>,
    dropped: Arc<AtomicUsize>,
}

/// The bytes of `allocations` of device memory.
fn read_device(allocations: &[(DevicePtr, usize)]) -> Vec<Vec<u8>> {
    let device = Device::new(DEVICE).unwrap();
    rmm_allocator::synchronize_stream(device, S).unwrap();
    allocations
        .iter()
        .map(|&(ptr, size)| {
            let mut out = vec![0u8; size];
            device.copy_to_host(&mut out, ptr).unwrap();
            out
        })
        .collect()
}

/// A value's bytes read on the device: in its owner's memory, or through device views
/// (bringing spilled data back).
fn read_through_device(v: &ForeignData<LibraryOwner>) -> rmm_allocator::Result<Vec<Vec<u8>>> {
    if let OwnerAccess::Device(bytes) = v.owner(|o| read_device(&o.allocations)) {
        return Ok(bytes);
    }
    let views = v.device_views(S)?.expect("a spilled value");
    let allocations: Vec<(DevicePtr, usize)> = views.iter().map(|g| (g.ptr(), g.len())).collect();
    Ok(read_device(&allocations))
}

/// Where the scene's data is to begin with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Limit 8 MiB, a fixed 16 MiB host pool, no disk: A [1, 1 MiB] and B [3 MiB] on the
    /// host, C [3 MiB] and D [1.5, 1.5 MiB] on the device, at the limit less 2 MiB.
    Host,
    /// Limit 12.5 MiB, a fixed 4 MiB host pool and a disk tier: A on disk, B on the host, C,
    /// D and E [6 MiB, more than the host pool] on the device, 12 MiB (the half MiB over it
    /// is more than the slack enforcing the limit spills beyond the excess, so that exactly
    /// A and B go).
    Disk,
    /// Limit 16 MiB, a host pool that pins as needed (the 32 MiB it pinned ahead of demand
    /// at start, and no more ahead from then on, so that every pin is a spill's), no disk:
    /// A and B on the host, C [30 MiB, more than is left pinned] on the device, over the
    /// limit.
    Growable,
}

const A: &[usize] = &[MIB, MIB];
const B: &[usize] = &[3 * MIB];
const C: &[usize] = &[3 * MIB];
const BIG_C: &[usize] = &[30 * MIB];
const D: &[usize] = &[3 * MIB / 2, 3 * MIB / 2];
const E: &[usize] = &[6 * MIB];
/// The spare value a step may adopt.
const N: &[usize] = &[3 * MIB];

impl Layout {
    fn config(self, dir: &Path) -> Config {
        let plain = [("pool.enabled", toml::Value::from(false))];
        match self {
            Layout::Host => spilling("8MiB", "16MiB", None, &plain),
            Layout::Disk => spilling("12.5MiB", "4MiB", Some(dir), &plain),
            Layout::Growable => spilling("16MiB", "none", None, &plain),
        }
    }
}

/// A runtime with adopted values in every tier the layout has, and a spare library value.
struct Scene {
    rt: Runtime,
    m: Arc<SpillManager>,
    values: Vec<Value>,
    spare: Option<Made>,
    dir: tempfile::TempDir,
}

impl Scene {
    fn new(layout: Layout) -> Scene {
        let dir = tempfile::tempdir().unwrap();
        let rt = Runtime::start(&layout.config(dir.path())).unwrap();
        let m = rt.spill_manager(DEVICE).unwrap();
        let mut s = Scene {
            rt,
            m,
            values: Vec::new(),
            spare: None,
            dir,
        };
        let expected = match layout {
            Layout::Host => {
                for (name, sizes, seed) in [("A", A, 1), ("B", B, 2), ("C", C, 3), ("D", D, 4)] {
                    s.adopt(name, library_value(sizes, seed), false);
                }
                vec![Tier::Host, Tier::Host, Tier::Device, Tier::Device]
            }
            Layout::Disk => {
                for (name, sizes, seed) in [
                    ("A", A, 1),
                    ("B", B, 2),
                    ("C", C, 3),
                    ("D", D, 4),
                    ("E", E, 5),
                ] {
                    s.adopt(name, library_value(sizes, seed), false);
                }
                vec![
                    Tier::Disk,
                    Tier::Host,
                    Tier::Device,
                    Tier::Device,
                    Tier::Device,
                ]
            }
            Layout::Growable => {
                // Nothing is pinned before something spills; nor ahead of demand after.
                s.quiet();
                let host = s.m.store().host();
                assert_eq!(host.capacity(), 0, "pinned before anything spilled");
                host.keep_free(0);
                s.adopt("A", library_value(A, 1), false);
                s.adopt("B", library_value(B, 2), false);
                // In use while it is adopted (A and B go instead), idle from then on.
                let c = library_value(BIG_C, 3);
                c.owner.in_use.store(true, Ordering::SeqCst);
                s.adopt("C", c, false);
                s.value("C").in_use.store(false, Ordering::SeqCst);
                vec![Tier::Host, Tier::Host, Tier::Device]
            }
        };
        let tiers: Vec<Tier> = s.values.iter().map(|v| v.v.tier()).collect();
        assert_eq!(tiers, expected, "{layout:?}: the scene's layout");
        s.spare = Some(library_value(N, 9));
        s.quiet();
        s.check(&format!("{layout:?} scene"));
        s
    }

    /// Adopts `made` as `name` (on the manager's background thread with `background`).
    fn adopt(&mut self, name: &'static str, made: Made, background: bool) {
        let Made { owner, data } = made;
        let in_use = Arc::clone(&owner.in_use);
        let dropped = Arc::clone(&owner.dropped);
        let allocations = owner.allocations.clone();
        let v = if background {
            self.m.adopt_in_background(&allocations, S, owner)
        } else {
            self.m.adopt(&allocations, S, owner)
        };
        self.values.push(Value {
            name,
            v,
            data,
            in_use,
            dropped,
        });
    }

    /// Adopts the spare value as "N".
    fn adopt_spare(&mut self, background: bool) {
        let made = self.spare.take().expect("the spare value");
        self.adopt("N", made, background);
    }

    fn value(&self, name: &str) -> &Value {
        self.values
            .iter()
            .find(|v| v.name == name)
            .unwrap_or_else(|| panic!("no value {name}"))
    }

    /// Waits until nothing moves behind the test's back: the background spills asked for and
    /// host memory pinned ahead of demand.
    fn quiet(&self) {
        self.m.settle();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.m.store().host().is_pinning_ahead() {
            assert!(Instant::now() < deadline, "pinning ahead never ends");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Every value's bytes are where they should be, owners were dropped exactly for the
    /// values spilled, and the figures agree with where the data is.
    fn check(&self, what: &str) {
        // Device bytes by address (an allocation counted once), entries on and off it.
        let mut on_device: HashMap<u64, usize> = HashMap::new();
        let (mut device_count, mut off_count, mut off_bytes) = (0u64, 0u64, 0u64);
        for val in &self.values {
            let name = val.name;
            let dropped = val.dropped.load(Ordering::SeqCst);
            let spilled = val.v.is_spilled();
            assert!(
                dropped <= 1,
                "{what}: value {name}'s owner dropped {dropped} times"
            );
            assert_eq!(
                dropped == 1,
                spilled,
                "{what}: value {name}: owner dropped {dropped} times, spilled: {spilled}"
            );
            if spilled {
                let bytes = val.v.spilled_bytes().unwrap_or_else(|e| {
                    panic!("{what}: value {name}'s spilled data cannot be read: {e}")
                });
                assert!(
                    bytes.as_ref() == Some(&val.data),
                    "{what}: value {name} ({}) lost its data",
                    val.v.tier()
                );
                let sizes = val.v.allocations().iter().map(|a| a.1);
                for (at, size) in val.v.device_allocations().into_iter().zip(sizes) {
                    match at {
                        Some((ptr, size)) => {
                            on_device.insert(ptr.addr(), size);
                            device_count += 1;
                        }
                        None => {
                            off_bytes += size as u64;
                            off_count += 1;
                        }
                    }
                }
            } else {
                let bytes = val.v.owner(|o| read_device(&o.allocations));
                assert!(
                    matches!(&bytes, OwnerAccess::Device(b) if *b == val.data),
                    "{what}: value {name} lost its data in its owner's memory"
                );
                on_device.extend(val.v.allocations().iter().map(|&(p, n)| (p.addr(), n)));
                device_count += 1;
            }
        }
        let s = self.m.statistics();
        let device_bytes: u64 = on_device.values().map(|&n| n as u64).sum();
        assert_eq!(
            s.tracked_bytes, device_bytes,
            "{what}: tracked bytes: {s:?}"
        );
        assert_eq!(
            s.tracked_count, device_count,
            "{what}: tracked count: {s:?}"
        );
        assert_eq!(
            s.host_bytes + s.disk_bytes,
            off_bytes,
            "{what}: bytes off the device: {s:?}"
        );
        assert_eq!(
            s.host.held_count + s.disk.held_count,
            off_count,
            "{what}: buffers off the device: {s:?}"
        );
        // The files are the disk tier's data, one per buffer there, no other.
        assert_eq!(
            common::names_in(self.dir.path()),
            Vec::<String>::new(),
            "{what}"
        );
        let files = common::open_spill_files(self.dir.path());
        assert_eq!(
            (files.len() as u64, files.iter().sum::<u64>()),
            (s.disk.held_count, s.disk_bytes),
            "{what}: spill files (count, bytes) against the disk tier's figures"
        );
        // Nothing spilled was dropped in a scene: each tier holds what moved in less what
        // moved out, and the device misses what moved off it less what came back.
        let net = |t: &rmm_runtime::TierStatistics| {
            i128::from(t.spilled_bytes) - i128::from(t.unspilled_bytes)
        };
        // (Moves into the host tier without a copy, over a copy kept when the data came
        // back, are counted apart.)
        assert_eq!(
            net(&s.host) + i128::from(s.spilled_without_copy_bytes),
            i128::from(s.host.held_bytes),
            "{what}: the host tier's moves do not add up to what it holds: {s:?}"
        );
        assert_eq!(
            net(&s.disk),
            i128::from(s.disk.held_bytes),
            "{what}: the disk tier's moves do not add up to what it holds: {s:?}"
        );
        assert_eq!(
            i128::from(s.spilled_bytes) + i128::from(s.spilled_without_copy_bytes)
                - i128::from(s.unspilled_bytes),
            i128::from(off_bytes),
            "{what}: the moves off and back to the device do not add up: {s:?}"
        );
    }

    /// Brings every value back through the device, checks the manager still adopts, spills
    /// and reads back, then drops everything and checks that nothing is left.
    fn finish(self, sim: &SimBackend, baseline: (usize, usize), what: &str) {
        for val in &self.values {
            let bytes = read_through_device(&val.v)
                .unwrap_or_else(|e| panic!("{what}: value {} cannot be read back: {e}", val.name));
            assert!(
                bytes == val.data,
                "{what}: value {} lost its data",
                val.name
            );
        }
        self.quiet();
        self.check(&format!("{what}, read back"));
        // The manager keeps working.
        let made = library_value(&[MIB], 77);
        let (data, dropped) = (made.data.clone(), Arc::clone(&made.owner.dropped));
        let allocations = made.owner.allocations.clone();
        let v = self.m.adopt(&allocations, S, made.owner);
        let freed = v
            .spill()
            .unwrap_or_else(|e| panic!("{what}: a new value does not spill: {e}"));
        assert_eq!(freed, MIB, "{what}: a new value's spill");
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            1,
            "{what}: a new value's owner"
        );
        assert_eq!(v.spilled_bytes().unwrap(), Some(data.clone()), "{what}");
        assert_eq!(read_through_device(&v).unwrap(), data, "{what}");
        drop(v);
        self.quiet();
        let Scene {
            rt,
            m,
            values,
            spare,
            dir,
        } = self;
        drop(values);
        drop(spare);
        m.settle();
        assert_eq!(
            common::open_spill_files(dir.path()).len() + common::names_in(dir.path()).len(),
            0,
            "{what}: spill files left"
        );
        drop(m);
        rt.shutdown().unwrap();
        // A thread pinning ahead of demand lets its pool go when it ends.
        let deadline = Instant::now() + Duration::from_secs(30);
        let left = || (sim.live_allocations(DEVICE), sim.pinned_host_bytes());
        while left() != baseline && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            left(),
            baseline,
            "{what}: device allocations or pinned host memory left (now, before)"
        );
    }
}

/// What a step does to one value when it succeeds: spill it (it is off the device after, in
/// buffers) or nothing in particular.
#[derive(Debug, Clone, Copy)]
enum Expect {
    Nothing,
    Spilled(&'static str),
}

/// The runs of a layout's steps, and what they found.
struct Sweep {
    sim: &'static SimBackend,
    layout: Layout,
    baseline: (usize, usize),
    /// Runs in which a fault struck, and of those, runs whose step returned an error, per
    /// fault.
    struck: [u64; 4],
    failed: [u64; 4],
    lines: Vec<String>,
}

impl Sweep {
    fn new(sim: &'static SimBackend, layout: Layout) -> Sweep {
        Sweep {
            sim,
            layout,
            baseline: (sim.live_allocations(DEVICE), sim.pinned_host_bytes()),
            struck: [0; 4],
            failed: [0; 4],
            lines: Vec::new(),
        }
    }

    /// Runs `step` on a fresh scene without a fault, then with the N-th operation of each
    /// kind failing for N = 1, 2, … until a run in which the step (and the background
    /// spilling it asked for) made fewer than N of them; checks the scene after every run.
    fn step(
        &mut self,
        name: &str,
        expect: Expect,
        step: impl Fn(&mut Scene) -> Result<(), String>,
    ) {
        let sim = self.sim;
        let name = format!("{:?}: {name}", self.layout);
        let mut s = Scene::new(self.layout);
        let before = sim.counts(DEVICE).unwrap();
        step(&mut s).unwrap_or_else(|e| panic!("{name} without a fault: {e}"));
        s.quiet();
        let counts = sim.counts(DEVICE).unwrap().since(&before);
        expected(&s, expect, true, &name);
        s.check(&name);
        s.finish(sim, self.baseline, &name);
        let mut line = format!("{name}: {counts:?}; swept");
        for (k, fault) in FAULTS.into_iter().enumerate() {
            let mut errors = 0;
            let mut n = 1;
            loop {
                let what = format!("{name}, {fault:?} {n} failing");
                let mut s = Scene::new(self.layout);
                let before = sim.counts(DEVICE).unwrap();
                fault.inject(sim, DEVICE, n);
                let result = step(&mut s);
                s.quiet();
                let made = fault.count(&sim.counts(DEVICE).unwrap().since(&before));
                sim.clear_faults(DEVICE).unwrap();
                let struck = made >= n;
                if let Err(e) = &result {
                    assert!(struck, "{what}: failed though no fault struck: {e}");
                    assert!(!e.is_empty(), "{what}: an error without a message");
                    errors += 1;
                }
                expected(&s, expect, result.is_ok(), &what);
                s.check(&what);
                s.finish(sim, self.baseline, &what);
                if !struck {
                    break;
                }
                self.struck[k] += 1;
                n += 1;
                assert!(n < 200, "{what}: the step never ends making operations");
            }
            self.failed[k] += errors;
            line += &format!(" {fault:?} N=1..{} ({errors} errors)", n - 1);
        }
        eprintln!("{line}");
        self.lines.push(line);
    }

    /// Checks that each fault in `kinds` struck in some run and that some run failed.
    fn done(self, kinds: &[Fault]) {
        for fault in kinds {
            let k = FAULTS.iter().position(|f| f == fault).unwrap();
            assert!(
                self.struck[k] > 0,
                "{:?}: no step made a {fault:?} to fail:\n{}",
                self.layout,
                self.lines.join("\n")
            );
        }
        assert!(
            self.failed.iter().sum::<u64>() > 0,
            "{:?}: no injected fault made a step fail",
            self.layout
        );
        eprintln!(
            "{:?}: faults struck {:?}, step errors {:?} (allocation, copy, pin, file write)",
            self.layout, self.struck, self.failed
        );
    }
}

/// The step's own promise about the value it spills: spilled when it succeeded, on the
/// device in its owner's memory when it failed.
fn expected(s: &Scene, expect: Expect, ok: bool, what: &str) {
    if let Expect::Spilled(name) = expect {
        assert_eq!(
            s.value(name).v.is_spilled(),
            ok,
            "{what}: value {name} after a spill that returned {}",
            if ok { "Ok" } else { "an error" }
        );
    }
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Spills value `name`.
fn spill(name: &'static str) -> impl Fn(&mut Scene) -> Result<(), String> {
    move |s| s.value(name).v.spill().map(drop).map_err(err)
}

/// Reads value `name` back to the device (its views dropped at once).
fn read_back(name: &'static str) -> impl Fn(&mut Scene) -> Result<(), String> {
    move |s| {
        let views = s.value(name).v.device_views(S).map_err(err)?;
        assert!(views.is_some(), "value {name} was not spilled");
        Ok(())
    }
}

/// [`read_back`] with room made in the background.
fn read_back_in_background(name: &'static str) -> impl Fn(&mut Scene) -> Result<(), String> {
    move |s| {
        s.m.make_room_in_background(true);
        let result = read_back(name)(s);
        s.m.settle();
        s.m.make_room_in_background(false);
        result
    }
}

/// The steps every layout has.
fn common_steps(sweep: &mut Sweep) {
    sweep.step("adopting over the limit", Expect::Nothing, |s| {
        s.adopt_spare(false);
        Ok(())
    });
    sweep.step(
        "adopting over the limit, spilled in the background",
        Expect::Nothing,
        |s| {
            s.adopt_spare(true);
            s.m.settle();
            Ok(())
        },
    );
    sweep.step(
        "reading a value back from the host",
        Expect::Nothing,
        read_back("B"),
    );
    sweep.step(
        "reading a value back from the host, room made in the background",
        Expect::Nothing,
        read_back_in_background("B"),
    );
    sweep.step("spilling everything", Expect::Nothing, |s| {
        s.m.spill_all().map(drop).map_err(err)
    });
}

#[test]
fn adopted_values_on_the_host_survive_each_operation_of_their_spills_failing() {
    let _s = serial();
    let Some(sim) =
        sim_or_skip("adopted_values_on_the_host_survive_each_operation_of_their_spills_failing")
    else {
        return;
    };
    let mut sweep = Sweep::new(sim, Layout::Host);
    common_steps(&mut sweep);
    sweep.step(
        "spilling the oldest value on the device",
        Expect::Spilled("C"),
        spill("C"),
    );
    sweep.step(
        "spilling a value of two allocations",
        Expect::Spilled("D"),
        spill("D"),
    );
    sweep.step(
        "reading a value of two allocations back",
        Expect::Nothing,
        read_back("A"),
    );
    sweep.done(&[Fault::Allocation, Fault::Copy]);
}

#[test]
fn adopted_values_on_disk_survive_each_operation_of_their_spills_failing() {
    let _s = serial();
    let Some(sim) =
        sim_or_skip("adopted_values_on_disk_survive_each_operation_of_their_spills_failing")
    else {
        return;
    };
    let mut sweep = Sweep::new(sim, Layout::Disk);
    common_steps(&mut sweep);
    sweep.step(
        "spilling a value, moving host data on to disk",
        Expect::Spilled("C"),
        spill("C"),
    );
    sweep.step(
        "spilling a value larger than the host pool straight to disk",
        Expect::Spilled("E"),
        spill("E"),
    );
    sweep.step(
        "spilling a value of two allocations",
        Expect::Spilled("D"),
        spill("D"),
    );
    sweep.step(
        "reading a value of two allocations back from disk",
        Expect::Nothing,
        read_back("A"),
    );
    sweep.step(
        "reading a value back from disk, room made in the background",
        Expect::Nothing,
        read_back_in_background("A"),
    );
    sweep.step(
        "copying values out of the host and disk",
        Expect::Nothing,
        |s| {
            for name in ["A", "B"] {
                let v = &s.value(name).v;
                if v.spilled_bytes().map_err(err)?.as_ref() != Some(&s.value(name).data) {
                    return Err(format!("value {name} read back wrong"));
                }
            }
            Ok(())
        },
    );
    sweep.done(&[Fault::Allocation, Fault::Copy, Fault::FileWrite]);
}

#[test]
fn adopted_values_survive_each_pin_of_a_growing_host_pool_failing() {
    let _s = serial();
    let Some(sim) = sim_or_skip("adopted_values_survive_each_pin_of_a_growing_host_pool_failing")
    else {
        return;
    };
    let mut sweep = Sweep::new(sim, Layout::Growable);
    common_steps(&mut sweep);
    sweep.step(
        "spilling a value past the pinned host memory",
        Expect::Spilled("C"),
        spill("C"),
    );
    sweep.step(
        "reading a value of two allocations back",
        Expect::Nothing,
        read_back("A"),
    );
    sweep.done(&[Fault::Allocation, Fault::Copy, Fault::Pin]);
}
