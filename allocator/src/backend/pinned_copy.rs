//! [`PinnedCopy`]: asynchronous copies between device memory and pinned host memory that own
//! the host memory while they run.
//!
//! `cuMemcpyDtoHAsync` writes its destination, and `cuMemcpyHtoDAsync` reads its source, when
//! the stream reaches the copy, not when it is enqueued. The backend's `memcpy_*_async` leave
//! that to the caller (they are `unsafe`); this type makes it a matter of ownership: the host
//! memory moves into the copy, an event owned by the copy is recorded behind it, and the
//! memory comes back only from [`wait`](PinnedCopy::wait), once that event (or, after an error,
//! the whole stream) has completed. When neither can be established the memory is leaked, so
//! no copy can ever touch memory that safe code reads, writes or frees. Spilling, the disk
//! tier and the containers' staging slots all copy through it.

use crate::backend::host::{HostBlock, PinnedSlice};
use crate::backend::{DevicePtr, RawStream};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream::{Event, StreamView};

mod sealed {
    pub trait Sealed {}
}

/// Page-locked host memory at a fixed address for as long as it is owned: what a
/// [`PinnedCopy`] may copy into or out of. Implemented for the crate's pinned types only.
pub(crate) trait PinnedMemory: sealed::Sealed + Send {
    /// Bytes.
    fn byte_len(&self) -> usize;
    /// The first byte.
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

/// A failed copy. `memory` and `event` come back when no copy can touch the memory any more;
/// `None` when that could not be established (the memory was leaked, the event kept with it).
pub(crate) struct CopyFailed<M> {
    /// What failed.
    pub(crate) error: Error,
    /// The host memory, safe to use again; `None` when leaked.
    pub(crate) memory: Option<Vec<M>>,
    /// The event, when it is free again.
    pub(crate) event: Option<Event>,
}

/// Which way a copy goes.
#[derive(Clone, Copy)]
enum Toward {
    Host,
    Device,
}

/// Copies between `bytes` of device memory and a run of pinned host memory, in flight on one
/// stream; see the module documentation.
pub(crate) struct PinnedCopy<M: PinnedMemory> {
    device: Device,
    stream: RawStream,
    /// `None` only while being taken apart.
    event: Option<Event>,
    memory: Option<Vec<M>>,
}

impl<M: PinnedMemory> PinnedCopy<M> {
    /// Enqueues copies of the `bytes` device bytes at `src` into `memory` (filled in order) on
    /// `stream`, and records `event` behind them.
    ///
    /// # Errors
    /// `memory` holds fewer than `bytes` (nothing enqueued), or a driver call failed (the
    /// memory comes back once the stream is idle).
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

    /// Enqueues copies of the first `bytes` of `memory` (taken in order) to the device bytes
    /// at `dst` on `stream`, and records `event` behind them.
    ///
    /// # Errors
    /// As [`to_host`](Self::to_host).
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

    /// Enqueues the copies between `memory` and the `bytes` device bytes at `at`, one per
    /// piece of memory, and records the event behind them.
    fn enqueue(
        device: Device,
        stream: RawStream,
        event: Event,
        mut memory: Vec<M>,
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
        let (b, d) = (device.backend(), device.ordinal());
        let mut offset = 0;
        let enqueued = memory.iter_mut().try_for_each(|m| {
            let n = (bytes - offset).min(m.byte_len());
            if n == 0 {
                return Ok(());
            }
            let device_side = at.offset(offset);
            offset += n;
            // SAFETY: `m` is pinned memory of at least `n` bytes that stays at its address
            // while owned. It is owned by the returned `PinnedCopy` (or the `CopyFailed`),
            // which hands it back only after the event recorded behind this copy, or the
            // whole stream, has completed, and leaks it when neither can be established; until
            // then no host code can reach it, so the copy alone reads or writes it. The device
            // range is the caller's.
            unsafe {
                match toward {
                    Toward::Host => b.memcpy_dtoh_async(d, m.start(), device_side, n, stream),
                    Toward::Device => b.memcpy_htod_async(d, device_side, m.start(), n, stream),
                }
            }
        });
        PinnedCopy::started(device, stream, event, memory, enqueued)
    }

    /// Records the event behind the copies enqueued (or settles a failed enqueue).
    fn started(
        device: Device,
        stream: RawStream,
        event: Event,
        memory: Vec<M>,
        enqueued: Result<()>,
    ) -> std::result::Result<PinnedCopy<M>, Box<CopyFailed<M>>> {
        let copy = PinnedCopy {
            device,
            stream,
            event: Some(event),
            memory: Some(memory),
        };
        match enqueued.and_then(|()| copy.record()) {
            Ok(()) => Ok(copy),
            // The event may not capture every copy enqueued: wait for the whole stream.
            Err(error) => Err(copy.settle_after(error)),
        }
    }

    fn record(&self) -> Result<()> {
        match &self.event {
            Some(e) => e.record(StreamView::from_raw(self.stream)),
            None => Ok(()),
        }
    }

    /// True once the copies have completed (`wait` will not block).
    #[cfg(test)]
    pub(crate) fn is_complete(&self) -> Result<bool> {
        match &self.event {
            Some(e) => e.is_complete(),
            None => Ok(true),
        }
    }

    /// Makes later work on `stream` wait for the copies (on the device; the host does not
    /// block).
    ///
    /// # Errors
    /// The driver call failed.
    pub(crate) fn order_before(&self, stream: StreamView) -> Result<()> {
        match &self.event {
            Some(e) => e.wait_on(stream),
            None => Ok(()),
        }
    }

    /// Waits for the copies; the host memory and the event come back.
    ///
    /// # Errors
    /// Waiting failed: the memory comes back if the stream could be waited for instead, and
    /// is leaked otherwise (see [`CopyFailed`]).
    pub(crate) fn wait(mut self) -> std::result::Result<(Vec<M>, Event), Box<CopyFailed<M>>> {
        let waited = match &self.event {
            Some(e) => e.synchronize(),
            None => Ok(()),
        };
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

    /// After `error`, waits for the whole stream; gives the memory back if that worked, leaks
    /// it otherwise.
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
        if let Some(m) = self.memory.take() {
            std::mem::forget(m);
        }
        // The event may still be pending on the stream: it goes with the memory.
        if let Some(e) = self.event.take() {
            std::mem::forget(e);
        }
    }
}

impl<M: PinnedMemory> Drop for PinnedCopy<M> {
    fn drop(&mut self) {
        if self.memory.is_none() {
            return;
        }
        let waited = match &self.event {
            Some(e) => e.synchronize(),
            None => Ok(()),
        };
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
            "the drop returned (freeing the memory) before the copy could run"
        );
        opener.join().unwrap();
        d.backend().free(d.ordinal(), dev).unwrap();
    }
}
