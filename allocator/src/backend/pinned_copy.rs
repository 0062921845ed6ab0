//! [`PinnedCopy`]: async copies that own their pinned host memory, returned only once the copy
//! (after an error, the whole stream) has completed, else leaked. A copy engine runs copies in
//! order, so a copy larger than [`WINDOW`] keeps at most that much enqueued, in [`PIECE`]s.

use std::collections::VecDeque;

use crate::backend::host::{HostBlock, PinnedSlice};
use crate::backend::{DevicePtr, RawStream};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream::Event;
use crate::stream_view::StreamView;

mod sealed {
    pub trait Sealed {}
}

/// Host memory at a fixed address while owned, which a [`PinnedCopy`] may copy into or out of;
/// page-locked except a pool's pageable slices (which the driver copies synchronously).
pub(crate) trait PinnedMemory: sealed::Sealed + Send {
    fn byte_len(&self) -> usize;
    fn start(&mut self) -> *mut u8;
}

impl sealed::Sealed for PinnedSlice {}
impl PinnedMemory for PinnedSlice {
    fn byte_len(&self) -> usize {
        self.len()
    }
    fn start(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
}

impl sealed::Sealed for HostBlock {}
impl PinnedMemory for HostBlock {
    fn byte_len(&self) -> usize {
        self.len()
    }
    fn start(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
}

/// A failed copy: `memory` and `event` come back once no copy can touch them, else `None` (leaked).
pub(crate) struct CopyFailed<M> {
    pub(crate) error: Error,
    /// The host memory, safe to reuse; `None` when leaked.
    pub(crate) memory: Option<Vec<M>>,
    /// The event, when free again.
    pub(crate) event: Option<Event>,
}

/// The most bytes a copy keeps enqueued: enough to keep the engine busy, little to wait behind.
pub const WINDOW: usize = 128 << 20;
/// The bytes of one enqueued piece of a copy larger than [`WINDOW`].
pub(crate) const PIECE: usize = 16 << 20;

#[derive(Clone, Copy)]
enum Toward {
    Host,
    Device,
}

/// Copies between `bytes` of device memory and a run of pinned host memory, on one stream.
pub(crate) struct PinnedCopy<M: PinnedMemory> {
    device: Device,
    stream: RawStream,
    /// Recorded behind the last piece once all are enqueued (`None` only while taken apart).
    event: Option<Event>,
    memory: Option<Vec<M>>,
    /// The device side and the bytes to copy.
    at: DevicePtr,
    bytes: usize,
    toward: Toward,
    /// Bytes enqueued so far; where the next piece starts (piece of memory, offset in it).
    enqueued: usize,
    next: (usize, usize),
    /// Events behind pieces in flight with the bytes enqueued up to each (oldest first); spares.
    marks: VecDeque<(Event, usize)>,
    spare: Vec<Event>,
}

impl<M: PinnedMemory> PinnedCopy<M> {
    /// Enqueues `bytes` device bytes at `src` into `memory` (in order), then records `event`.
    /// Fails when `memory` holds fewer than `bytes`, or a driver call fails (see [`CopyFailed`]).
    pub(crate) fn to_host(
        device: Device,
        stream: RawStream,
        event: Event,
        src: DevicePtr,
        bytes: usize,
        memory: Vec<M>,
    ) -> std::result::Result<PinnedCopy<M>, Box<CopyFailed<M>>> {
        PinnedCopy::enqueue(device, stream, event, memory, src, bytes, Toward::Host)
    }

    /// Enqueues the first `bytes` of `memory` (in order) to `dst`, then records `event`; fails as
    /// [`to_host`](Self::to_host).
    pub(crate) fn to_device(
        device: Device,
        stream: RawStream,
        event: Event,
        memory: Vec<M>,
        dst: DevicePtr,
        bytes: usize,
    ) -> std::result::Result<PinnedCopy<M>, Box<CopyFailed<M>>> {
        PinnedCopy::enqueue(device, stream, event, memory, dst, bytes, Toward::Device)
    }

    /// Enqueues up to [`WINDOW`] bytes of the copies (all, and the event, when they fit).
    fn enqueue(
        device: Device,
        stream: RawStream,
        event: Event,
        memory: Vec<M>,
        at: DevicePtr,
        bytes: usize,
        toward: Toward,
    ) -> std::result::Result<PinnedCopy<M>, Box<CopyFailed<M>>> {
        if let Err(error) = check_room(&memory, bytes) {
            return Err(Box::new(CopyFailed {
                error,
                memory: Some(memory),
                event: Some(event),
            }));
        }
        let mut copy = PinnedCopy {
            device,
            stream,
            event: Some(event),
            memory: Some(memory),
            at,
            bytes,
            toward,
            enqueued: 0,
            next: (0, 0),
            marks: VecDeque::new(),
            spare: Vec::new(),
        };
        match copy.enqueue_through(WINDOW) {
            Ok(()) => Ok(copy),
            // The events may not capture every copy enqueued: wait for the whole stream.
            Err(error) => Err(copy.settle_after(error)),
        }
    }

    /// A copy larger than the window is enqueued in pieces as earlier ones end.
    fn is_windowed(&self) -> bool {
        self.bytes > WINDOW
    }

    /// Every piece enqueued, and the event recorded behind the last.
    fn all_enqueued(&self) -> bool {
        self.enqueued == self.bytes
    }

    /// Enqueues pieces through byte `through`, recording the event (or a mark) behind each.
    fn enqueue_through(&mut self, through: usize) -> Result<()> {
        let (b, d) = (self.device.backend(), self.device.ordinal());
        let stream = self.stream;
        let through = through.min(self.bytes);
        // A copy that fits the window goes whole, one copy per piece of memory.
        let piece = if self.is_windowed() {
            PIECE
        } else {
            usize::MAX
        };
        // An empty copy still records its event.
        if self.bytes == 0 {
            return self.record_behind(0);
        }
        while self.enqueued < through {
            let (i, off) = self.next;
            // Unreachable: only a copy taken apart has no memory, and `check_room` checked `bytes`.
            let Some(m) = self.memory.as_mut().and_then(|m| m.get_mut(i)) else {
                return Err(Error::invalid_argument(
                    "pinned copy",
                    format!("{} bytes", self.bytes),
                    "at most the bytes of host memory given for it",
                ));
            };
            let n = (m.byte_len() - off)
                .min(piece)
                .min(self.bytes - self.enqueued);
            if n == 0 {
                self.next = (i + 1, 0);
                continue;
            }
            let device_side = self.at.offset(self.enqueued);
            // SAFETY: `m` holds `off + n` bytes at a fixed address, owned by this copy (or its
            // `CopyFailed`), which hands it back only once its events or the whole stream have
            // completed, else leaks it. The device range is the caller's.
            unsafe {
                let host = m.start().add(off);
                match self.toward {
                    Toward::Host => b.memcpy_dtoh_async(d, host, device_side, n, stream)?,
                    Toward::Device => b.memcpy_htod_async(d, device_side, host, n, stream)?,
                }
            }
            self.enqueued += n;
            self.next = if off + n == m.byte_len() {
                (i + 1, 0)
            } else {
                (i, off + n)
            };
            self.record_behind(self.enqueued)?;
        }
        Ok(())
    }

    /// Records the copy's event behind the last piece, or a mark behind an earlier one.
    fn record_behind(&mut self, enqueued: usize) -> Result<()> {
        let on = StreamView::from_raw(self.stream);
        if enqueued == self.bytes {
            return self.event.as_ref().map_or(Ok(()), |e| e.record(on));
        }
        // A copy within the window is enqueued whole: nothing waits for its pieces.
        if !self.is_windowed() {
            return Ok(());
        }
        let mark = self
            .spare
            .pop()
            .map_or_else(|| Event::new(self.device), Ok)?;
        mark.record(on)?;
        self.marks.push_back((mark, enqueued));
        Ok(())
    }

    /// Waits for the oldest piece in flight and enqueues the pieces its end makes room for.
    fn advance(&mut self) -> Result<()> {
        let Some((mark, through)) = self.marks.pop_front() else {
            return self.enqueue_through(self.bytes);
        };
        mark.synchronize()?;
        self.spare.push(mark);
        self.enqueue_through(through + WINDOW)
    }

    /// True once the copies have completed (`wait` will not block).
    #[cfg(test)]
    pub(crate) fn is_complete(&self) -> Result<bool> {
        if !self.all_enqueued() {
            return Ok(false);
        }
        self.event.as_ref().map_or(Ok(true), Event::is_complete)
    }

    /// Makes later work on `stream` wait for the copies on the device, without blocking the host;
    /// only for copies enqueued whole (at most [`WINDOW`] bytes).
    ///
    /// # Errors
    /// The driver call failed, or part of the copy is not enqueued yet.
    pub(crate) fn order_before(&self, stream: StreamView) -> Result<()> {
        if !self.all_enqueued() {
            return Err(Error::invalid_argument(
                "pinned copy to order before a stream",
                format!("{} bytes, {} of them enqueued", self.bytes, self.enqueued),
                format!("a copy of at most {WINDOW} bytes (larger ones are waited for)"),
            ));
        }
        self.event.as_ref().map_or(Ok(()), |e| e.wait_on(stream))
    }

    /// Waits for the copies (enqueuing the rest as pieces end); returns the memory and the event.
    ///
    /// # Errors
    /// Enqueuing or waiting failed: the memory comes back if the whole stream could be waited for
    /// instead, else it is leaked (see [`CopyFailed`]).
    pub(crate) fn wait(mut self) -> std::result::Result<(Vec<M>, Event), Box<CopyFailed<M>>> {
        let mut waited = Ok(());
        while waited.is_ok() && !self.all_enqueued() {
            waited = self.advance();
        }
        let waited = waited.and_then(|()| self.event.as_ref().map_or(Ok(()), Event::synchronize));
        match waited {
            Ok(()) => {
                let memory = self.memory.take().unwrap_or_default();
                match self.event.take() {
                    Some(event) => Ok((memory, event)),
                    None => Err(Box::new(CopyFailed {
                        error: Error::invalid_argument(
                            "pinned copy",
                            "without its event",
                            "a copy made by PinnedCopy::to_host or to_device",
                        ),
                        memory: Some(memory),
                        event: None,
                    })),
                }
            }
            Err(error) => Err(self.settle_after(error)),
        }
    }

    /// After `error`, waits for the stream: gives the memory back if that works, else leaks it.
    fn settle_after(mut self, error: Error) -> Box<CopyFailed<M>> {
        let (b, d) = (self.device.backend(), self.device.ordinal());
        match b.stream_synchronize(d, self.stream) {
            Ok(()) => Box::new(CopyFailed {
                error,
                memory: self.memory.take(),
                event: self.event.take(),
            }),
            Err(sync) => {
                tracing::error!(
                    "waiting for copies between {} and pinned host memory after an error \
                     ({error}): {sync}; their host memory is leaked so that no copy can touch \
                     it after it is reused",
                    self.device
                );
                self.leak();
                Box::new(CopyFailed {
                    error,
                    memory: None,
                    event: None,
                })
            }
        }
    }

    fn leak(&mut self) {
        std::mem::forget(self.memory.take());
        // Pending events go with the memory.
        std::mem::forget(self.event.take());
        for (mark, _) in self.marks.drain(..) {
            std::mem::forget(mark);
        }
    }
}

impl<M: PinnedMemory> Drop for PinnedCopy<M> {
    fn drop(&mut self) {
        if self.memory.is_none() {
            return;
        }
        // Pieces not enqueued yet never will be: wait for those that were.
        let last = if self.all_enqueued() {
            self.event.as_ref()
        } else {
            self.marks.back().map(|(mark, _)| mark)
        };
        let waited = last.map_or(Ok(()), Event::synchronize);
        if let Err(e) = waited {
            let (b, d) = (self.device.backend(), self.device.ordinal());
            if let Err(sync) = b.stream_synchronize(d, self.stream) {
                tracing::error!(
                    "a copy between {} and pinned host memory was dropped and could not be \
                     waited for ({e}; {sync}); its host memory is leaked",
                    self.device
                );
                self.leak();
            }
        }
    }
}

/// Copies each `(dst, bytes)` of `pieces` (host memory, pinned or not) to the device on `stream`
/// and waits for that stream: not for the legacy default stream, as the driver's synchronous
/// copies do, nor for work queued anywhere else. For bytes nothing on the device is about to
/// use (a value staged for a peer).
///
/// # Errors
/// [`Error::Driver`] (or the simulator's injected faults) when a copy cannot be enqueued or the
/// stream fails, with `true` when the stream was waited for (the pieces and destinations are
/// free again), `false` when it could not be: copies may then still read the pieces and write
/// the destinations, and the caller must not reuse either (leak them, as [`PinnedCopy`] does).
pub(crate) fn copy_to_device_and_wait(
    device: Device,
    stream: RawStream,
    pieces: &[(DevicePtr, &[u8])],
) -> std::result::Result<(), (Error, bool)> {
    let (b, d) = (device.backend(), device.ordinal());
    let mut enqueued = Ok(());
    for &(dst, bytes) in pieces {
        if bytes.is_empty() {
            continue;
        }
        // SAFETY: `bytes` stays borrowed until this function returns. It returns after the
        // stream has run every copy enqueued here (the synchronize below), or, when that fails,
        // with `false`, on which the caller leaks the memory rather than reuse it.
        enqueued = unsafe { b.memcpy_htod_async(d, dst, bytes.as_ptr(), bytes.len(), stream) };
        if enqueued.is_err() {
            break;
        }
    }
    match b.stream_synchronize(d, stream) {
        Ok(()) => enqueued.map_err(|e| (e, true)),
        Err(e) => Err((e, false)),
    }
}

/// `bytes` bytes of device memory at `src` copied into new host memory on `stream`, waiting
/// for that stream alone (not for the legacy default stream, as the driver's synchronous copies
/// do). For device memory no work of this process writes (a peer's, mapped here).
///
/// # Errors
/// [`Error::Driver`] (or the simulator's injected faults) when the copy cannot be enqueued or the
/// stream fails; the host memory is leaked when the stream could not be waited for.
pub(crate) fn copy_to_host_and_wait(
    device: Device,
    stream: RawStream,
    src: DevicePtr,
    bytes: usize,
) -> Result<Vec<u8>> {
    let (b, d) = (device.backend(), device.ordinal());
    let mut out = vec![0u8; bytes];
    if bytes == 0 {
        return Ok(out);
    }
    // SAFETY: `out` is ours and outlives the copy: it is returned only after the stream has run
    // it (the synchronize below), and leaked, never freed, when that fails.
    let enqueued = unsafe { b.memcpy_dtoh_async(d, out.as_mut_ptr(), src, bytes, stream) };
    match b.stream_synchronize(d, stream) {
        Ok(()) => enqueued.map(|()| out),
        Err(e) => {
            std::mem::forget(out);
            Err(e)
        }
    }
}

fn check_room<M: PinnedMemory>(memory: &[M], bytes: usize) -> Result<()> {
    let room: usize = memory.iter().map(PinnedMemory::byte_len).sum();
    if room < bytes {
        return Err(Error::invalid_argument(
            "pinned copy",
            format!("{bytes} bytes"),
            format!("at most the {room} bytes of host memory given for it"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{SimBackend, SimConfig};
    use crate::resource::HostMemoryResource;
    use crate::resource::PinnedHostMemoryResource;

    fn sim() -> (&'static SimBackend, Device) {
        let backend = SimBackend::leak(SimConfig::default()).unwrap();
        (backend, Device::on(backend, 0).unwrap())
    }

    fn device() -> Device {
        sim().1
    }

    fn block(d: Device, bytes: usize) -> HostBlock {
        PinnedHostMemoryResource::on(d.backend())
            .allocate(bytes, 1)
            .unwrap()
    }

    /// Drops `copy` while another thread opens `gate` 30 ms later; checks the drop returned (memory
    /// freed) only after the gate opened and the copies ran.
    fn drop_opening_the_gate_later(copy: PinnedCopy<HostBlock>, gate: crate::backend::StreamGate) {
        let opened = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&opened);
        let opener = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(30));
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            gate.open();
        });
        drop(copy);
        assert!(
            opened.load(std::sync::atomic::Ordering::SeqCst),
            "the drop returned (freeing the memory) before the copies enqueued could run"
        );
        opener.join().unwrap();
    }

    #[test]
    fn bytes_go_to_the_device_and_back_through_owned_memory() {
        let d = device();
        let stream = d.backend().stream_create(d.ordinal()).unwrap();
        let dev = d.backend().malloc(d.ordinal(), 3000).unwrap();
        let mut up = vec![block(d, 1000), block(d, 2000)];
        for (i, b) in up.iter_mut().enumerate() {
            b.as_mut_slice().fill(i as u8 + 7);
        }
        let copy = PinnedCopy::to_device(d, stream, Event::new(d).unwrap(), up, dev, 3000)
            .ok()
            .unwrap();
        let (_, event) = copy.wait().ok().unwrap();
        let down = vec![block(d, 2500), block(d, 500)];
        let copy = PinnedCopy::to_host(d, stream, event, dev, 3000, down)
            .ok()
            .unwrap();
        let (down, _) = copy.wait().ok().unwrap();
        let bytes: Vec<u8> = down.iter().flat_map(|b| b.as_slice().to_vec()).collect();
        assert!(bytes[..1000].iter().all(|&x| x == 7));
        assert!(bytes[1000..].iter().all(|&x| x == 8));
        d.backend().free(d.ordinal(), dev).unwrap();
        d.backend().stream_destroy(d.ordinal(), stream).unwrap();
    }

    /// The test pattern: byte `i` of a run holds the number of its 4 KiB page, modulo 251.
    fn page_pattern(i: usize) -> u8 {
        (i / 4096 % 251) as u8
    }

    /// `run` filled with [`page_pattern`] from byte `at` of the run on (a page at a time).
    fn fill_pages(run: &mut [u8], at: usize) {
        let mut i = 0;
        while i < run.len() {
            let n = (4096 - (at + i) % 4096).min(run.len() - i);
            run[i..i + n].fill(page_pattern(at + i));
            i += n;
        }
    }

    /// Host blocks of these sizes, with the pattern (or zeros).
    fn blocks(d: Device, sizes: &[usize], pattern: bool) -> Vec<HostBlock> {
        let mut at = 0;
        sizes
            .iter()
            .map(|&n| {
                let mut b = block(d, n);
                if pattern {
                    fill_pages(b.as_mut_slice(), at);
                } else {
                    b.as_mut_slice().fill(0);
                }
                at += n;
                b
            })
            .collect()
    }

    #[test]
    fn a_large_copy_keeps_one_window_enqueued_and_the_rest_follows_as_pieces_end() {
        let (sim, d) = sim();
        let stream = d.backend().stream_create(d.ordinal()).unwrap();
        // Pieces of memory that neither the window nor the pieces divide evenly.
        let sizes = [PIECE + 4096, 3 * PIECE - 100, WINDOW + 7];
        let bytes: usize = sizes.iter().sum::<usize>() - 1000;
        let dev = d.backend().malloc(d.ordinal(), bytes).unwrap();
        let up = blocks(d, &sizes, true);
        let copy = PinnedCopy::to_device(d, stream, Event::new(d).unwrap(), up, dev, bytes)
            .ok()
            .unwrap();
        copy.wait().ok().unwrap();

        let gate = sim.hold_stream(d.ordinal(), stream).unwrap();
        let before = sim.counts(d.ordinal()).unwrap();
        let down = blocks(d, &sizes, false);
        let copy = PinnedCopy::to_host(d, stream, Event::new(d).unwrap(), dev, bytes, down)
            .ok()
            .unwrap();
        let enqueued = sim.counts(d.ordinal()).unwrap().since(&before).copies;
        assert!(
            (1..=(WINDOW / PIECE + 1) as u64).contains(&enqueued),
            "{enqueued} pieces enqueued at once, more than one window of {WINDOW} bytes"
        );
        assert!(!copy.is_complete().unwrap());
        let opener = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            gate.open();
        });
        let (down, _) = copy.wait().ok().unwrap();
        opener.join().unwrap();
        let all = sim.counts(d.ordinal()).unwrap().since(&before).copies;
        assert!(
            all as usize >= bytes / PIECE,
            "{all} pieces for {bytes} bytes in pieces of {PIECE}"
        );
        let mut got = Vec::with_capacity(sizes.iter().sum());
        for b in &down {
            got.extend_from_slice(b.as_slice());
        }
        let mut want = vec![0; got.len()];
        fill_pages(&mut want[..bytes], 0);
        assert!(got == want, "the bytes came back out of place");
        d.backend().free(d.ordinal(), dev).unwrap();
        d.backend().stream_destroy(d.ordinal(), stream).unwrap();
    }

    #[test]
    fn a_copy_within_the_window_is_enqueued_whole_one_copy_per_block() {
        let (sim, d) = sim();
        let stream = d.backend().stream_create(d.ordinal()).unwrap();
        let sizes = [PIECE + 4096, PIECE + 8192];
        let bytes: usize = sizes.iter().sum();
        let dev = d.backend().malloc(d.ordinal(), bytes).unwrap();
        let gate = sim.hold_stream(d.ordinal(), stream).unwrap();
        let before = sim.counts(d.ordinal()).unwrap();
        let copy = PinnedCopy::to_host(
            d,
            stream,
            Event::new(d).unwrap(),
            dev,
            bytes,
            blocks(d, &sizes, false),
        )
        .ok()
        .unwrap();
        assert_eq!(sim.counts(d.ordinal()).unwrap().since(&before).copies, 2);
        assert!(
            copy.marks.is_empty(),
            "marks recorded behind a copy enqueued whole"
        );
        copy.order_before(StreamView::DEFAULT).unwrap();
        gate.open();
        copy.wait().ok().unwrap();
        d.backend().free(d.ordinal(), dev).unwrap();
        d.backend().stream_destroy(d.ordinal(), stream).unwrap();
    }

    #[test]
    fn a_large_copy_dropped_unwaited_waits_for_the_pieces_enqueued() {
        let (sim, d) = sim();
        let stream = d.backend().stream_create(d.ordinal()).unwrap();
        let bytes = 2 * WINDOW;
        let dev = d.backend().malloc(d.ordinal(), bytes).unwrap();
        let gate = sim.hold_stream(d.ordinal(), stream).unwrap();
        let copy = PinnedCopy::to_host(
            d,
            stream,
            Event::new(d).unwrap(),
            dev,
            bytes,
            vec![block(d, bytes)],
        )
        .ok()
        .unwrap();
        assert!(copy.order_before(StreamView::DEFAULT).is_err());
        drop_opening_the_gate_later(copy, gate);
        d.backend().free(d.ordinal(), dev).unwrap();
    }

    #[test]
    fn too_little_host_memory_is_refused_and_handed_back() {
        let d = device();
        let dev = d.backend().malloc(d.ordinal(), 4096).unwrap();
        let failed =
            match PinnedCopy::to_host(d, 0, Event::new(d).unwrap(), dev, 4096, vec![block(d, 100)])
            {
                Err(f) => f,
                Ok(_) => panic!("a copy of 4096 bytes into 100 was enqueued"),
            };
        assert!(
            failed.error.to_string().contains("4096 bytes"),
            "{}",
            failed.error
        );
        assert_eq!(failed.memory.map(|m| m.len()), Some(1));
        assert!(failed.event.is_some());
        d.backend().free(d.ordinal(), dev).unwrap();
    }

    #[test]
    fn the_memory_comes_back_only_after_the_stream_ran_the_copy() {
        let (sim, d) = sim();
        let stream = d.backend().stream_create(d.ordinal()).unwrap();
        let dev = d.backend().malloc(d.ordinal(), 64).unwrap();
        d.backend().memset(d.ordinal(), dev, 3, 64).unwrap();
        let gate = sim.hold_stream(d.ordinal(), stream).unwrap();
        let copy = PinnedCopy::to_host(
            d,
            stream,
            Event::new(d).unwrap(),
            dev,
            64,
            vec![block(d, 64)],
        )
        .ok()
        .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(
            !copy.is_complete().unwrap(),
            "the copy ran behind a held stream"
        );
        let opener = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            gate.open();
        });
        let (memory, _) = copy.wait().ok().unwrap();
        assert!(memory[0].as_slice().iter().all(|&x| x == 3));
        opener.join().unwrap();
        d.backend().free(d.ordinal(), dev).unwrap();
    }

    #[test]
    fn a_copy_dropped_unwaited_is_waited_for_before_its_memory_goes() {
        let (sim, d) = sim();
        let stream = d.backend().stream_create(d.ordinal()).unwrap();
        let dev = d.backend().malloc(d.ordinal(), 64).unwrap();
        let gate = sim.hold_stream(d.ordinal(), stream).unwrap();
        let copy = PinnedCopy::to_host(
            d,
            stream,
            Event::new(d).unwrap(),
            dev,
            64,
            vec![block(d, 64)],
        )
        .ok()
        .unwrap();
        drop_opening_the_gate_later(copy, gate);
        d.backend().free(d.ordinal(), dev).unwrap();
    }
}
