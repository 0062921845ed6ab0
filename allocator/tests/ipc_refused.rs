//! A device that cannot hold the export arena when first asked (its memory is taken): sends
//! go through the connection, the driver is not asked on every send, and the arena is made
//! once the device has room. Alone in its binary: the arenas are the process's.

mod common;

use std::time::Duration;

use common::on_sim;
use rmm_allocator::backend;
use rmm_allocator::ipc::{arena_bytes, export_arena};

#[test]
fn a_refused_arena_is_made_once_the_device_has_room() {
    if !on_sim() {
        eprintln!("skipped: refusing the arena needs the simulated device's fault injection");
        return;
    }
    let sim = backend::global()
        .expect("backend")
        .as_sim()
        .expect("the simulated device");
    sim.fail_allocations_above(0, 1 << 20).expect("inject");
    let refused = export_arena(0).expect_err("no room for the arena");
    assert_eq!(arena_bytes(0).expect("device 0"), 0);
    sim.fail_allocations_above(0, usize::MAX).expect("clear");
    // Within a second of the refusal the device is not looked at again.
    let again = export_arena(0).expect_err("still refused right after");
    assert_eq!(again.to_string(), refused.to_string());
    std::thread::sleep(Duration::from_millis(1100));
    let arena = export_arena(0).expect("made once the device has room");
    assert!(!arena.is_empty() && arena_bytes(0).expect("device 0") == arena.len());
    assert!(std::sync::Arc::ptr_eq(
        &arena,
        &export_arena(0).expect("the same arena")
    ));
}
