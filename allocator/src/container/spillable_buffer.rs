//! [`SpillableBuffer`]: device bytes that may move to pinned host memory while nobody uses
//! them, and come back on the next use.
//!
//! A buffer is on the device or spilled to a [`PinnedHostPool`]. Device access goes through a
//! [`DeviceGuard`]: getting one brings the data back if it was spilled (into the device's
//! *current* resource, which after a `reinitialize` is the new stack), and while a guard
//! lives the buffer is never spilled. A [`SpillObserver`] (the runtime's spill manager) hears
//! of every use and every move, and is asked to make room before data comes back.
//!
//! Copies run on the stream the buffer was last used on, in chunks of at most one pinned slice,
//! and are waited for before the source is given back: a spill returns with the data safe on
//! the host and the device memory freed; a failed copy leaves the buffer where it was.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::backend::DevicePtr;
use crate::backend::host::PinnedSlice;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::per_device::{SharedResource, get_per_device_resource};
use crate::resource::PinnedHostPool;
use crate::stream::{StreamView, synchronize};

/// Told by buffers what happens to them; the runtime's spill manager implements it.
pub trait SpillObserver: Send + Sync {
    /// Buffer `id` was used (least-recently-used order).
    fn touched(&self, id: u64);
    /// `bytes` are about to be allocated on the device for buffer `id`: spill others (not
    /// `id`) if that would take the tracked bytes over the limit.
    fn make_room(&self, id: u64, bytes: usize);
    /// Buffer `id` now holds `bytes` more (or, negative, fewer) bytes on the device.
    fn resident(&self, id: u64, delta: i64);
    /// Buffer `id` came back to the device: `bytes` copied in `nanos`.
    fn unspilled(&self, id: u64, bytes: usize, nanos: u64);
    /// Buffer `id` is gone.
    fn dropped(&self, id: u64);
}

enum State {
    Device {
        ptr: DevicePtr,
        resource: SharedResource,
        stream: StreamView,
    },
    Host(Vec<PinnedSlice>),
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Device bytes that can be spilled to pinned host memory. Share it with `Arc`; see the
/// module documentation.
pub struct SpillableBuffer {
    id: u64,
    device: Device,
    size: usize,
    host: PinnedHostPool,
    observer: Option<Arc<dyn SpillObserver>>,
    state: Mutex<State>,
    /// Live device guards.
    pins: AtomicUsize,
}

impl fmt::Debug for SpillableBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpillableBuffer")
            .field("id", &self.id)
            .field("size", &self.size)
            .field("spilled", &self.is_spilled())
            .finish()
    }
}

/// Access to a buffer's device memory; the buffer stays on the device while it lives.
pub struct DeviceGuard<'a> {
    buffer: &'a SpillableBuffer,
    ptr: DevicePtr,
}

impl DeviceGuard<'_> {
    /// The device address of the first byte.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.buffer.size
    }

    /// True for a zero-byte buffer.
    pub fn is_empty(&self) -> bool {
        self.buffer.size == 0
    }
}

impl Drop for DeviceGuard<'_> {
    fn drop(&mut self) {
        self.buffer.pins.fetch_sub(1, Ordering::Release);
    }
}

impl SpillableBuffer {
    /// `size` uninitialized bytes on `device`, from its current resource, used on `stream`;
    /// spills go to `host`.
    pub fn new(
        device: Device,
        size: usize,
        stream: StreamView,
        host: PinnedHostPool,
        observer: Option<Arc<dyn SpillObserver>>,
    ) -> Result<Arc<SpillableBuffer>> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        if let Some(o) = &observer {
            o.make_room(id, size);
        }
        let resource = get_per_device_resource(device.ordinal())?;
        let ptr = resource.allocate(size, stream)?;
        if let Some(o) = &observer {
            o.resident(id, size as i64);
            o.touched(id);
        }
        Ok(Arc::new(SpillableBuffer {
            id,
            device,
            size,
            host,
            observer,
            state: Mutex::new(State::Device {
                ptr,
                resource,
                stream,
            }),
            pins: AtomicUsize::new(0),
        }))
    }

    /// A buffer holding a copy of `bytes` (the copy is complete when this returns).
    pub fn from_host(
        device: Device,
        bytes: &[u8],
        stream: StreamView,
        host: PinnedHostPool,
        observer: Option<Arc<dyn SpillObserver>>,
    ) -> Result<Arc<SpillableBuffer>> {
        let buffer = Self::new(device, bytes.len(), stream, host, observer)?;
        {
            let guard = buffer.device_view(stream)?;
            device.copy_to_device(guard.ptr(), bytes)?;
        }
        Ok(buffer)
    }

    /// The buffer's identity (for the observer).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// True while the data is in host memory (waits while another thread moves it).
    pub fn is_spilled(&self) -> bool {
        matches!(*self.state.lock(), State::Host(_))
    }

    /// True while a device guard is alive.
    pub fn is_in_use(&self) -> bool {
        self.pins.load(Ordering::Acquire) > 0
    }

    /// The data on the device for use on `stream`, brought back first if it was spilled
    /// (into the device's current resource). The buffer is not spilled while the guard lives.
    pub fn device_view(&self, stream: StreamView) -> Result<DeviceGuard<'_>> {
        let mut state = self.state.lock();
        if let State::Host(slices) = &*state {
            let start = std::time::Instant::now();
            if let Some(o) = &self.observer {
                o.make_room(self.id, self.size);
            }
            let resource = get_per_device_resource(self.device.ordinal())?;
            let ptr = resource.allocate(self.size, stream)?;
            if let Err(e) = self.copy_in(ptr, slices, stream) {
                let _ = resource.deallocate(ptr, self.size, stream);
                return Err(e);
            }
            *state = State::Device {
                ptr,
                resource,
                stream,
            };
            if let Some(o) = &self.observer {
                o.resident(self.id, self.size as i64);
                o.unspilled(self.id, self.size, start.elapsed().as_nanos() as u64);
            }
            tracing::trace!(id = self.id, bytes = self.size, "unspilled");
        }
        let State::Device { ptr, stream: s, .. } = &mut *state else {
            return Err(Error::invalid_argument(
                "buffer",
                self.id,
                "a buffer on the device",
            ));
        };
        *s = stream;
        let ptr = *ptr;
        self.pins.fetch_add(1, Ordering::Acquire);
        drop(state);
        if let Some(o) = &self.observer {
            o.touched(self.id);
        }
        Ok(DeviceGuard { buffer: self, ptr })
    }

    /// A copy of the data, wherever it is (it does not move).
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let state = self.state.lock();
        match &*state {
            State::Device { ptr, stream, .. } => {
                synchronize(self.device, *stream)?;
                let mut out = vec![0u8; self.size];
                self.device.copy_to_host(&mut out, *ptr)?;
                Ok(out)
            }
            State::Host(slices) => {
                let mut out = Vec::with_capacity(self.size);
                for s in slices {
                    let take = (self.size - out.len()).min(s.len());
                    out.extend_from_slice(&s.as_slice()[..take]);
                }
                Ok(out)
            }
        }
    }

    /// Moves the data to the pinned host pool and frees its device memory; returns the device
    /// bytes freed (0 when it is in use, already spilled, or empty). On error (a full host
    /// pool, a failed copy) the buffer stays on the device, valid.
    pub fn spill(&self) -> Result<usize> {
        if self.size == 0 || self.is_in_use() {
            return Ok(0);
        }
        // Busy (being read, brought back or spilled by another thread): not a candidate now.
        // Waiting here could deadlock two threads that each make room by spilling the other's
        // buffer.
        let Some(mut state) = self.state.try_lock() else {
            return Ok(0);
        };
        // Checked again under the lock: guards are taken under it.
        if self.is_in_use() {
            return Ok(0);
        }
        let State::Device {
            ptr,
            resource,
            stream,
        } = &*state
        else {
            return Ok(0);
        };
        let (ptr, stream) = (*ptr, *stream);
        let mut slices = Vec::new();
        let mut left = self.size;
        let chunk = self.host.max_slice().max(1);
        while left > 0 {
            let n = left.min(chunk);
            slices.push(self.host.allocate(n)?);
            left -= n;
        }
        self.copy_out(ptr, &mut slices, stream)?;
        resource.deallocate(ptr, self.size, stream)?;
        *state = State::Host(slices);
        drop(state);
        if let Some(o) = &self.observer {
            o.resident(self.id, -(self.size as i64));
        }
        tracing::trace!(id = self.id, bytes = self.size, "spilled");
        Ok(self.size)
    }

    /// Copies the device bytes at `ptr` into `slices` on `stream` and waits.
    fn copy_out(
        &self,
        ptr: DevicePtr,
        slices: &mut [PinnedSlice],
        stream: StreamView,
    ) -> Result<()> {
        let backend = self.device.backend();
        let mut offset = 0;
        for s in slices.iter_mut() {
            let n = (self.size - offset).min(s.len());
            // SAFETY: the slice is owned here and not touched by the host until the stream
            // has run the copy (synchronized below); the device range lies in the buffer.
            unsafe {
                backend.memcpy_dtoh_async(
                    self.device.ordinal(),
                    s.as_mut_ptr(),
                    ptr.offset(offset),
                    n,
                    stream.raw(),
                )?;
            }
            offset += n;
        }
        synchronize(self.device, stream)
    }

    /// Copies `slices` to the device bytes at `ptr` on `stream` and waits.
    fn copy_in(&self, ptr: DevicePtr, slices: &[PinnedSlice], stream: StreamView) -> Result<()> {
        let backend = self.device.backend();
        let mut offset = 0;
        for s in slices {
            let n = (self.size - offset).min(s.len());
            // SAFETY: the slices stay alive and unchanged (borrowed) until the stream has run
            // the copy (synchronized below); the device range lies in the new allocation.
            unsafe {
                backend.memcpy_htod_async(
                    self.device.ordinal(),
                    ptr.offset(offset),
                    s.as_ptr(),
                    n,
                    stream.raw(),
                )?;
            }
            offset += n;
        }
        synchronize(self.device, stream)
    }
}

impl Drop for SpillableBuffer {
    fn drop(&mut self) {
        let state = std::mem::replace(&mut *self.state.lock(), State::Host(Vec::new()));
        if let State::Device {
            ptr,
            resource,
            stream,
        } = state
        {
            if let Err(e) = resource.deallocate(ptr, self.size, stream) {
                tracing::error!("freeing a spillable buffer of {} bytes: {e}", self.size);
            }
            if let Some(o) = &self.observer {
                o.resident(self.id, -(self.size as i64));
            }
        }
        // Host slices go back to their pool as the state drops.
        if let Some(o) = &self.observer {
            o.dropped(self.id);
        }
    }
}
