//! Values received from elsewhere (`SpillManager::receive`): host data kept as an adopted
//! value whose owner is already gone, on the device when they fit under the limit, else in
//! the host tier (or on disk) without touching the device; and the bytes brought back to the
//! device only to be sent (`ForeignData::device_views_to_send`).

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use common::foreign::{LibraryOwner, read_back};
use common::{pattern, serial, sim};
use rmm_allocator::spill::Tier;
use rmm_allocator::{Error as AllocError, StreamView};
use rmm_runtime::{ForeignData, Runtime, SpillManager};

const MIB: usize = 1 << 20;
const S: StreamView = StreamView::DEFAULT;

fn spilling(limit: &str, host: &str, disk: Option<&Path>) -> rmm_config::Config {
    common::spilling(limit, host, disk, &[])
}

fn manager(rt: &Runtime) -> Arc<SpillManager> {
    rt.spill_manager(rt.devices()[0]).expect("spilling is on")
}

fn receive(m: &SpillManager, parts: &[&[u8]]) -> Arc<ForeignData<LibraryOwner>> {
    try_receive(m, parts).expect("the value is received")
}

fn try_receive(
    m: &SpillManager,
    parts: &[&[u8]],
) -> rmm_allocator::Result<Arc<ForeignData<LibraryOwner>>> {
    let sizes: Vec<usize> = parts.iter().map(|p| p.len()).collect();
    m.receive(&sizes, S, &mut |i, offset, chunk| {
        chunk.copy_from_slice(&parts[i][offset..offset + chunk.len()]);
        Ok(())
    })
}

#[test]
fn a_value_that_fits_under_the_limit_lands_on_the_device() {
    let _s = serial();
    sim();
    let rt = Runtime::start(&spilling("8MiB", "64MiB", None)).unwrap();
    let m = manager(&rt);
    let (a, b) = (pattern(2 * MIB, 1), pattern(MIB, 2));
    let v = receive(&m, &[&a, &b]);
    assert_eq!(v.tier(), Tier::Device);
    assert_eq!(v.size(), 3 * MIB);
    let s = m.statistics();
    assert_eq!(s.tracked_bytes, 3 * MIB as u64);
    assert_eq!(
        (s.received_on_device_bytes, s.received_off_device_bytes),
        (3 * MIB as u64, 0)
    );
    // Landed in pinned memory, then moved onto the device (counted as unspilled); the
    // pinned copy stays, so that spilling it later copies nothing.
    assert_eq!(
        (
            s.spilled_bytes,
            s.unspilled_bytes,
            s.host_bytes,
            s.host_kept_bytes
        ),
        (0, 3 * MIB as u64, 0, 3 * MIB as u64)
    );
    assert_eq!(read_back(&v), vec![a, b]);
    drop(v);
    assert_eq!(m.statistics().tracked_bytes, 0);
}

#[test]
fn a_value_over_the_limit_goes_to_the_host_without_touching_the_device() {
    let _s = serial();
    sim();
    let rt = Runtime::start(&spilling("4MiB", "64MiB", None)).unwrap();
    let m = manager(&rt);
    let resident = receive(&m, &[&pattern(3 * MIB, 3)]);
    assert_eq!(resident.tier(), Tier::Device);
    let data = pattern(3 * MIB, 4);
    let v = receive(&m, &[&data]);
    // It did not fit: host tier, and what was on the device stayed there.
    assert_eq!((v.tier(), resident.tier()), (Tier::Host, Tier::Device));
    let s = m.statistics();
    assert_eq!(s.tracked_bytes, 3 * MIB as u64);
    assert_eq!(s.received_off_device_bytes, 3 * MIB as u64);
    // Its bytes; beside them, the copy the first value kept when it moved onto the device.
    assert_eq!(
        (s.host_bytes, s.host_kept_bytes),
        (3 * MIB as u64, 3 * MIB as u64)
    );
    // Only the first value moved (onto the device, as it arrived): nothing spilled for this one.
    assert_eq!((s.spilled_count, s.unspilled_count), (0, 1));
    // Read from its tier without moving; then on use it comes back like spilled data.
    assert_eq!(v.spilled_bytes().unwrap().unwrap(), vec![data.clone()]);
    assert_eq!(v.tier(), Tier::Host);
    assert_eq!(m.statistics().unspilled_to_send_bytes, 0);
    assert_eq!(read_back(&v), vec![data]);
    assert_eq!(v.tier(), Tier::Device);
    assert_eq!(resident.tier(), Tier::Host, "the older value made room");
    assert_eq!(m.statistics().unspilled_bytes, 6 * MIB as u64);
}

#[test]
fn past_a_full_host_tier_a_received_value_goes_to_disk() {
    let _s = serial();
    sim();
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::start(&spilling("1MiB", "4MiB", Some(dir.path()))).unwrap();
    let m = manager(&rt);
    let data: Vec<Vec<u8>> = (0..3).map(|i| pattern(3 * MIB, 10 + i)).collect();
    let values: Vec<_> = data.iter().map(|d| receive(&m, &[d])).collect();
    let tiers: Vec<Tier> = values.iter().map(|v| v.tier()).collect();
    // Each new one takes the host tier; the one before moves on to disk to make room.
    assert_eq!(tiers, [Tier::Disk, Tier::Disk, Tier::Host]);
    assert_eq!(common::open_spill_files(dir.path()).len(), 2);
    for (v, d) in values.iter().zip(&data) {
        assert_eq!(v.spilled_bytes().unwrap().unwrap(), vec![d.clone()]);
    }
    drop(values);
    assert_eq!(common::open_spill_files(dir.path()).len(), 0);
    let s = m.statistics();
    assert_eq!((s.disk_bytes, s.host_bytes, s.tracked_bytes), (0, 0, 0));
}

#[test]
fn a_value_that_fits_nowhere_is_refused_and_nothing_is_kept() {
    let _s = serial();
    sim();
    let rt = Runtime::start(&spilling("1MiB", "4MiB", None)).unwrap();
    let m = manager(&rt);
    let err = try_receive(&m, &[&pattern(6 * MIB, 5)])
        .expect_err("6 MiB fit neither under the 1 MiB limit nor in the 4 MiB host tier");
    assert!(
        matches!(err, AllocError::HostOutOfMemory { .. }),
        "unexpected error: {err}"
    );
    let s = m.statistics();
    assert_eq!((s.host_bytes, s.tracked_bytes), (0, 0));
    assert_eq!(s.received_off_device_bytes, 0);
}

#[test]
fn bringing_a_value_back_to_send_it_is_counted() {
    let _s = serial();
    sim();
    let rt = Runtime::start(&spilling("4MiB", "64MiB", None)).unwrap();
    let m = manager(&rt);
    let dropped = Arc::new(AtomicUsize::new(0));
    let data = pattern(3 * MIB, 6);
    let owner = LibraryOwner::holding(0, &[&data], &dropped);
    let v = m.adopt(&[owner.allocations[0]], S, owner);
    assert_eq!(m.spill_all().unwrap(), 3 * MIB as u64);
    let views = v.device_views_to_send(S).unwrap().expect("spilled");
    assert_eq!(views.len(), 1);
    assert_eq!(m.statistics().unspilled_to_send_bytes, 3 * MIB as u64);
    // Already back on the device: sending again brings nothing back.
    drop(v.device_views_to_send(S).unwrap());
    assert_eq!(m.statistics().unspilled_to_send_bytes, 3 * MIB as u64);
    drop(views);
}

/// `receive` of `data`'s parts, filling each piece from them; and the pieces filled.
fn receive_filled(m: &SpillManager, data: &[Vec<u8>]) -> (Arc<ForeignData<LibraryOwner>>, usize) {
    let sizes: Vec<usize> = data.iter().map(|d| d.len()).collect();
    let mut pieces = 0;
    let v = m
        .receive(&sizes, S, &mut |i, offset, chunk| {
            pieces += 1;
            chunk.copy_from_slice(&data[i][offset..offset + chunk.len()]);
            Ok(())
        })
        .expect("the value is received");
    (v, pieces)
}

#[test]
fn a_value_filled_in_place_lands_where_it_fits_every_byte_intact() {
    let _s = serial();
    sim();
    // A host tier pinned as it grows: its pieces are at most 32 MiB.
    let rt = Runtime::start(&spilling("64MiB", "none", None)).unwrap();
    let m = manager(&rt);
    // Larger than a piece, so that each part is filled piece by piece.
    let first = vec![pattern(40 * MIB + 3, 20), pattern(7, 21)];
    let (v, pieces) = receive_filled(&m, &first);
    assert_eq!(
        pieces, 3,
        "two pieces for the first part, one for the second"
    );
    assert_eq!(v.tier(), Tier::Device);
    let second = vec![pattern(40 * MIB, 22)];
    let (w, _) = receive_filled(&m, &second);
    assert_eq!(
        w.tier(),
        Tier::Host,
        "over the limit: it stays in the host tier"
    );
    let s = m.statistics();
    assert_eq!(s.received_on_device_bytes, (40 * MIB + 10) as u64);
    assert_eq!(s.received_off_device_bytes, 40 * MIB as u64);
    assert_eq!(w.spilled_bytes().unwrap().unwrap(), second);
    assert_eq!(read_back(&v), first);
    assert_eq!(read_back(&w), second);
}

#[test]
fn a_fill_that_fails_keeps_nothing() {
    let _s = serial();
    sim();
    let rt = Runtime::start(&spilling("8MiB", "64MiB", None)).unwrap();
    let m = manager(&rt);
    let err = m
        .receive::<LibraryOwner>(&[3 * MIB], S, &mut |_, _, _| {
            Err(AllocError::invalid_argument("part", 0, "a readable buffer"))
        })
        .expect_err("the fill failed");
    assert!(err.to_string().contains("readable buffer"), "{err}");
    let s = m.statistics();
    assert_eq!(
        (s.host_bytes, s.tracked_bytes, s.received_off_device_bytes),
        (0, 0, 0)
    );
}

#[test]
fn ranges_of_spilled_data_are_read_where_it_is_without_moving_it() {
    let _s = serial();
    sim();
    let dir = tempfile::tempdir().unwrap();
    // A host tier pinned as it grows (pieces of at most 32 MiB), disk behind it.
    let rt = Runtime::start(&spilling("1MiB", "none", Some(dir.path()))).unwrap();
    let m = manager(&rt);
    let data = pattern(40 * MIB, 30);
    let v = receive(&m, &[&data]);
    assert_eq!(v.tier(), Tier::Host);
    let b = &v.spilled_buffers().expect("received values have no owner")[0];
    let device = b.device();
    // A range across two pinned pieces, read to the host and copied to the device.
    let (offset, len) = (32 * MIB - 10, 100);
    let mut out = vec![0u8; len];
    b.read_range_into(offset, &mut out).unwrap();
    assert_eq!(out, data[offset..offset + len]);
    let dst = rmm_allocator::DeviceBuffer::new(len, S).unwrap();
    b.copy_range_to_device(offset, len, dst.data()).unwrap();
    let mut back = vec![0u8; len];
    device.copy_to_host(&mut back, dst.data()).unwrap();
    assert_eq!(back, data[offset..offset + len]);
    assert_eq!(v.tier(), Tier::Host, "nothing moved");
    // A long range (many stretches, read on several threads) across both pieces, and all of it.
    let (at, long_len) = (3 * MIB + 5, 33 * MIB + 3);
    let mut long = vec![0u8; long_len];
    b.read_range_into(at, &mut long).unwrap();
    assert!(
        long == data[at..at + long_len],
        "a long range read back wrong"
    );
    let mut all = vec![0u8; 40 * MIB];
    b.read_into(&mut all).unwrap();
    assert!(all == data, "the whole value read back wrong");
    // On disk, the same.
    assert_eq!(b.spill_to_disk().unwrap(), 40 * MIB);
    b.read_range_into(7, &mut out).unwrap();
    assert_eq!(out, data[7..7 + len]);
    // A range past the end is refused, naming it.
    let err = b.read_range_into(40 * MIB - 10, &mut out).unwrap_err();
    assert!(err.to_string().contains("100 bytes at"), "{err}");
}

/// `data` staged in exported device memory (what a peer worker of the host sends), received
/// from there: the value, and the arena (kept alive while the copy may read it).
fn receive_from_exported(
    m: &SpillManager,
    data: &[u8],
) -> (
    rmm_allocator::Result<Arc<ForeignData<LibraryOwner>>>,
    Arc<rmm_allocator::ipc::ExportArena>,
) {
    let dev = rmm_allocator::Device::new(0).unwrap();
    let arena = rmm_allocator::ipc::ExportArena::new(dev, data.len()).unwrap();
    let slot = arena.reserve(data.len()).unwrap();
    dev.copy_to_device(slot.ptr(), data).unwrap();
    (m.receive_from_device(&[(slot.ptr(), data.len())], S), arena)
}

#[test]
fn a_value_copied_from_memory_it_does_not_own_lands_where_it_fits_every_byte_intact() {
    let _s = serial();
    sim();
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::start(&spilling("4MiB", "4MiB", Some(dir.path()))).unwrap();
    let m = manager(&rt);
    let data: Vec<Vec<u8>> = (0..3).map(|i| pattern(3 * MIB, 40 + i)).collect();
    let values: Vec<_> = data
        .iter()
        .map(|d| receive_from_exported(&m, d).0.expect("received"))
        .collect();
    let tiers: Vec<Tier> = values.iter().map(|v| v.tier()).collect();
    // The first fits under the limit (copied device to device); the next goes to the host
    // tier without touching the device; the last, past a full host tier, pushes that one to
    // disk.
    assert_eq!(tiers, [Tier::Device, Tier::Disk, Tier::Host]);
    let s = m.statistics();
    assert_eq!(s.received_on_device_bytes, 3 * MIB as u64);
    assert_eq!(s.received_off_device_bytes, 6 * MIB as u64);
    // The one that fitted went device to device: nothing was brought back from the host.
    assert_eq!(s.unspilled_bytes, 0);
    for (v, d) in values.iter().zip(&data) {
        assert_eq!(read_back(v), vec![d.clone()]);
    }
    drop(values);
    assert_eq!(m.statistics().tracked_bytes, 0);
}

#[test]
fn a_value_from_memory_it_does_not_own_that_fits_nowhere_keeps_nothing() {
    let _s = serial();
    sim();
    let rt = Runtime::start(&spilling("1MiB", "4MiB", None)).unwrap();
    let m = manager(&rt);
    let (got, _arena) = receive_from_exported(&m, &pattern(6 * MIB, 50));
    let err = got.expect_err("6 MiB fit neither under the 1 MiB limit nor in the 4 MiB host tier");
    assert!(
        matches!(err, AllocError::HostOutOfMemory { .. }),
        "unexpected error: {err}"
    );
    let s = m.statistics();
    assert_eq!(
        (s.host_bytes, s.tracked_bytes, s.received_off_device_bytes),
        (0, 0, 0)
    );
}

#[test]
fn values_move_to_and_from_peers_without_waiting_for_this_process_default_stream() {
    let _s = serial();
    let Some(sim) = common::sim() else {
        return common::skip(
            "values_move_to_and_from_peers_without_waiting_for_this_process_default_stream",
            "holding a stream back needs the simulated device",
        );
    };
    let rt = Runtime::start(&spilling("1MiB", "64MiB", None)).unwrap();
    let m = manager(&rt);
    let data = pattern(6 * MIB, 60);
    let dev = rmm_allocator::Device::new(0).unwrap();
    // A peer's staged value, and an export slot of this process's for staging it again.
    let peer = rmm_allocator::ipc::ExportArena::new(dev, data.len()).unwrap();
    let staged = peer.reserve(data.len()).unwrap();
    dev.copy_to_device(staged.ptr(), &data).unwrap();
    let ours = rmm_allocator::ipc::ExportArena::new(dev, data.len()).unwrap();
    let slot = ours.reserve(data.len()).unwrap();
    let (v, in_time) = while_the_default_stream_is_held(sim, {
        let (m, src, dst, n) = (Arc::clone(&m), staged.ptr(), slot.ptr(), data.len());
        move || {
            // Received past the 1 MiB limit: into the host tier; then staged for another peer.
            let v = m.receive_from_device::<LibraryOwner>(&[(src, n)], S)?;
            let b = &v.spilled_buffers().expect("received values have no owner")[0];
            b.copy_range_for_peer(0, b.size(), dst)?;
            Ok(v)
        }
    });
    assert!(
        in_time,
        "receiving and staging waited for the default stream's held work"
    );
    assert_eq!(v.tier(), Tier::Host);
    let mut back = vec![0u8; data.len()];
    dev.copy_to_host(&mut back, slot.ptr()).unwrap();
    assert!(back == data, "the staged bytes differ from the peer's");
}

/// Runs `work` on another thread while the default stream of device 0 has work held back (a
/// task's kernels): its result, and whether it finished within 5 s, before the work ran.
fn while_the_default_stream_is_held<T: Send + 'static>(
    sim: &rmm_allocator::backend::SimBackend,
    work: impl FnOnce() -> rmm_allocator::Result<T> + Send + 'static,
) -> (T, bool) {
    let gate = sim.hold_stream(0, S.raw()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let mover = std::thread::spawn(move || {
        let out = work();
        tx.send(()).ok();
        out
    });
    let in_time = rx.recv_timeout(Duration::from_secs(5)).is_ok();
    drop(gate);
    (mover.join().unwrap().unwrap(), in_time)
}

#[test]
fn a_value_kept_on_the_device_or_received_to_disk_moves_without_waiting_for_the_default_stream() {
    let _s = serial();
    let Some(sim) = common::sim() else {
        return common::skip(
            "a_value_kept_on_the_device_or_received_to_disk_moves_without_waiting_for_the_default_stream",
            "holding a stream back needs the simulated device",
        );
    };
    let dir = tempfile::tempdir().unwrap();
    // A 6 MiB pinned host tier: a 16 MiB value from a peer goes to disk.
    let rt = Runtime::start(&spilling("8MiB", "6MiB", Some(dir.path()))).unwrap();
    let m = manager(&rt);
    let dev = rmm_allocator::Device::new(0).unwrap();
    // Received as bytes under the limit: on the device, its host copy kept (read-only), and
    // staged for a peer from that copy.
    let kept_data = pattern(4 * MIB, 70);
    let kept = receive(&m, &[&kept_data]);
    assert_eq!(kept.tier(), Tier::Device);
    let ours = rmm_allocator::ipc::ExportArena::new(dev, kept_data.len()).unwrap();
    let slot = ours.reserve(kept_data.len()).unwrap();
    let (_, in_time) = while_the_default_stream_is_held(sim, {
        let (kept, dst) = (Arc::clone(&kept), slot.ptr());
        move || {
            let b = &kept
                .spilled_buffers()
                .expect("received values have no owner")[0];
            b.copy_range_for_peer(0, b.size(), dst)
        }
    });
    assert!(
        in_time,
        "staging a kept value waited for the default stream's held work"
    );
    let mut back = vec![0u8; kept_data.len()];
    dev.copy_to_host(&mut back, slot.ptr()).unwrap();
    assert!(
        back == kept_data,
        "the staged bytes differ from the kept value's"
    );
    drop(kept);
    // Received past the limit and the host tier: to disk, copied from the peer's memory.
    let far_data = pattern(16 * MIB, 71);
    let peer = rmm_allocator::ipc::ExportArena::new(dev, far_data.len()).unwrap();
    let staged = peer.reserve(far_data.len()).unwrap();
    dev.copy_to_device(staged.ptr(), &far_data).unwrap();
    let (far, in_time) = while_the_default_stream_is_held(sim, {
        let (m, src, n) = (Arc::clone(&m), staged.ptr(), far_data.len());
        move || m.receive_from_device::<LibraryOwner>(&[(src, n)], S)
    });
    assert!(
        in_time,
        "receiving to disk waited for the default stream's held work"
    );
    assert_eq!(far.tier(), Tier::Disk);
    assert_eq!(read_back(&far), vec![far_data]);
}
