//! Devices: a backend plus an ordinal, and the thread's current device.

use std::cell::Cell;
use std::fmt;

use crate::backend::{self, Backend, DeviceProperties, DevicePtr, MemInfo};
use crate::error::{Error, Result};
use crate::stream_view::StreamView;

/// One device of one backend. Cheap to copy; every operation goes to its backend.
#[derive(Clone, Copy)]
pub struct Device {
    backend: &'static dyn Backend,
    ordinal: u32,
}

impl Device {
    /// Device `ordinal` of the process-wide backend ([`backend::global`]).
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`]; the process-wide backend's error (e.g. [`Error::NoDriver`]).
    pub fn new(ordinal: u32) -> Result<Device> {
        Device::on(backend::global()?, ordinal)
    }

    /// Device `ordinal` of `backend`.
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`] when `backend` has no device `ordinal`.
    pub fn on(backend: &'static dyn Backend, ordinal: u32) -> Result<Device> {
        let count = backend.device_count();
        if ordinal >= count {
            return Err(Error::no_such_device(ordinal, count, backend.kind().name()));
        }
        Ok(Device { backend, ordinal })
    }

    /// The thread's current device of the process-wide backend (0 unless [`set_current_device`]).
    ///
    /// # Errors
    /// As [`Device::new`].
    pub fn current() -> Result<Device> {
        Device::new(current_device())
    }

    /// Every device of the process-wide backend.
    ///
    /// # Errors
    /// The process-wide backend's error when it cannot be opened.
    pub fn all() -> Result<Vec<Device>> {
        let b = backend::global()?;
        (0..b.device_count()).map(|d| Device::on(b, d)).collect()
    }

    /// The device's ordinal.
    pub fn ordinal(self) -> u32 {
        self.ordinal
    }

    /// The backend the device belongs to.
    pub fn backend(self) -> &'static dyn Backend {
        self.backend
    }

    /// Name, memory, UUID and capabilities.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver cannot report them.
    pub fn properties(self) -> Result<DeviceProperties> {
        self.backend.properties(self.ordinal)
    }

    /// Free and total memory.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver cannot report them.
    pub fn mem_info(self) -> Result<MemInfo> {
        self.backend.mem_info(self.ordinal)
    }

    /// Waits for all work on the device.
    ///
    /// # Errors
    /// [`Error::Driver`] when the device reports a failure.
    pub fn synchronize(self) -> Result<()> {
        self.backend.device_synchronize(self.ordinal)
    }

    /// Makes this device's context current on a thread without one; see [`Backend::bind_thread`].
    ///
    /// # Errors
    /// [`Error::Driver`] when the thread's context cannot be read or set.
    pub fn bind_thread(self) -> Result<()> {
        self.backend.bind_thread(self.ordinal)
    }

    /// Copies `src` to device memory at `dst` and waits.
    ///
    /// # Errors
    /// [`Error::Driver`] (or the simulator's [`Error::InjectedFault`]) when the copy fails.
    pub fn copy_to_device(self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.backend.memcpy_htod(self.ordinal, dst, src)
    }

    /// Copies device memory at `src` into `dst` and waits.
    ///
    /// # Errors
    /// [`Error::Driver`] (or the simulator's [`Error::InjectedFault`]) when the copy fails.
    pub fn copy_to_host(self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.backend.memcpy_dtoh(self.ordinal, dst, src)
    }

    /// Copies `bytes` between device ranges and waits.
    ///
    /// # Errors
    /// [`Error::Driver`] (or the simulator's [`Error::InjectedFault`]) when the copy fails.
    pub fn copy_device_to_device(self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.backend.memcpy_dtod(self.ordinal, dst, src, bytes)
    }

    /// Enqueues a device → device copy on `stream`.
    ///
    /// # Errors
    /// [`Error::Driver`] when the copy cannot be enqueued.
    pub fn copy_device_to_device_async(
        self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: StreamView,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.backend
            .memcpy_dtod_async(self.ordinal, dst, src, bytes, stream.raw())
    }

    /// Sets `bytes` of device memory to `value` and waits.
    ///
    /// # Errors
    /// [`Error::Driver`] when the memset fails.
    pub fn memset(self, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.backend.memset(self.ordinal, dst, value, bytes)
    }

    /// Enqueues a memset on `stream`.
    ///
    /// # Errors
    /// [`Error::Driver`] when the memset cannot be enqueued.
    pub fn memset_async(
        self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: StreamView,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.backend
            .memset_async(self.ordinal, dst, value, bytes, stream.raw())
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.ordinal == other.ordinal && std::ptr::addr_eq(self.backend, other.backend)
    }
}

impl Eq for Device {}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({} {})", self.backend.kind(), self.ordinal)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} device {}", self.backend.kind(), self.ordinal)
    }
}

thread_local! {
    static CURRENT_DEVICE: Cell<u32> = const { Cell::new(0) };
}

/// The calling thread's current device ordinal (0 until set), as `cudaGetDevice` reports it.
#[inline]
pub fn current_device() -> u32 {
    CURRENT_DEVICE.with(Cell::get)
}

/// The device the calling thread works on when the caller names none: that of the thread's CUDA
/// context (`cudaSetDevice`, `torch.cuda.set_device`), else [`current_device`]. A driver call.
pub fn thread_device() -> u32 {
    backend::global()
        .ok()
        .and_then(|b| b.context_device().ok().flatten())
        .unwrap_or_else(current_device)
}

/// Makes `ordinal` the calling thread's current device; returns the previous one.
///
/// # Errors
/// [`Error::NoSuchDevice`]; the process-wide backend's error when it cannot be opened.
pub fn set_current_device(ordinal: u32) -> Result<u32> {
    Device::on(backend::global()?, ordinal)?;
    Ok(CURRENT_DEVICE.with(|c| c.replace(ordinal)))
}

/// Runs `f` with `ordinal` as the thread's current device, restoring the previous one after.
///
/// # Errors
/// As [`set_current_device`].
pub fn with_device<R>(ordinal: u32, f: impl FnOnce() -> R) -> Result<R> {
    struct Restore(u32);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT_DEVICE.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(set_current_device(ordinal)?);
    Ok(f())
}
